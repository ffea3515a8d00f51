"""Silver tables of a day, from the bronze tables (the first step of `brokerlens build`).

* ``dispatch_intervals``: dispatch records at period grain; for scopes that only have counter
  snapshots, the differences of successive ``msgOutCounter``/``bytesOutCounter`` (topic stats) or
  ``pulsar_out_messages_total``/``pulsar_out_bytes_total`` (broker /metrics) at scrape grain
  (a counter that went backwards was reset by a topic reload: the delta is the new value).
* ``cursor_snapshots``: each internal-stats cursor with the topic-stats subscription of the same
  collection (the nearest snapshot within ``STATS_PAIRING_SECONDS``), plus topic-stats
  subscriptions that have no cursor data, plus range counts from broker /metrics
  (``brk_ml_cursor_nonContiguousDeletedMessagesRange``) for subscriptions no stats cover.
* ``producer_snapshots``: producer stats with the configuration they ran with.
* ``rate_limits``: the effective dispatch limit per level and scope through the day, by Pulsar's
  precedence topic policy > namespace policy > broker config, per topic partition.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.platform.settings import Settings
from brokerlens.platform.spark import get_spark
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, write_table

# Topic stats and internal stats are two admin calls: pair them if at most this far apart.
STATS_PAIRING_SECONDS = 60
PARTITION_SUFFIX = r"-partition-[0-9]+$"
FOREVER = datetime(9999, 12, 31, tzinfo=timezone.utc)
SCOPE = ["level", "cluster", "topic", "subscription"]
# Broker /metrics out counters (Pulsar's prometheus TopicStats) -> snapshot column.
OUT_COUNTERS = {"pulsar_out_messages_total": "msg_counter", "pulsar_out_bytes_total": "bytes_counter"}
# brk_ml_cursor_nonContiguousDeletedMessagesRange (ManagedCursorMetrics): a cursor's range count.
CURSOR_RANGES_METRIC = "brk_ml_cursor_nonContiguousDeletedMessagesRange"


def namespace_of(topic: Column) -> Column:
    return F.regexp_extract(topic, r"^[a-z-]+://([^/]+/[^/]+)/", 1)


def base_topic(topic: Column) -> Column:
    return F.regexp_replace(topic, PARTITION_SUFFIX, "")


def _same(columns: list[str], left: DataFrame, right: DataFrame) -> Column:
    """Null-safe equality on columns (subscription and topic are null above their level)."""
    cond = F.lit(True)
    for c in columns:
        cond = cond & left[c].eqNullSafe(right[c])
    return cond


# ----------------------------------------------------------------------- dispatch_intervals


def period_intervals(dispatch: DataFrame) -> DataFrame:
    return dispatch.select(
        "day",
        "level",
        "cluster",
        "broker",
        F.when(F.col("level") != "broker", F.col("topic")).alias("topic"),
        F.when(F.col("level") == "subscription", F.col("subscription")).alias("subscription"),
        F.col("period_start").alias("interval_start"),
        F.col("period_seconds").cast("double").alias("interval_seconds"),
        F.lit("period").alias("grain"),
        "msgs",
        "bytes",
        "entries",
        "redelivered_msgs",
        F.lit("dispatch").alias("source"),
        F.lit(False).alias("counter_reset"),
    )


def counter_snapshots(topic_stats: DataFrame) -> DataFrame:
    """Topic-stats out counters per scope and collection time."""
    subscriptions = topic_stats.where(F.col("subscription").isNotNull()).select(
        F.lit("subscription").alias("level"), "cluster", "broker", "topic", "subscription", "collected_at",
        F.col("msg_out_counter").alias("msg_counter"), F.col("bytes_out_counter").alias("bytes_counter"),
    )
    topics = topic_stats.select(
        F.lit("topic").alias("level"), "cluster", "broker", "topic", F.lit(None).cast("string").alias("subscription"),
        "collected_at", F.col("topic_msg_out_counter").alias("msg_counter"), F.col("topic_bytes_out_counter").alias("bytes_counter"),
    )
    return (
        subscriptions.unionByName(topics)
        .where(F.col("msg_counter").isNotNull() & F.col("bytes_counter").isNotNull())
        # The topic counters repeat on each subscription row of a snapshot: one per snapshot.
        .groupBy(*SCOPE, "collected_at")
        .agg(F.max("broker").alias("broker"), F.max("msg_counter").alias("msg_counter"), F.max("bytes_counter").alias("bytes_counter"))
    )


def metric_topic(labels: Column) -> Column:
    """The sample's topic partition; with splitTopicAndPartitionIndexLabel=true Pulsar puts the
    partition index in its own ``partition`` label."""
    topic, partition = labels["topic"], labels["partition"]
    split = partition.isNotNull() & (partition != "-1") & ~topic.rlike(PARTITION_SUFFIX)
    return F.when(split, F.concat(topic, F.lit("-partition-"), partition)).otherwise(topic)


def metric_counter_snapshots(metrics: DataFrame) -> DataFrame:
    """Broker /metrics out counters per scope and sample time: ``pulsar_out_messages_total`` and
    ``pulsar_out_bytes_total`` with a ``topic`` label (topic level) and also a ``subscription``
    label (subscription level), as Pulsar's prometheus TopicStats writes them."""
    labels = F.col("labels")
    samples = metrics.where(
        F.col("metric").isin(*OUT_COUNTERS) & labels["topic"].isNotNull() & ~F.isnan("value")
    ).select(
        F.when(labels["subscription"].isNotNull(), F.lit("subscription")).otherwise(F.lit("topic")).alias("level"),
        "cluster", "broker", metric_topic(labels).alias("topic"), labels["subscription"].alias("subscription"),
        F.coalesce("sample_timestamp", "collected_at").alias("collected_at"),
        "metric", "value",
    )
    counter = {name: F.max(F.when(F.col("metric") == metric, F.col("value"))).cast("bigint") for metric, name in OUT_COUNTERS.items()}
    return (
        samples.groupBy(*SCOPE, "collected_at")
        .agg(F.max("broker").alias("broker"), *[c.alias(name) for name, c in counter.items()])
        .where(F.col("msg_counter").isNotNull() & F.col("bytes_counter").isNotNull())
    )


