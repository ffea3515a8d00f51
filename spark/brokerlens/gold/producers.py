"""Gold producer tables: ``producer_lint``, ``producer_health``, ``publish_rate_conformance``.

Seed 003 (vivo, Pulsar producer tuning) gives the relations between the producer settings and a
template derived from the message size and the number of partitions; seed 001 gives the token
bucket used for publish-rate conformance (``brokerlens.gold.token_bucket``).

Settings a client leaves out are taken at Pulsar's defaults only where the default is a fixed
behaviour (``batchingEnabled`` true, ``blockIfQueueFull`` false,
``batchingPartitionSwitchFrequencyByPublishDelay`` 10); a limit that is not reported is unknown
and the rules on it are not evaluated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from brokerlens.platform.schemas import table_schema
from brokerlens.platform.settings import ProducerSettings, Settings
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, write_table

from .token_bucket import conformance, parse_limit

log = logging.getLogger(__name__)

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
# Seed 003: "maxPendingMessages: generally between 1000 and 2000" (higher for faster senders).
TEMPLATE_PENDING_RANGE = (1000, 2000)
DEFAULT_SWITCH_FREQUENCY = 10  # ProducerConfigurationData.batchingPartitionSwitchFrequencyByPublishDelay


def _partitions_at_least_one() -> Column:
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
    per_partition = F.when(
        (parts > 0) & across.isNotNull(), F.least(mpm, F.floor(across / parts).cast("int"))
    ).otherwise(mpm)
    return df.withColumn(
        "effective_max_pending_messages", F.when(per_partition > 0, per_partition)
    )


def avg_msg_bytes() -> Column:
    """Aggregate: uncompressed bytes per message where the client counts them (memoryLimit holds
    uncompressed payloads), else bytes sent per message."""
    known = F.col("uncompressed_bytes_sent").isNotNull()
    uncompressed = F.sum("uncompressed_bytes_sent") / F.sum(F.when(known, F.col("num_msgs_sent")))
    sent = F.sum("num_bytes_sent") / F.sum("num_msgs_sent")
    return F.coalesce(
        F.when(uncompressed > 0, uncompressed), F.when(sent > 0, sent)
    ).alias("avg_msg_bytes")


def with_template(df: DataFrame) -> DataFrame:
    """Seed 003's template for a producer, from its message size and partitions.

    The seed writes ``batchingMaxBytes = min(memoryLimit * 1024 * 1024 / partitionNum / 2,
    1048576)`` with memoryLimit in MB; here memoryLimit is in bytes, so the factor drops out.
    """
    low, high = TEMPLATE_PENDING_RANGE
    parts = _partitions_at_least_one().cast("bigint")
    pending = F.least(
        F.greatest(F.coalesce(F.col("max_pending_messages"), F.lit(0)), F.lit(low)), F.lit(high)
    )
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


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    setting: str
    when: Column  # true: the configuration breaks the rule (null: not evaluable)
    configured: Column
    bound: Column | None
    suggested: Column
    message: Column


def _fmt(c: Column) -> Column:
    return F.format_number(c, 0)


def lint_rules() -> list[Rule]:
    """The seed 003 relations, each a column expression over one configuration's row."""
    c = F.col
    parts = _partitions_at_least_one()
    eff = c("effective_max_pending_messages")
    bmm = c("batching_max_messages")
    batching = F.coalesce(c("batching_enabled"), F.lit(True))
    half_eff = F.floor(eff / 2)
    needed_memory = eff * parts * c("avg_msg_bytes")
    memory_bound = F.when(c("memory_limit_bytes") > 0, c("memory_limit_bytes"))
    bytes_bound = F.least(F.coalesce(F.floor(memory_bound / parts / 2), F.lit(MIB)), F.lit(MIB))
    switch = F.coalesce(c("batching_partition_switch_frequency"), F.lit(DEFAULT_SWITCH_FREQUENCY))
    across_per_partition = F.floor(c("max_pending_messages_across_partitions") / c("partitions"))
    fails_fast = ~F.coalesce(c("block_if_queue_full"), F.lit(False))
    return [
        Rule(
            "batch-never-fills-by-count", "error", "batchingMaxMessages",
            batching & (bmm > eff), bmm.cast("string"), eff, half_eff.cast("string"),
            F.format_string(
                "batchingMaxMessages %s is above the %s pending messages a partition may hold: "
                "a batch can never fill by count and waits for batchingMaxPublishDelayMicros or "
                "batchingMaxBytes; the template keeps it at half the pending limit",
                _fmt(bmm), _fmt(eff),
            ),
        ),
        Rule(
            "batch-above-half-pending", "warning", "batchingMaxMessages",
            batching & (bmm <= eff) & (bmm > eff / 2), bmm.cast("string"), eff / 2,
            half_eff.cast("string"),
            F.format_string(
                "batchingMaxMessages %s is above half of the %s pending messages per partition: "
                "while one batch waits for its ack the next cannot fill",
                _fmt(bmm), _fmt(eff),
            ),
        ),
        Rule(
            "pending-capped-across-partitions", "warning", "maxPendingMessagesAcrossPartitions",
            (c("partitions") > 0) & (across_per_partition > 0)
            & (across_per_partition < c("max_pending_messages")),
            c("max_pending_messages_across_partitions").cast("string"), across_per_partition,
            (c("max_pending_messages") * c("partitions")).cast("string"),
            F.format_string(
                "maxPendingMessagesAcrossPartitions %s / %d partitions = %s caps maxPendingMessages "
                "%s per partition; set it to maxPendingMessages x partitions so maxPendingMessages holds",
                _fmt(c("max_pending_messages_across_partitions")), c("partitions"),
                _fmt(across_per_partition), _fmt(c("max_pending_messages")),
            ),
        ),
        Rule(
            "memory-limit-below-pending", "warning", "memoryLimitBytes",
            (memory_bound < needed_memory), c("memory_limit_bytes").cast("string"), needed_memory,
            F.ceil(needed_memory).cast("string"),
            F.format_string(
                "memoryLimitBytes %s is below %s pending messages x %d partitions x %s bytes per "
                "message = %s: the client blocks or fails on memory before the pending queue fills",
                _fmt(memory_bound), _fmt(eff), parts, _fmt(c("avg_msg_bytes")), _fmt(needed_memory),
            ),
        ),
        Rule(
            "batch-bytes-above-bound", "warning", "batchingMaxBytes",
            batching & (c("batching_max_bytes") > bytes_bound),
            c("batching_max_bytes").cast("string"), bytes_bound, bytes_bound.cast("string"),
            F.format_string(
                "batchingMaxBytes %s is above min(memoryLimit / partitions / 2, 1 MiB) = %s: a batch "
                "should not take more than half of a partition's share of the memory limit",
                _fmt(c("batching_max_bytes")), _fmt(bytes_bound),
            ),
        ),
        Rule(
            "partition-switch-frequency", "warning", "batchingPartitionSwitchFrequencyByPublishDelay",
            batching & (c("message_routing_mode") == "RoundRobinPartition") & (c("partitions") > 1)
            & (switch != 1),
            switch.cast("string"), F.lit(1), F.lit("1"),
            F.format_string(
                "RoundRobinPartition switches partition every %d x batchingMaxPublishDelay: a "
                "partition's pending queue can run out before the switch and batches wait for the "
                "delay; switch after every batch (1)",
                switch,
            ),
        ),
        Rule(
            "queue-full-fails-fast", "error", "blockIfQueueFull",
            fails_fast & (c("send_failed") > 0), F.lit("false"), None, F.lit("true"),
            F.format_string(
                "blockIfQueueFull=false and %s sends failed (%s ProducerQueueIsFullError, %s "
                "MemoryBufferIsFullError, %s timeouts): unless the send callback handles them "
                "these messages are lost on the producer",
                _fmt(c("send_failed")), _fmt(F.coalesce(c("send_failed_queue_full"), F.lit(0))),
                _fmt(F.coalesce(c("send_failed_memory_full"), F.lit(0))),
                _fmt(F.coalesce(c("send_failed_timeout"), F.lit(0))),
            ),
        ),
    ]


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


