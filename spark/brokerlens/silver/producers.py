"""``producer_snapshots``: producer stats (numMsgsSent, send latencies, pendingQueueSize) with the
ProducerConfigurationData they ran with."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .topics import base_topic

# producer_snapshots column -> (map column, Pulsar key, type)
PRODUCER_CONFIG = {
    "batching_enabled": ("config", "batchingEnabled", "boolean"),
    "batching_max_messages": ("config", "batchingMaxMessages", "int"),
    "batching_max_bytes": ("config", "batchingMaxBytes", "bigint"),
    "batching_max_publish_delay_micros": ("config", "batchingMaxPublishDelayMicros", "bigint"),
    "batching_partition_switch_frequency": ("config", "batchingPartitionSwitchFrequencyByPublishDelay", "int"),
    "max_pending_messages": ("config", "maxPendingMessages", "int"),
    "max_pending_messages_across_partitions": ("config", "maxPendingMessagesAcrossPartitions", "int"),
    "memory_limit_bytes": ("client", "memoryLimitBytes", "bigint"),
    "block_if_queue_full": ("config", "blockIfQueueFull", "boolean"),
    "send_timeout_ms": ("config", "sendTimeoutMs", "bigint"),
    "compression_type": ("config", "compressionType", "string"),
    "message_routing_mode": ("config", "messageRoutingMode", "string"),
    "num_batches_sent": ("extra", "numBatchesSent", "bigint"),
    "uncompressed_bytes_sent": ("extra", "uncompressedBytesSent", "bigint"),
}
SEND_FAILURES = {
    "send_failed_queue_full": "ProducerQueueIsFullError",
    "send_failed_memory_full": "MemoryBufferIsFullError",
    "send_failed_timeout": "TimeoutException",
}


def producer_snapshots(producers: DataFrame) -> DataFrame:
    failures = F.from_json(F.col("extra")["sendFailedByKind"], "map<string,bigint>")
    return producers.select(
        "day",
        F.col("collected_at").alias("snapshot_at"),
        "cluster",
        base_topic(F.col("topic")).alias("topic"),
        "producer_name",
        F.coalesce("partitions", F.lit(0)).alias("partitions"),
        *[F.col(source)[key].cast(type_).alias(name) for name, (source, key, type_) in PRODUCER_CONFIG.items()],
        "num_msgs_sent",
        "num_bytes_sent",
        "num_send_failed",
        "num_acks_received",
        *[failures[kind].alias(name) for name, kind in SEND_FAILURES.items()],
        "send_msgs_rate",
        "send_bytes_rate",
        "send_latency_ms_p50",
        "send_latency_ms_p95",
        "send_latency_ms_p99",
        "send_latency_ms_p999",
        "send_latency_ms_max",
        "pending_queue_size",
        F.col("partition_send_msgs_rate").alias("partition_msg_rates"),
        "source_file",
    )
