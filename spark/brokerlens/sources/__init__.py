"""Where telemetry comes from: Pulsar's admin API and Prometheus (``collect``) and the generated
demo cluster (``demo``). Both write landing files in the formats Pulsar emits."""
