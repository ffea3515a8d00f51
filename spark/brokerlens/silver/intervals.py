"""``dispatch_intervals``: dispatch records at period grain, else the differences of successive
out counters at scrape grain, from topic stats (``msgOutCounter``/``bytesOutCounter``) or broker
/metrics (``pulsar_out_messages_total``/``pulsar_out_bytes_total``). Topic-stats intervals
estimate their entries from the consumers' ``avgMessagesPerEntry``."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.land.metrics import BYTES_OUT_COUNTER, MSG_OUT_COUNTER
from brokerlens.land.topic_stats import consumers_msgs_per_entry

from .topics import metric_topic

SCOPE = ["level", "cluster", "topic", "subscription"]
# Broker /metrics out counters (Pulsar's prometheus TopicStats) -> snapshot column.
OUT_COUNTERS = {MSG_OUT_COUNTER: "msg_counter", BYTES_OUT_COUNTER: "bytes_counter"}


def _same(columns: list[str], left: DataFrame, right: DataFrame) -> Column:
    """Null-safe equality on columns (subscription and topic are null above their level)."""
    cond = F.lit(True)
    for c in columns:
        cond = cond & left[c].eqNullSafe(right[c])
    return cond


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
        # brokerlens' interceptor says so (docs/interceptor.md); records of any other exporter
        # (demo-data's, a user's own) are "dispatch".
        F.when(F.col("source") == "exporter", F.lit("exporter")).otherwise(F.lit("dispatch")).alias("source"),
        F.lit(False).alias("counter_reset"),
    )


def with_msgs_per_entry(topic_stats: DataFrame) -> DataFrame:
    """Bronze topic stats with ``msgs_per_entry`` (land's ``consumers_msgs_per_entry``) in place of
    the verbatim JSON columns, which are the bulk of a row. A row landed before bronze had that
    column (null there) gets it from its subscription's JSON, as land computes it; so does a row
    whose consumers have no figure of at least 1, which a parse finds null again."""
    landed = F.col("consumers_msgs_per_entry")
    unknown = landed.isNull() & ~F.coalesce(F.col("consumers") == 0, F.lit(False))
    per_entry = F.when(unknown, consumers_msgs_per_entry(F.col("subscription_json"))).otherwise(landed)
    return topic_stats.withColumn("msgs_per_entry", per_entry).drop("subscription_json", "publishers_json", "consumers_msgs_per_entry")


def counter_snapshots(topic_stats: DataFrame) -> DataFrame:
    """Topic-stats out counters per scope and collection time, from ``with_msgs_per_entry``'s
    frame: ``msgs_per_entry`` is the consumers' messages per entry (a topic partition's over all
    its subscriptions)."""
    per_entry = F.col("msgs_per_entry")
    subscriptions = topic_stats.where(F.col("subscription").isNotNull()).select(
        F.lit("subscription").alias("level"),
        "cluster",
        "broker",
        "topic",
        "subscription",
        "collected_at",
        F.col("msg_out_counter").alias("msg_counter"),
        F.col("bytes_out_counter").alias("bytes_counter"),
        per_entry.alias("msgs_per_entry"),
    )
    topics = topic_stats.select(
        F.lit("topic").alias("level"),
        "cluster",
        "broker",
        "topic",
        F.lit(None).cast("string").alias("subscription"),
        "collected_at",
        F.col("topic_msg_out_counter").alias("msg_counter"),
        F.col("topic_bytes_out_counter").alias("bytes_counter"),
        per_entry.alias("msgs_per_entry"),
    )
    return (
        subscriptions.unionByName(topics)
        .where(F.col("msg_counter").isNotNull() & F.col("bytes_counter").isNotNull())
        # The topic counters repeat on each subscription row of a snapshot: one per snapshot.
        .groupBy(*SCOPE, "collected_at")
        .agg(
            F.max("broker").alias("broker"),
            F.max("msg_counter").alias("msg_counter"),
            F.max("bytes_counter").alias("bytes_counter"),
            F.avg("msgs_per_entry").alias("msgs_per_entry"),
        )
    )


def metric_counter_snapshots(metrics: DataFrame) -> DataFrame:
    """Broker /metrics out counters per scope and sample time: ``pulsar_out_messages_total`` and
    ``pulsar_out_bytes_total`` with a ``topic`` label (topic level) and also a ``subscription``
    label (subscription level), as Pulsar's prometheus TopicStats writes them."""
    labels = F.col("labels")
    samples = metrics.where(F.col("metric").isin(*OUT_COUNTERS) & labels["topic"].isNotNull() & ~F.isnan("value")).select(
        F.when(labels["subscription"].isNotNull(), F.lit("subscription")).otherwise(F.lit("topic")).alias("level"),
        "cluster",
        "broker",
        metric_topic(labels).alias("topic"),
        labels["subscription"].alias("subscription"),
        F.coalesce("sample_timestamp", "collected_at").alias("collected_at"),
        "metric",
        "value",
    )
    counter = {name: F.max(F.when(F.col("metric") == metric, F.col("value"))).cast("bigint") for metric, name in OUT_COUNTERS.items()}
    return (
        samples.groupBy(*SCOPE, "collected_at")
        .agg(F.max("broker").alias("broker"), *[c.alias(name) for name, c in counter.items()])
        .where(F.col("msg_counter").isNotNull() & F.col("bytes_counter").isNotNull())
        # /metrics has no per-subscription entry count or messages per entry.
        .withColumn("msgs_per_entry", F.lit(None).cast("double"))
    )