def counter_intervals(snapshots: DataFrame, source: str) -> DataFrame:
    """Scrape-grain intervals between successive counter snapshots of the same scope."""
    order = Window.partitionBy(*SCOPE).orderBy("collected_at")
    with_prev = snapshots.select(
        "*",
        F.lag("collected_at").over(order).alias("prev_at"),
        F.lag("msg_counter").over(order).alias("prev_msgs"),
        F.lag("bytes_counter").over(order).alias("prev_bytes"),
    ).where(F.col("prev_at").isNotNull())
    reset = (F.col("msg_counter") < F.col("prev_msgs")) | (F.col("bytes_counter") < F.col("prev_bytes"))
    return with_prev.select(
        F.to_date("prev_at").alias("day"),
        "level",
        "cluster",
        "broker",
        "topic",
        "subscription",
        F.col("prev_at").alias("interval_start"),
        ((F.unix_micros("collected_at") - F.unix_micros("prev_at")) / 1e6).alias("interval_seconds"),
        F.lit("scrape").alias("grain"),
        F.when(reset, F.col("msg_counter")).otherwise(F.col("msg_counter") - F.col("prev_msgs")).alias("msgs"),
        F.when(reset, F.col("bytes_counter")).otherwise(F.col("bytes_counter") - F.col("prev_bytes")).alias("bytes"),
        F.lit(None).cast("bigint").alias("entries"),
        F.lit(None).cast("bigint").alias("redelivered_msgs"),
        F.lit(source).alias("source"),
        reset.alias("counter_reset"),
    )


