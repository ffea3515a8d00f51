"""Cursor backlog for dispatch throttling, from silver ``cursor_snapshots``: whether each dispatch
scope had backlog (for the starved empty periods: allowance 0 while there is backlog) and whether
its cursors were caught up (the non-backlog counting rule), as the marker rows of
dispatch_periods' one pass."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .scopes import LEVEL_KEYS, SCOPE, per_level


def backlog_intervals(snapshots: DataFrame) -> DataFrame:
    """Whether each dispatch scope had backlog, per snapshot of silver ``cursor_snapshots``:
    (level, cluster, _bk, from_us, backlogged), each in force until the scope's next snapshot
    (the last open-ended). A subscription's own backlog; a topic partition's or a broker's: the
    sum over its subscriptions at the same collection. ``_bk`` is the key a dispatch scope finds
    it by (``backlog_markers``): below the broker level its topic and subscription, not its broker."""
    summed = per_level(
        snapshots,
        {
            "subscription": ["cluster", "topic", "subscription", "snapshot_at"],
            "topic": ["cluster", "topic", "snapshot_at"],
            "broker": ["cluster", "broker", "snapshot_at"],
        },
        F.sum("msg_backlog").alias("backlog"),
    )
    return summed.select(
        "level",
        "cluster",
        _backlog_key().alias("_bk"),
        F.unix_micros("snapshot_at").alias("from_us"),
        F.coalesce(F.col("backlog") > 0, F.lit(False)).alias("backlogged"),
    )


def backlog_markers(intervals: DataFrame, backlog: DataFrame) -> DataFrame:
    """``backlog_intervals`` as zero-length rows of each dispatch scope of ``intervals`` (SCOPE,
    day, period_start, source, t0_us, is_record, _backlogged), for the one sort and pass of
    dispatch_periods, which counts the starved empty periods with them (DispatchScan.java)."""
    scopes = intervals.select(*SCOPE).distinct().withColumn("_bk", _backlog_key())
    return scopes.join(backlog, ["level", "cluster", "_bk"]).select(
        *SCOPE,
        F.to_date(F.timestamp_micros("from_us")).alias("day"),
        F.timestamp_micros("from_us").alias("period_start"),
        F.lit(BACKLOG_SOURCE).alias("source"),
        F.col("from_us").alias("t0_us"),
        F.lit(False).alias("is_record"),
        F.col("backlogged").alias("_backlogged"),
    )


CURSOR_SOURCE, BACKLOG_SOURCE = "cursor_snapshots", "cursor_snapshots_backlog"
CAUGHT_UP, BACKLOGGED, MIXED = "caught-up", "backlogged", "mixed"
CHARGED, NOT_CHARGED = "charged", "not-charged-caught-up"
CHARGED_PARTLY, CHARGED_BACKLOG_UNKNOWN = "charged-partly-caught-up", "charged-backlog-unknown"


def cursor_states(snapshots: DataFrame, models: DataFrame) -> DataFrame:
    """Whether each dispatch scope's cursors were caught up, per snapshot of silver
    ``cursor_snapshots``, on the brokers whose ``counting_rules`` do not throttle non-backlog
    consumers: (SCOPE, at_us, cursor_state).

    Pulsar charges a delivery only if the subscription's cursor is inactive (when the rule is
    off); a cursor is active while the subscription has consumers and fewer than
    managedLedgerCursorBackloggedThreshold entries of backlog (PersistentTopic
    checkBackloggedCursors). Snapshots carry msgBacklog in messages, never fewer than the
    entries: below the threshold in messages is below it in entries, and a batched backlog
    above it in messages only is taken as backlogged (charged: an upper bound). A subscription
    is caught-up or backlogged; a topic partition or broker (its subscriptions with consumers,
    at the same collection) caught-up when all are, backlogged when none is, else mixed."""
    off = models.where(~F.col("throttle_non_backlog")).select(
        F.col("cluster").alias("m_cluster"), F.col("broker").alias("m_broker"), "cursor_backlogged_threshold"
    )
    snaps = snapshots.join(
        F.broadcast(off), (F.col("cluster") == F.col("m_cluster")) & (F.col("broker") == F.col("m_broker"))
    ).select(
        "cluster", "broker", "topic", "subscription", "snapshot_at",
        F.when(
            F.col("consumers") > 0,
            F.coalesce(F.col("msg_backlog") < F.col("cursor_backlogged_threshold"), F.lit(False)).cast("int"),
        ).alias("_up"),
    )  # fmt: skip
    levels = {level: [*keys, "snapshot_at"] for level, keys in LEVEL_KEYS.items()}
    agg = per_level(snaps, levels, F.min("_up").alias("_all"), F.max("_up").alias("_any"))
    return agg.select(
        "level",
        "cluster",
        "broker",
        "topic",
        "subscription",
        F.unix_micros("snapshot_at").alias("at_us"),
        F.when(F.col("_all") == 1, F.lit(CAUGHT_UP))
        .when(F.coalesce(F.col("_any"), F.lit(0)) == 0, F.lit(BACKLOGGED))
        .otherwise(F.lit(MIXED))
        .alias("cursor_state"),
    )


def _backlog_key() -> Column:
    return (
        F.when(F.col("level") == "subscription", F.concat_ws("\u0000", "topic", "subscription"))
        .when(F.col("level") == "topic", F.col("topic"))
        .otherwise(F.col("broker"))
    )
