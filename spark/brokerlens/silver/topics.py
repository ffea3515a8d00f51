"""Topic names as Pulsar writes them: ``persistent://tenant/namespace/local-name``, a partition
``<topic>-partition-<n>``, and on broker /metrics the partition index in its own label."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

PARTITION_SUFFIX = r"-partition-[0-9]+$"


def namespace_of(topic: Column) -> Column:
    return F.regexp_extract(topic, r"^[a-z-]+://([^/]+/[^/]+)/", 1)


def base_topic(topic: Column) -> Column:
    return F.regexp_replace(topic, PARTITION_SUFFIX, "")


def metric_topic(labels: Column) -> Column:
    """The sample's topic partition; with splitTopicAndPartitionIndexLabel=true Pulsar puts the
    partition index in its own ``partition`` label."""
    topic, partition = labels["topic"], labels["partition"]
    split = partition.isNotNull() & (partition != "-1") & ~topic.rlike(PARTITION_SUFFIX)
    return F.when(split, F.concat(topic, F.lit("-partition-"), partition)).otherwise(topic)