def dispatch_intervals(dispatch: DataFrame, topic_stats: DataFrame, metrics: DataFrame) -> DataFrame:
    """Per scope, the finest source there is: dispatch records, else topic-stats counters, else
    the broker's /metrics counters."""
    out = period_intervals(dispatch)
    for snapshots, source in (
        (counter_snapshots(topic_stats), "topic-stats-counters"),
        (metric_counter_snapshots(metrics), "metrics-counters"),
    ):
        intervals = counter_intervals(snapshots, source)
        covered = out.select(*SCOPE).distinct()
        intervals = intervals.join(covered, _same(SCOPE, intervals, covered), "left_anti")
        out = out.unionByName(intervals.select(*out.columns))
    return out


# ------------------------------------------------------------------------- cursor_snapshots


def ledger_entries(internal: DataFrame) -> Column:
    """ledgers[].entries, with the ledger being written counted by currentLedgerEntries
    (Pulsar lists it with 0 entries until it is closed)."""
    current = F.col("current_ledger_id")
    known = F.col("current_ledger_entries").isNotNull() & current.isNotNull()
    return F.when(
        known,
        F.map_concat(
            F.map_filter("ledger_entries", lambda k, _: k != current),
            F.create_map(current, F.col("current_ledger_entries")),
        ),
    ).otherwise(F.col("ledger_entries"))


def metric_cursors(metrics: DataFrame) -> DataFrame:
    """Range counts from ``brk_ml_cursor_nonContiguousDeletedMessagesRange`` (labels ``ledger_name``
    ``tenant/ns/persistent/<encoded local name>`` and ``cursor_name``), in cursor_snapshots' shape."""
    ledger = F.col("labels")["ledger_name"]
    topic = F.concat(
        F.lit("persistent://"),
        F.regexp_extract(ledger, r"^(.*)/persistent/", 1),
        F.lit("/"),
        F.url_decode(F.regexp_extract(ledger, r"/persistent/(.*)$", 1)),
    )
    return metrics.where(
        (F.col("metric") == CURSOR_RANGES_METRIC) & ledger.contains("/persistent/") & ~F.isnan("value")
    ).select(
        "cluster", "broker", topic.alias("topic"), F.col("labels")["cursor_name"].alias("subscription"),
        F.coalesce("sample_timestamp", "collected_at").alias("snapshot_at"),
        F.col("value").cast("bigint").alias("ranges_reported"),
        "source_file",
    ).where(F.col("subscription").isNotNull())


