"""Gold ``reload_events``: the reload post-mortem. Each topic reload seen between two snapshots of
a subscription, with the exposure predicted from the snapshot before it beside what the broker
did after it.

A reload is seen when the subscription's ``msgOutCounter`` went down (a topic's stats live in
the broker's memory and restart at 0 when the topic is loaded again), when another broker serves
the topic, or when both the topic's current ledger and the cursor's ledger were replaced (a
managed ledger that is opened again always starts a new ledger, and the cursor writes a new
cursor ledger). Acknowledgements the reload lost show as entries acknowledged before it that are
not after it (the mark-delete position unchanged), and as the backlog jump: they are
unacknowledged again and delivered again.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .persistence import KEY

SIGNALS = ("counters-reset", "broker-changed", "ledgers-replaced")


def _per_snapshot(topic_stats: DataFrame, internal: DataFrame) -> DataFrame:
    """msgOutCounter, the current ledger and the cursor ledger per subscription snapshot."""
    at = [*KEY, "snapshot_at"]
    counters = (
        topic_stats.where(F.col("subscription").isNotNull())
        .select(*KEY, F.col("collected_at").alias("snapshot_at"), "msg_out_counter")
        .groupBy(*at)
        .agg(F.max("msg_out_counter").alias("msg_out_counter"))
    )
    ledgers = (
        internal.where(F.col("cursor").isNotNull())
        .select("cluster", "topic", F.col("cursor").alias("subscription"), F.col("collected_at").alias("snapshot_at"), "current_ledger_id", "cursor_ledger")
        .groupBy(*at)
        .agg(F.max("current_ledger_id").alias("current_ledger_id"), F.max("cursor_ledger").alias("cursor_ledger"))
    )
    return counters.join(ledgers, at, "full")


def reload_events_frame(ranges: DataFrame, topic_stats: DataFrame, internal: DataFrame, day: date) -> DataFrame:
    """reload_events rows of ``day`` from cursor_ranges rows (``day`` and the day before, so that
    the first snapshot of the day has one before it) and the bronze stats of the same days."""
    snaps = ranges.join(_per_snapshot(topic_stats, internal), [*KEY, "snapshot_at"], "left")
    by_time = Window.partitionBy(*KEY).orderBy("snapshot_at")
    before = lambda c: F.lag(c).over(by_time)  # noqa: E731
    changed = lambda c: F.coalesce(F.col(c) != F.col(f"b_{c}"), F.lit(False))  # noqa: E731
    previous = [
        "snapshot_at",
        "broker",
        "msg_out_counter",
        "current_ledger_id",
        "cursor_ledger",
        "msg_backlog",
        "acked_entries",
        "mark_delete_position",
        "ranges",
        "cap",
        "persist_mode",
        "unload_exposure_entries",
        "exposure_entries",
    ]
    paired = snaps.select("*", *(before(c).alias(f"b_{c}") for c in previous)).where(F.col("b_snapshot_at").isNotNull())
    signals = F.filter(
        F.array(
            F.when(F.coalesce(F.col("msg_out_counter") < F.col("b_msg_out_counter"), F.lit(False)), F.lit(SIGNALS[0])),
            F.when(changed("broker") & F.col("b_broker").isNotNull(), F.lit(SIGNALS[1])),
            F.when(changed("current_ledger_id") & changed("cursor_ledger"), F.lit(SIGNALS[2])),
        ),
        lambda s: s.isNotNull(),
    )
    unmoved = F.col("mark_delete_position") == F.col("b_mark_delete_position")
    acks_lost = F.when(unmoved, F.col("b_acked_entries") - F.col("acked_entries"))
    backlog_jump = F.col("msg_backlog") - F.col("b_msg_backlog")
    observed = F.greatest(F.coalesce(acks_lost, backlog_jump), F.lit(0))
    unload_ok = F.coalesce(F.col("b_unload_exposure_entries") == F.col("observed_lost"), F.lit(False))
    crash_ok = F.coalesce(F.col("b_exposure_entries") == F.col("observed_lost"), F.lit(False))
    return (
        paired.withColumn("signals", signals)
        .where((F.size("signals") > 0) & (F.col("day") == F.lit(day)))
        .withColumn("observed_lost", observed.cast("bigint"))
        .select(
            "day",
            "cluster",
            "namespace",
            "topic",
            "subscription",
            F.col("b_snapshot_at").alias("before_at"),
            F.col("snapshot_at").alias("after_at"),
            F.col("b_broker").alias("broker_before"),
            F.col("broker").alias("broker_after"),
            "signals",
            F.col("b_ranges").alias("ranges_before"),
            F.col("b_cap").alias("cap"),
            F.col("b_persist_mode").alias("persist_mode"),
            F.col("b_unload_exposure_entries").alias("predicted_unload_exposure"),
            F.col("b_exposure_entries").alias("predicted_crash_exposure"),
            F.col("b_msg_backlog").alias("backlog_before"),
            F.col("msg_backlog").alias("backlog_after"),
            backlog_jump.alias("backlog_jump"),
            acks_lost.alias("acks_lost"),
            F.when(F.array_contains("signals", SIGNALS[0]), F.col("msg_out_counter")).alias("msg_out_after"),
            "observed_lost",
            F.when(unload_ok & crash_ok, F.lit("unload-or-crash")).when(unload_ok, F.lit("unload")).when(crash_ok, F.lit("crash")).alias("explained_by"),
            (F.col("observed_lost") > 0).alias("lost_acknowledgements"),
        )
    )