def lint(configs: DataFrame) -> DataFrame:
    """Every rule a configuration breaks, one row each, in one pass over the configurations."""
    findings = F.array(
        *[
            F.when(
                rule.when,
                F.struct(
                    F.lit(rule.id).alias("rule"),
                    F.lit(rule.severity).alias("severity"),
                    F.lit(rule.setting).alias("setting"),
                    rule.configured.alias("configured"),
                    (rule.bound if rule.bound is not None else F.lit(None)).cast("double").alias("bound"),
                    rule.suggested.alias("suggested"),
                    rule.message.alias("message"),
                ),
            )
            for rule in lint_rules()
        ]
    )
    return (
        configs.withColumn("finding", F.explode(F.filter(findings, lambda f: f.isNotNull())))
        .select("*", "finding.*")
        .drop("finding")
    )


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
    per_partition = topic_stats.select(
        "cluster", "collected_at", "topic", "partitioned_topic", "publishers_json"
    ).dropDuplicates(["cluster", "collected_at", "topic"])
    publishers = per_partition.select(
        "cluster",
        "collected_at",
        F.coalesce("partitioned_topic", "topic").alias("topic"),
        F.explode(F.from_json("publishers_json", publisher)).alias("p"),
    )
    return (
        publishers.groupBy("cluster", "topic", F.col("p.producerName").alias("producer_name"), "collected_at")
        .agg(F.sum("p.msgRateIn").alias("rate"), F.avg("p.averageMsgSize").alias("size"))
        .groupBy(*PRODUCER)
        .agg(
            F.avg("rate").alias("broker_msg_rate_in"),
            F.avg("size").alias("broker_average_msg_size"),
        )
    )