def cursor_snapshots(internal: DataFrame, topic_stats: DataFrame, metrics: DataFrame) -> DataFrame:
    cursors = internal.where(F.col("cursor").isNotNull()).select(
        "cluster", "broker", "topic", F.col("cursor").alias("subscription"),
        F.col("collected_at").alias("internal_at"), "mark_delete_position", "read_position",
        "individually_deleted_messages", ledger_entries(internal).alias("ledger_entries"),
        "total_non_contiguous_deleted_messages_range", F.col("source_file").alias("internal_file"),
    )
    subs = topic_stats.where(F.col("subscription").isNotNull()).select(
        "cluster", F.col("broker").alias("stats_broker"), "topic", "subscription",
        F.col("collected_at").alias("stats_at"), "subscription_type",
        "non_contiguous_deleted_messages_ranges", "non_contiguous_deleted_messages_ranges_serialized_size",
        "msg_backlog", "unacked_messages", "msg_delayed", "msg_rate_out", "msg_rate_redeliver", "consumers",
        F.col("source_file").alias("stats_file"),
    )
    key = ["cluster", "topic", "subscription"]
    gap = F.abs(F.unix_micros("stats_at") - F.unix_micros("internal_at"))
    nearest = Window.partitionBy(*key, "internal_at").orderBy(gap, "stats_at")
    paired = (
        cursors.join(subs, key, "left")
        .where(F.col("stats_at").isNull() | (gap <= STATS_PAIRING_SECONDS * 1_000_000))
        .withColumn("_rank", F.row_number().over(nearest))
        .where("_rank = 1")
        .drop("_rank")
    )
    # A left join whose only candidates were too far apart lost the cursor: bring it back alone.
    lost = cursors.join(paired.select(*key, "internal_at"), [*key, "internal_at"], "left_anti")
    paired = paired.unionByName(lost, allowMissingColumns=True)
    alone = subs.join(paired.where(F.col("stats_at").isNotNull()).select(*key, "stats_at"), [*key, "stats_at"], "left_anti")
    rows = paired.unionByName(alone, allowMissingColumns=True)
    has_cursor = F.col("internal_at").isNotNull()
    snapshot_at = F.coalesce("internal_at", "stats_at")
    stats_rows = rows.select(
        F.to_date(snapshot_at).alias("day"),
        snapshot_at.alias("snapshot_at"),
        "cluster",
        F.coalesce("broker", "stats_broker").alias("broker"),
        namespace_of(F.col("topic")).alias("namespace"),
        "topic",
        "subscription",
        "subscription_type",
        "mark_delete_position",
        "read_position",
        "individually_deleted_messages",
        "ledger_entries",
        F.when(has_cursor, F.col("total_non_contiguous_deleted_messages_range"))
        .otherwise(F.col("non_contiguous_deleted_messages_ranges"))
        .alias("ranges_reported"),
        F.when(has_cursor, F.lit("internal-stats")).otherwise(F.lit("topic-stats")).alias("ranges_source"),
        F.col("non_contiguous_deleted_messages_ranges_serialized_size").alias("serialized_size_reported"),
        "msg_backlog",
        "unacked_messages",
        "msg_delayed",
        "msg_rate_out",
        "msg_rate_redeliver",
        "consumers",
        F.coalesce("internal_file", "stats_file").alias("source_file"),
    )
    # Metrics only for subscriptions that no stats snapshot covers: they are the coarser source.
    from_metrics = metric_cursors(metrics).join(stats_rows.select(*key).distinct(), key, "left_anti")
    from_metrics = from_metrics.select(
        F.to_date("snapshot_at").alias("day"), "*", namespace_of(F.col("topic")).alias("namespace"),
        F.lit("metrics").alias("ranges_source"),
    )
    return stats_rows.unionByName(from_metrics, allowMissingColumns=True)


# ----------------------------------------------------------------------- producer_snapshots

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


# ------------------------------------------------------------------------------ rate_limits

TOPIC_LEVEL = ("topic", "topic-dispatch-rate", "namespace-dispatch-rate",
               "dispatchThrottlingRatePerTopicInMsg", "dispatchThrottlingRatePerTopicInByte")
SUBSCRIPTION_LEVEL = ("subscription", "topic-subscription-dispatch-rate", "namespace-subscription-dispatch-rate",
                      "dispatchThrottlingRatePerSubscriptionInMsg", "dispatchThrottlingRatePerSubscriptionInByte")
BROKER_LEVEL = ("broker", None, None, "dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte")
BROKER_KEYS = sorted(
    {k for level in (TOPIC_LEVEL, SUBSCRIPTION_LEVEL, BROKER_LEVEL) for k in level[3:]}
    | {"ratePeriodInSecond", "dispatchThrottlingOnBatchMessageEnabled"}
)
RATE = "struct<msg:bigint,byte:bigint,period:int,relative:boolean>"


def latest_records(policies: DataFrame, day: date) -> DataFrame:
    """Policy records that took effect by the end of the day, from this and earlier landing
    days; a record landed again on a later day (same kind, scope and time) counts once."""
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=timezone.utc)
    scope = F.coalesce("broker", "topic", "namespace")
    same = Window.partitionBy("kind", "cluster", "_scope", "effective_at").orderBy(
        F.desc("day"), F.desc("source_file"), F.desc("line")
    )
    return (
        policies.where((F.col("day") <= F.lit(day)) & (F.col("effective_at") < F.lit(end)))
        .withColumn("_scope", F.when(F.col("kind") == "broker-config", F.col("broker")).otherwise(scope))
        .withColumn("_n", F.row_number().over(same))
        .where("_n = 1")
    )


