"""A producer's configuration as the client reports it (``ProducerConfigurationData``): one
``config_hash`` per distinct combination, the pending messages per partition in force
(``PartitionedProducerImpl``), the average message size, and the recommended template."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PRODUCER = ["cluster", "topic", "producer_name"]
# The configuration a lint row is about (one config_hash per distinct combination).
CONFIG = [
    "partitions",
    "batching_enabled",
    "batching_max_messages",
    "batching_max_bytes",
    "batching_max_publish_delay_micros",
    "batching_partition_switch_frequency",
    "max_pending_messages",
    "max_pending_messages_across_partitions",
    "memory_limit_bytes",
    "block_if_queue_full",
    "send_timeout_ms",
    "compression_type",
    "message_routing_mode",
]
MIB = 1048576
# maxPendingMessages generally between 1000 and 2000 (higher for faster senders).
TEMPLATE_PENDING_RANGE = (1000, 2000)


def partitions_at_least_one() -> Column:
    # A non-partitioned topic (0) behaves as one partition in every per-partition formula.
    return F.greatest(F.col("partitions"), F.lit(1))


def with_effective_pending(df: DataFrame) -> DataFrame:
    """Pending messages per partition in force, as PartitionedProducerImpl sets it:
    ``min(maxPendingMessages, maxPendingMessagesAcrossPartitions / numPartitions)`` (integer
    division); ProducerImpl has no count limit when the result is <= 0 (null here)."""
    mpm, across, parts = (
        F.col("max_pending_messages"),
        F.col("max_pending_messages_across_partitions"),
        F.col("partitions"),
    )
    per_partition = F.when((parts > 0) & across.isNotNull(), F.least(mpm, F.floor(across / parts).cast("int"))).otherwise(mpm)
    return df.withColumn("effective_max_pending_messages", F.when(per_partition > 0, per_partition))


def avg_msg_bytes() -> Column:
    """Aggregate: uncompressed bytes per message where the client counts them (memoryLimit holds
    uncompressed payloads), else bytes sent per message."""
    known = F.col("uncompressed_bytes_sent").isNotNull()
    uncompressed = F.sum("uncompressed_bytes_sent") / F.sum(F.when(known, F.col("num_msgs_sent")))
    sent = F.sum("num_bytes_sent") / F.sum("num_msgs_sent")
    return F.coalesce(F.when(uncompressed > 0, uncompressed), F.when(sent > 0, sent)).alias("avg_msg_bytes")


def with_template(df: DataFrame) -> DataFrame:
    """The recommended template for a producer, from its message size and partitions.

    The seed writes ``batchingMaxBytes = min(memoryLimit * 1024 * 1024 / partitionNum / 2,
    1048576)`` with memoryLimit in MB; here memoryLimit is in bytes, so the factor drops out.
    """
    low, high = TEMPLATE_PENDING_RANGE
    parts = partitions_at_least_one().cast("bigint")
    pending = F.least(F.greatest(F.coalesce(F.col("max_pending_messages"), F.lit(0)), F.lit(low)), F.lit(high))
    memory = F.ceil(pending * parts * F.col("avg_msg_bytes")).cast("bigint")
    return (
        df.withColumn("template_max_pending_messages", pending.cast("int"))
        .withColumn("template_max_pending_messages_across_partitions", pending * parts)
        .withColumn("template_memory_limit_bytes", memory)
        .withColumn("template_batching_max_messages", F.floor(pending / 2).cast("int"))
        .withColumn(
            "template_batching_max_bytes",
            F.least(F.floor(memory / parts / 2), F.lit(MIB)).cast("bigint"),
        )
        .withColumn("template_batching_partition_switch_frequency", F.lit(1))
    )


def with_config_hash(df: DataFrame) -> DataFrame:
    return df.withColumn("config_hash", F.sha2(F.to_json(F.struct(*CONFIG)), 256))


def configurations(snapshots: DataFrame) -> DataFrame:
    """One row per producer configuration seen in the day, with what its snapshots observed."""
    return (
        snapshots.groupBy("day", *PRODUCER, "config_hash", *CONFIG)
        .agg(
            F.min("snapshot_at").alias("first_seen"),
            F.max("snapshot_at").alias("last_seen"),
            F.count(F.lit(1)).alias("snapshots"),
            avg_msg_bytes(),
            F.sum("num_send_failed").alias("send_failed"),
            F.sum("send_failed_queue_full").alias("send_failed_queue_full"),
            F.sum("send_failed_memory_full").alias("send_failed_memory_full"),
            F.sum("send_failed_timeout").alias("send_failed_timeout"),
        )
        .transform(with_effective_pending)
        .transform(with_template)
    )