def partition_skew(snapshots: DataFrame) -> DataFrame:
    """Max over mean of each partition's send rate summed over the day (absent partitions: 0)."""
    last_partitions = snapshots.groupBy(*PRODUCER).agg(
        F.max_by("partitions", "snapshot_at").alias("parts")
    )
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


def health(
    snapshots: DataFrame, findings: DataFrame, brokers: DataFrame, config: ProducerSettings
) -> DataFrame:
    c = F.col

    def last(name: str) -> Column:
        return F.max_by(name, "snapshot_at").alias(name)

    eff_total = c("effective_max_pending_messages") * _partitions_at_least_one()
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
            (F.sum(F.when(with_batches, c("num_msgs_sent"))) / F.sum("num_batches_sent")).alias(
                "msgs_per_batch"
            ),
            last("batching_max_messages"),
            last("effective_max_pending_messages"),
            last("max_pending_messages"),
            F.max("pending_queue_size").alias("pending_queue_size_max"),
            F.avg(
                F.when(eff_total.isNotNull(), F.when(
                    c("pending_queue_size") >= eff_total * config.saturation_threshold, 1.0
                ).otherwise(0.0))
            ).alias("pending_saturation_share"),
            F.sum("num_send_failed").alias("send_failed"),
            *[F.sum(k).alias(k) for k in kinds],
            F.sum(F.when(kinds_known, other)).alias("send_failed_other"),
            F.sum("num_acks_received").alias("acks_received"),
            (
                F.sum(c("send_latency_ms_p50") * c("num_acks_received"))
                / F.sum(F.when(acked_p50, c("num_acks_received")))
            ).alias("send_latency_ms_p50_avg"),
            F.max("send_latency_ms_p95").alias("send_latency_ms_p95_max"),
            F.max("send_latency_ms_p99").alias("send_latency_ms_p99_max"),
            F.max("send_latency_ms_p999").alias("send_latency_ms_p999_max"),
            F.max("send_latency_ms_max").alias("send_latency_ms_max"),
            last("compression_type"),
            (
                F.sum("uncompressed_bytes_sent")
                / F.sum(F.when(with_uncompressed, c("num_bytes_sent")))
            ).alias("compression_ratio"),
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


def publish_limits(config: ProducerSettings) -> list[tuple[str, str, str, float, float]]:
    """(scope, dimension, text, rate, burst) per configured limit; a bad limit is an error."""
    limits = []
    for entry in config.publish_rate_limits:
        for dimension, text in (("msgs", entry.msgs), ("bytes", entry.bytes)):
            if text is None:
                continue
            bucket = parse_limit(text)
            if bucket.bytes != (dimension == "bytes"):
                raise ValueError(
                    f"producers.publish_rate_limits[{entry.scope}].{dimension} = {text!r}: "
                    + ("a byte limit needs a size unit (B, KB, MB, GB)" if dimension == "bytes"
                       else "a message limit has no size unit")
                )
            limits.append((entry.scope, dimension, bucket.text, bucket.rate, bucket.burst))
    return limits