def _validity(frame: DataFrame, keys: list[str]) -> DataFrame:
    """valid_from = effective_at, valid_to = the next record's effective_at for the same keys."""
    order = Window.partitionBy(*keys).orderBy("effective_at")
    return frame.withColumn("valid_from", F.col("effective_at")).withColumn(
        "valid_to", F.coalesce(F.lead("effective_at").over(order), F.lit(FOREVER))
    )


def policy_intervals(records: DataFrame) -> DataFrame:
    rates = records.where(F.col("kind") != "broker-config").select(
        "kind", "cluster", F.col("_scope").alias("scope"), "effective_at",
        F.when(
            ~F.col("removed"),
            F.struct(
                F.col("dispatch_throttling_rate_in_msg").alias("msg"),
                F.col("dispatch_throttling_rate_in_byte").alias("byte"),
                F.col("rate_period_in_second").alias("period"),
                F.col("relative_to_publish_rate").alias("relative"),
            ),
        ).cast(RATE).alias("rate"),
    )
    return _validity(rates, ["kind", "cluster", "scope"])


def broker_key_intervals(records: DataFrame, brokers: DataFrame) -> DataFrame:
    """(cluster, broker, key, value) validity from broker-config records. A record holds the
    keys it names (dynamic config changes one key at a time); ``policy: null`` resets every
    key to Pulsar's default; a record without a broker applies to every broker of the cluster."""
    config = records.where(F.col("kind") == "broker-config")
    keys = F.array(*[F.lit(k) for k in BROKER_KEYS])
    entries = config.select(
        "cluster", "broker", "effective_at",
        F.explode(keys).alias("key"),
        F.col("broker_config").alias("_config"),
        "removed",
    ).where(F.col("removed") | F.map_contains_key("_config", F.col("key")))
    entries = entries.withColumn("value", F.when(~F.col("removed"), F.col("_config")[F.col("key")]))
    specific = entries.where(F.col("broker").isNotNull())
    wide = entries.where(F.col("broker").isNull()).drop("broker").join(brokers, "cluster")
    return _validity(specific.unionByName(wide.select(*specific.columns)), ["cluster", "broker", "key"])


