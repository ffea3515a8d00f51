"""Gold ``producer_health``: per producer and day its sends, batches, pending-queue saturation,
send failures by kind, latency and compression from the client's stats, the skew over its
partitions, and the broker's view (``PublisherStats`` in topic stats)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from brokerlens.gold.producers.settings import ProducerSettings

from .config import PRODUCER, avg_msg_bytes, partitions_at_least_one, with_effective_pending, with_template


def broker_view(topic_stats: DataFrame) -> DataFrame:
    """PublisherStats per producerName from topic stats: msgRateIn summed over the partitions of
    one collection, then averaged over the day; averageMsgSize averaged."""
    publisher = T.ArrayType(
        T.StructType(
            [
                T.StructField("producerName", T.StringType()),
                T.StructField("msgRateIn", T.DoubleType()),
                T.StructField("averageMsgSize", T.DoubleType()),
            ]
        )
    )
    # Topic stats rows repeat the topic's publishers once per subscription.
    per_partition = topic_stats.select("cluster", "collected_at", "topic", "partitioned_topic", "publishers_json").dropDuplicates(
        ["cluster", "collected_at", "topic"]
    )
    publishers = per_partition.select(
        "cluster",
        "collected_at",
        F.coalesce("partitioned_topic", "topic").alias("topic"),
        F.explode(F.from_json("publishers_json", publisher)).alias("p"),
    )
    # Summed and averaged as decimals: a sum of doubles depends on the order the rows arrive in
    # from the shuffle, and a re-run of the day must give the same figures.
    exact = T.DecimalType(38, 18)
    return (
        publishers.groupBy("cluster", "topic", F.col("p.producerName").alias("producer_name"), "collected_at")
        .agg(F.sum(F.col("p.msgRateIn").cast(exact)).alias("rate"), F.avg(F.col("p.averageMsgSize").cast(exact)).alias("size"))
        .groupBy(*PRODUCER)
        .agg(
            F.avg("rate").cast("double").alias("broker_msg_rate_in"),
            F.avg("size").cast("double").alias("broker_average_msg_size"),
        )
    )


def partition_skew(snapshots: DataFrame) -> DataFrame:
    """Max over mean of each partition's send rate summed over the day (absent partitions: 0)."""
    last_partitions = snapshots.groupBy(*PRODUCER).agg(F.max_by("partitions", "snapshot_at").alias("parts"))
    per_partition = (
        snapshots.select(*PRODUCER, F.explode("partition_msg_rates").alias("partition", "rate"))
        .groupBy(*PRODUCER, "partition")
        .agg(F.sum("rate").alias("rate"))
        .groupBy(*PRODUCER)
        .agg(F.max("rate").alias("max_rate"), F.sum("rate").alias("total_rate"))
    )
    return per_partition.join(last_partitions, PRODUCER).select(
        *PRODUCER,
        F.when(
            (F.col("parts") > 1) & (F.col("total_rate") > 0),
            F.col("max_rate") / (F.col("total_rate") / F.col("parts")),
        ).alias("partition_skew"),
    )


def health(snapshots: DataFrame, findings: DataFrame, brokers: DataFrame, config: ProducerSettings) -> DataFrame:
    c = F.col

    def last(name: str) -> Column:
        return F.max_by(name, "snapshot_at").alias(name)

    eff_total = c("effective_max_pending_messages") * partitions_at_least_one()
    kinds = ["send_failed_queue_full", "send_failed_memory_full", "send_failed_timeout"]
    kinds_known = F.greatest(*[c(k).isNotNull() for k in kinds])
    other = c("num_send_failed") - sum(F.coalesce(c(k), F.lit(0)) for k in kinds)
    with_batches = c("num_batches_sent").isNotNull()
    with_uncompressed = c("uncompressed_bytes_sent").isNotNull()
    acked_p50 = c("send_latency_ms_p50").isNotNull()
    per_day = (
        snapshots.transform(with_effective_pending)
        .groupBy("day", *PRODUCER)
        .agg(
            last("partitions"),
            F.count(F.lit(1)).alias("snapshots"),
            F.countDistinct("config_hash").alias("configurations"),
            F.sum("num_msgs_sent").alias("msgs_sent"),
            F.sum("num_bytes_sent").alias("bytes_sent"),
            F.sum("num_batches_sent").alias("batches_sent"),
            (F.sum(F.when(with_batches, c("num_msgs_sent"))) / F.sum("num_batches_sent")).alias("msgs_per_batch"),
            last("batching_max_messages"),
            last("effective_max_pending_messages"),
            last("max_pending_messages"),
            F.max("pending_queue_size").alias("pending_queue_size_max"),
            F.avg(F.when(eff_total.isNotNull(), F.when(c("pending_queue_size") >= eff_total * config.saturation_threshold, 1.0).otherwise(0.0))).alias(
                "pending_saturation_share"
            ),
            F.sum("num_send_failed").alias("send_failed"),
            *[F.sum(k).alias(k) for k in kinds],
            F.sum(F.when(kinds_known, other)).alias("send_failed_other"),
            F.sum("num_acks_received").alias("acks_received"),
            (F.sum(c("send_latency_ms_p50") * c("num_acks_received")) / F.sum(F.when(acked_p50, c("num_acks_received")))).alias("send_latency_ms_p50_avg"),
            F.max("send_latency_ms_p95").alias("send_latency_ms_p95_max"),
            F.max("send_latency_ms_p99").alias("send_latency_ms_p99_max"),
            F.max("send_latency_ms_p999").alias("send_latency_ms_p999_max"),
            F.max("send_latency_ms_max").alias("send_latency_ms_max"),
            last("compression_type"),
            (F.sum("uncompressed_bytes_sent") / F.sum(F.when(with_uncompressed, c("num_bytes_sent")))).alias("compression_ratio"),
            avg_msg_bytes(),
        )
        .withColumn("batch_fill_ratio", c("msgs_per_batch") / c("batching_max_messages"))
        .transform(with_template)
    )
    counts = findings.groupBy(*PRODUCER).agg(F.count(F.lit(1)).alias("lint_findings"))
    return (
        per_day.join(partition_skew(snapshots), PRODUCER, "left")
        .join(brokers, PRODUCER, "left")
        .join(counts, PRODUCER, "left")
        .withColumn("lint_findings", F.coalesce("lint_findings", F.lit(0)))
    )
