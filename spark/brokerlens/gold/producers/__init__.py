"""Gold producer tables: ``producer_lint``, ``producer_health``, ``publish_rate_conformance``.

Producer tuning practice gives the relations between the producer settings and a template
derived from the message size and the number of partitions; EMQX's rate limiter gives the token
bucket used for publish-rate conformance (``brokerlens.gold.token_bucket``).

Settings a client leaves out are taken at Pulsar's defaults only where the default is a fixed
behaviour (``batchingEnabled`` true, ``blockIfQueueFull`` false,
``batchingPartitionSwitchFrequencyByPublishDelay`` 10); a limit that is not reported is unknown
and the rules on it are not evaluated.
"""