def counter_intervals(snapshots: DataFrame, source: str) -> DataFrame:
    """Scrape-grain intervals between successive counter snapshots of the same scope. Entries are
    the messages over ``msgs_per_entry`` at the interval's end (else its start): an estimate,
    null where no consumer reported one."""
    order = Window.partitionBy(*SCOPE).orderBy("collected_at")
    with_prev = snapshots.select(
        "*",
        F.lag("collected_at").over(order).alias("prev_at"),
        F.lag("msg_counter").over(order).alias("prev_msgs"),
        F.lag("bytes_counter").over(order).alias("prev_bytes"),
        F.lag("msgs_per_entry").over(order).alias("prev_per_entry"),
    ).where(F.col("prev_at").isNotNull())
    reset = (F.col("msg_counter") < F.col("prev_msgs")) | (F.col("bytes_counter") < F.col("prev_bytes"))
    msgs = F.when(reset, F.col("msg_counter")).otherwise(F.col("msg_counter") - F.col("prev_msgs"))
    per_entry = F.coalesce("msgs_per_entry", "prev_per_entry")
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
        msgs.alias("msgs"),
        F.when(reset, F.col("bytes_counter")).otherwise(F.col("bytes_counter") - F.col("prev_bytes")).alias("bytes"),
        F.ceil(msgs / per_entry).cast("bigint").alias("entries"),
        F.lit(None).cast("bigint").alias("redelivered_msgs"),
        F.lit(source).alias("source"),
        reset.alias("counter_reset"),
    )


def dispatch_intervals(dispatch: DataFrame, topic_stats: DataFrame, metrics: DataFrame) -> DataFrame:
    """Per scope, the finest source there is: dispatch records (``source`` ``exporter`` from
    brokerlens' interceptor), else topic-stats counters (``topic_stats`` as ``with_msgs_per_entry``
    gives it), else the broker's /metrics counters.

    A scope with dispatch records on the day takes no counter interval that day, at any time: at
    the same scope and time the period-grain record always wins, and counter intervals outside
    the records' span (an interceptor deployed mid-day) are left out too rather than risk counting
    an interval that straddles the first record twice. Records the interceptor dropped at its
    bound are a gap collect reports (``exporter_missed_records``)."""
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
