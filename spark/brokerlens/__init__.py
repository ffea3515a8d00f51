"""brokerlens: batch analytics over Apache Pulsar broker telemetry."""

__version__ = "0.1.0"
