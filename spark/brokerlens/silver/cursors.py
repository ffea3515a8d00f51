"""``cursor_snapshots``: each internal-stats cursor (mark-delete position, individuallyDeletedMessages,
ledgers) with the topic-stats subscription of the same collection, plus range counts from broker
/metrics for subscriptions no stats cover."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.land.metrics import CURSOR_RANGES_METRICS

from .topics import namespace_of

# Topic stats and internal stats are two admin calls: pair them if at most this far apart.
STATS_PAIRING_SECONDS = 60


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
    """Range counts from ``pulsar_ml_cursor_nonContiguousDeletedMessagesRange`` (labels ``ledger_name``
    ``tenant/ns/persistent/<encoded local name>`` and ``cursor_name``), in cursor_snapshots' shape."""
    ledger = F.col("labels")["ledger_name"]
    topic = F.concat(
        F.lit("persistent://"),
        F.regexp_extract(ledger, r"^(.*)/persistent/", 1),
        F.lit("/"),
        F.url_decode(F.regexp_extract(ledger, r"/persistent/(.*)$", 1)),
    )
    return (
        metrics.where(F.col("metric").isin(*CURSOR_RANGES_METRICS) & ledger.contains("/persistent/") & ~F.isnan("value"))
        .select(
            "cluster",
            "broker",
            topic.alias("topic"),
            F.col("labels")["cursor_name"].alias("subscription"),
            F.coalesce("sample_timestamp", "collected_at").alias("snapshot_at"),
            F.col("value").cast("bigint").alias("ranges_reported"),
            "source_file",
        )
        .where(F.col("subscription").isNotNull())
    )


def cursor_snapshots(internal: DataFrame, topic_stats: DataFrame, metrics: DataFrame) -> DataFrame:
    cursors = internal.where(F.col("cursor").isNotNull()).select(
        "cluster",
        "broker",
        "topic",
        F.col("cursor").alias("subscription"),
        F.col("collected_at").alias("internal_at"),
        "mark_delete_position",
        "read_position",
        "individually_deleted_messages",
        ledger_entries(internal).alias("ledger_entries"),
        "total_non_contiguous_deleted_messages_range",
        F.col("source_file").alias("internal_file"),
    )
    subs = topic_stats.where(F.col("subscription").isNotNull()).select(
        "cluster",
        F.col("broker").alias("stats_broker"),
        "topic",
        "subscription",
        F.col("collected_at").alias("stats_at"),
        "subscription_type",
        "non_contiguous_deleted_messages_ranges",
        "non_contiguous_deleted_messages_ranges_serialized_size",
        "msg_backlog",
        "unacked_messages",
        "msg_delayed",
        "msg_rate_out",
        "msg_rate_redeliver",
        "consumers",
        F.col("source_file").alias("stats_file"),
    )
    key = ["cluster", "topic", "subscription"]
    pairing_us = STATS_PAIRING_SECONDS * 1_000_000
    gap = F.abs(F.unix_micros("stats_at") - F.unix_micros("internal_at"))
    nearest = Window.partitionBy(*key, "internal_at").orderBy(gap, "stats_at")
    # Candidates share a pairing-wide time bucket with the cursor's or a neighbour: joined on the
    # subscription alone, every cursor snapshot met every stats snapshot of the day, a number that
    # grows with the square of the day's snapshots.
    bucket = F.floor(F.unix_micros("internal_at") / pairing_us)
    candidates = cursors.withColumn("_bucket", F.explode(F.sequence(bucket - 1, bucket + 1))).join(
        subs.withColumn("_bucket", F.floor(F.unix_micros("stats_at") / pairing_us)), [*key, "_bucket"]
    )
    paired = candidates.where(gap <= pairing_us).drop("_bucket").withColumn("_rank", F.row_number().over(nearest)).where("_rank = 1").drop("_rank")
    # A cursor without stats within the pairing distance stands alone.
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
    # Every cursor and every stats subscription is a row above, paired or not: their keys are
    # those rows' keys, without the pairing planned and run again for them.
    covered = cursors.select(*key).unionByName(subs.select(*key)).distinct()
    from_metrics = metric_cursors(metrics).join(covered, key, "left_anti")
    from_metrics = from_metrics.select(
        F.to_date("snapshot_at").alias("day"),
        "*",
        namespace_of(F.col("topic")).alias("namespace"),
        F.lit("metrics").alias("ranges_source"),
    )
    return stats_rows.unionByName(from_metrics, allowMissingColumns=True)