def publish_conformance(snapshots: DataFrame, config: ProducerSettings) -> DataFrame | None:
    """Producer send series against the configured publish-rate limits (None: no limits).

    A Pulsar publish rate holds per topic partition, so a producer on N partitions is held to
    N times the limit (assuming it spreads evenly and is the topic's only publisher). Each
    snapshot counts the client's last stats interval (statsIntervalSeconds); the bucket is full
    at the start of the day.
    """
    limits = publish_limits(config)
    if not limits:
        return None
    spark = snapshots.sparkSession
    limit_df = spark.createDataFrame(
        limits, "scope string, dimension string, limit_text string, per_partition_rate double, per_partition_burst double"
    )
    namespace = F.regexp_extract("topic", r"^[a-z-]+://([^/]+/[^/]+)/", 1)
    seconds = config.stats_interval_seconds
    series = snapshots.select(
        "day", *PRODUCER, "partitions", "snapshot_at",
        F.col("num_msgs_sent").cast("double").alias("msgs"),
        F.col("num_bytes_sent").cast("double").alias("bytes"),
        namespace.alias("namespace"),
    )
    matched = series.join(
        limit_df, (limit_df.scope == series.topic) | (limit_df.scope == series.namespace)
    )
    # A topic entry wins over its namespace's.
    most_specific = matched.withColumn(
        "_rank", F.dense_rank().over(
            Window.partitionBy(*PRODUCER, "dimension")
            .orderBy(F.when(F.col("scope") == F.col("topic"), 0).otherwise(1))
        )
    ).where("_rank = 1")
    parts = _partitions_at_least_one()
    prepared = most_specific.select(
        "day", *PRODUCER, "dimension", "limit_text",
        F.lit("settings").alias("limit_source"),
        (F.col("per_partition_rate") * parts).alias("rate"),
        (F.col("per_partition_burst") * parts).alias("burst"),
        (F.col("snapshot_at") - F.expr(f"make_dt_interval(0, 0, 0, {seconds})")).alias("interval_start"),
        F.lit(seconds).alias("interval_seconds"),
        F.when(F.col("dimension") == "msgs", F.col("msgs")).otherwise(F.col("bytes")).alias("observed"),
    ).where(F.col("observed").isNotNull())
    return (
        prepared.transform(lambda df: conformance(df, [*PRODUCER, "dimension"]))
        .withColumn("peak_allowed", F.col("burst") + F.col("rate"))
        .withColumn("observed_rate", F.col("observed") / F.col("interval_seconds"))
    )


def build_producers(day: date, settings: Settings) -> StageResult:
    result = StageResult("producers", day)
    config = settings.producers
    snapshots = (
        read_table("producer_snapshots", settings=settings)
        .where(F.col("day") == F.lit(day))
        .transform(with_config_hash)
        .cache()
    )
    configs = configurations(snapshots)
    findings = lint(configs).cache()
    brokers = broker_view(
        read_table("bronze_topic_stats", settings=settings).where(F.col("day") == F.lit(day))
    )

    def write(df: DataFrame, table: str) -> None:
        columns = table_schema(table).column_names  # working columns stay behind
        result.writes.append(
            write_table(df.select(*columns), table, mode="replace", partitions=[{"day": day}],
                        settings=settings)
        )

    write(findings, "producer_lint")
    write(health(snapshots, findings, brokers, config), "producer_health")
    conformance_rows = publish_conformance(snapshots, config)
    if conformance_rows is not None:
        write(conformance_rows, "publish_rate_conformance")
    by_rule = {r["rule"]: r["n"] for r in findings.groupBy("rule").agg(F.count(F.lit(1)).alias("n")).collect()}
    result.metrics["producer_lint_rows"] = sum(by_rule.values())
    log.info("producer lint %s: %d findings %s", day, sum(by_rule.values()), by_rule)
    if by_rule:
        result.lines.append(
            "producer lint: " + ", ".join(f"{rule} {n}" for rule, n in sorted(by_rule.items()))
        )
    snapshots.unpersist()
    findings.unpersist()
    return result