def limit_targets(topic_stats: DataFrame, internal: DataFrame, dispatch: DataFrame, records: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(topic partitions seen that day with their broker, brokers seen that day)."""
    seen = (
        topic_stats.select("cluster", "broker", "topic")
        .unionByName(internal.select("cluster", "broker", "topic"))
        .unionByName(dispatch.where(F.col("topic").isNotNull()).select("cluster", "broker", "topic"))
    )
    partitions = seen.groupBy("cluster", "topic").agg(F.max("broker").alias("broker"))
    brokers = (
        seen.select("cluster", "broker")
        .unionByName(dispatch.select("cluster", "broker"))
        .unionByName(records.where((F.col("kind") == "broker-config") & (F.col("day") == F.col("_day"))).select("cluster", "broker"))
        .where(F.col("broker").isNotNull())
        .distinct()
    )
    return partitions, brokers


def rate_limits(
    policies: DataFrame, topic_stats: DataFrame, internal: DataFrame, dispatch: DataFrame, day: date
) -> DataFrame:
    spark = policies.sparkSession
    start = datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc)
    end = start + timedelta(days=1)
    records = latest_records(policies, day).withColumn("_day", F.lit(day))
    partitions, brokers = limit_targets(topic_stats, internal, dispatch, records)
    rates = policy_intervals(records).where((F.col("valid_to") > F.lit(start)) & (F.col("valid_from") < F.lit(end)))
    keys = broker_key_intervals(records, brokers).where(
        (F.col("valid_to") > F.lit(start)) & (F.col("valid_from") < F.lit(end))
    )

    levels = spark.createDataFrame(
        [TOPIC_LEVEL, SUBSCRIPTION_LEVEL],
        "level string, topic_kind string, namespace_kind string, msg_key string, byte_key string",
    )
    topic_targets = partitions.crossJoin(levels).select(
        "level", "cluster", "broker", "topic", namespace_of(F.col("topic")).alias("namespace"),
        base_topic(F.col("topic")).alias("base"), "topic_kind", "namespace_kind", "msg_key", "byte_key",
    )
    broker_targets = brokers.select(
        F.lit("broker").alias("level"), "cluster", "broker", F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("string").alias("namespace"), F.lit(None).cast("string").alias("base"),
        F.lit(None).cast("string").alias("topic_kind"), F.lit(None).cast("string").alias("namespace_kind"),
        F.lit(BROKER_LEVEL[3]).alias("msg_key"), F.lit(BROKER_LEVEL[4]).alias("byte_key"),
    )
    targets = topic_targets.unionByName(broker_targets)
    target = ["level", "cluster", "broker", "topic"]

    # Segments: the day cut at every time an input of the target changes.
    r = rates.alias("r")
    t = targets.alias("t")
    on_topic = (F.col("r.kind") == F.col("t.topic_kind")) & F.col("r.scope").isin(F.col("t.topic"), F.col("t.base"))
    on_namespace = (F.col("r.kind") == F.col("t.namespace_kind")) & (F.col("r.scope") == F.col("t.namespace"))
    policy_changes = t.join(r, (F.col("r.cluster") == F.col("t.cluster")) & (on_topic | on_namespace)).select(
        "t.*", F.col("r.valid_from").alias("at")
    )
    key_changes = targets.join(keys.select("cluster", "broker", F.col("valid_from").alias("at")), ["cluster", "broker"])
    changes = (
        policy_changes.unionByName(key_changes.select(*targets.columns, "at"))
        .unionByName(targets.withColumn("at", F.lit(start)))
        .where((F.col("at") >= F.lit(start)) & (F.col("at") < F.lit(end)))
        .distinct()
    )
    order = Window.partitionBy(*target).orderBy("valid_from")
    segments = changes.withColumnRenamed("at", "valid_from").withColumn(
        "valid_to", F.coalesce(F.lead("valid_from").over(order), F.lit(end))
    )

    def rate_in_force(frame: DataFrame, kind: str, scope: str, name: str) -> DataFrame:
        found = rates.select(
            F.col("kind").alias("_kind"), F.col("cluster").alias("_cluster"), F.col("scope").alias("_scope"),
            F.col("valid_from").alias("_from"), F.col("valid_to").alias("_to"), F.col("rate").alias(name),
        )
        cond = (
            (frame["cluster"] == found["_cluster"]) & (frame[kind] == found["_kind"]) & (frame[scope] == found["_scope"])
            & (found["_from"] <= frame["valid_from"]) & (frame["valid_from"] < found["_to"])
        )
        return frame.join(found, cond, "left").drop("_kind", "_cluster", "_scope", "_from", "_to")

    segments = rate_in_force(segments, "topic_kind", "topic", "partition_rate")
    segments = rate_in_force(segments, "topic_kind", "base", "topic_rate")
    segments = rate_in_force(segments, "namespace_kind", "namespace", "namespace_rate")

    k = keys.select(
        F.col("cluster").alias("_cluster"), F.col("broker").alias("_broker"), "key", "value",
        F.col("valid_from").alias("_from"), F.col("valid_to").alias("_to"),
    )
    cond = (
        (segments["cluster"] == k["_cluster"]) & (segments["broker"] == k["_broker"])
        & (k["_from"] <= segments["valid_from"]) & (segments["valid_from"] < k["_to"])
    )
    seg_cols = [c for c in segments.columns]
    broker_values = (
        segments.join(k, cond, "left")
        .groupBy(*seg_cols)
        .agg(F.map_from_entries(F.collect_list(F.when(F.col("key").isNotNull(), F.struct("key", "value")))).alias("conf"))
    )
    return broker_values.transform(lambda df: effective_limits(df, day)).transform(merge_unchanged)


def effective_limits(segments: DataFrame, day: date) -> DataFrame:
    conf = F.col("conf")
    topic_rate = F.coalesce("partition_rate", "topic_rate")
    chosen = F.coalesce(topic_rate, F.col("namespace_rate"))
    policy_source = F.when(topic_rate.isNotNull(), F.lit("topic-policy")).otherwise(F.lit("namespace-policy"))
    broker_msg = conf[F.col("msg_key")].cast("bigint")
    broker_byte = conf[F.col("byte_key")].cast("bigint")

    def positive(value: Column) -> Column:
        return F.when(value > 0, value)  # Pulsar: <= 0 is unlimited

    def source(broker_value: Column) -> Column:
        return (
            F.when(chosen.isNotNull(), policy_source)
            .when(broker_value.isNotNull(), F.lit("broker-config"))
            .otherwise(F.lit("default"))
        )

    period = F.when(chosen.isNotNull(), chosen["period"]).otherwise(conf["ratePeriodInSecond"].cast("int"))
    return segments.select(
        F.lit(day).alias("day"),
        "level",
        "cluster",
        F.when(F.col("level") == "broker", F.col("broker")).alias("broker"),
        "topic",
        "valid_from",
        "valid_to",
        positive(F.when(chosen.isNotNull(), chosen["msg"]).otherwise(broker_msg)).alias("msg_limit"),
        positive(F.when(chosen.isNotNull(), chosen["byte"]).otherwise(broker_byte)).alias("byte_limit"),
        F.when(period > 0, period).otherwise(F.lit(1)).alias("period_seconds"),
        F.coalesce(conf["dispatchThrottlingOnBatchMessageEnabled"].cast("boolean"), F.lit(False)).alias("count_entries"),
        F.coalesce(chosen["relative"], F.lit(False)).alias("relative_to_publish_rate"),
        source(broker_msg).alias("msg_source"),
        source(broker_byte).alias("byte_source"),
    )


def merge_unchanged(limits: DataFrame) -> DataFrame:
    """One row per run of segments with the same limit (gaps and islands)."""
    scope = ["day", "level", "cluster", "broker", "topic"]
    values = [c for c in limits.columns if c not in (*scope, "valid_from", "valid_to")]
    order = Window.partitionBy(*scope).orderBy("valid_from")
    current = F.struct(*values)
    changed = F.when(F.lag(current).over(order).eqNullSafe(current), 0).otherwise(1)
    return (
        limits.withColumn("_run", F.sum(changed).over(order))
        .groupBy(*scope, "_run", *values)
        .agg(F.min("valid_from").alias("valid_from"), F.max("valid_to").alias("valid_to"))
        .drop("_run")
    )


# ------------------------------------------------------------------------------------ build


def build_silver(day: date, settings: Settings) -> StageResult:
    get_spark(settings)
    result = StageResult("silver", day)

    def bronze(name: str) -> DataFrame:
        return read_table(name, settings=settings).where(F.col("day") == F.lit(day))

    topic_stats = bronze("bronze_topic_stats").persist()
    internal = bronze("bronze_internal_stats")
    dispatch = bronze("bronze_dispatch").persist()
    metrics = bronze("bronze_metrics").where(F.col("metric").isin(*OUT_COUNTERS, CURSOR_RANGES_METRIC))
    policies = read_table("bronze_policies", settings=settings).where(F.col("day") <= F.lit(day))
    tables = {
        "dispatch_intervals": dispatch_intervals(dispatch, topic_stats, metrics),
        "cursor_snapshots": cursor_snapshots(internal, topic_stats, metrics),
        "producer_snapshots": producer_snapshots(bronze("bronze_producer_stats")),
        "rate_limits": rate_limits(policies, topic_stats, internal, dispatch, day),
    }
    for name, frame in tables.items():
        # Scrape intervals and snapshots are dated by their own start; only the day's rows here.
        frame = frame.where(F.col("day") == F.lit(day))
        write = write_table(frame, name, mode="replace", partitions=[{"day": day}], settings=settings)
        result.writes.append(write)
        result.metrics[f"{name}_rows"] = write.rows
    topic_stats.unpersist()
    dispatch.unpersist()
    return result
