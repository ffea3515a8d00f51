"""Cursor backlog for dispatch throttling, from silver ``cursor_snapshots``: the stretches with
backlog per dispatch scope, whether the scope's cursors were caught up (the non-backlog counting
rule), and the starved empty periods (allowance 0 while there is backlog)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .limits import MEASURES, US, round_half_up
from .models import broker_credit, judged_as_bucket
from .scopes import LEVEL_KEYS, SCOPE, per_level


def backlog_intervals(snapshots: DataFrame) -> DataFrame:
    """Stretches with backlog per dispatch scope, from silver ``cursor_snapshots``: (level,
    cluster, _bk, from_us, to_us), each snapshot with msgBacklog > 0 until the next snapshot of
    the scope (open-ended for the last). A subscription's own backlog; a topic partition's or a
    broker's: the sum over its subscriptions at the same collection."""
    summed = per_level(
        snapshots,
        {
            "subscription": ["cluster", "topic", "subscription", "snapshot_at"],
            "topic": ["cluster", "topic", "snapshot_at"],
            "broker": ["cluster", "broker", "snapshot_at"],
        },
        F.sum("msg_backlog").alias("backlog"),
    )
    # The keys left out of a row's level are null: partitioned by every key, each scope is its own.
    series = Window.partitionBy("level", "cluster", "topic", "subscription", "broker").orderBy("snapshot_at")
    return (
        summed.select(
            "level",
            "cluster",
            _backlog_key().alias("_bk"),
            F.unix_micros("snapshot_at").alias("from_us"),
            F.unix_micros(F.lead("snapshot_at").over(series)).alias("to_us"),
            "backlog",
        )
        .where("backlog > 0")
        .drop("backlog")
    )


CURSOR_SOURCE = "cursor_snapshots"
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


def with_starved_empty(rows: DataFrame, backlog: DataFrame | None) -> DataFrame:
    """``starved_empty_periods``: periods without a record whose allowance is 0 because of debt
    while the scope has backlog (the latest cursor snapshot at or before the period start shows
    msgBacklog > 0), in the gap after each row up to the next row or midnight. The gap after the
    opening debt (before the day's first row) is counted on that first row.

    After a row the state x drains by the limit each period: the allowance stays 0 for
    floor(x / limit) periods (classic) or floor(x / limit) - 1 (token bucket, which also has the
    refill; a counter row's too, with x net of the broker's credit); messages or bytes, whichever
    lasts longer. The limit of the row is used for the whole gap. Periods before the first
    snapshot known are not counted (no backlog known)."""
    if backlog is None:
        return rows.withColumn("starved_empty_periods", F.lit(0).cast("long"))
    p_us = F.col("rate_period_seconds").cast("long") * F.lit(US)
    t1 = F.col("t0_us") + round_half_up(F.col("interval_seconds") * US)
    # A bucket's x is its capacity less its tokens, which a counter row's credit adds to.
    zero = F.greatest(
        *[
            F.coalesce(
                F.when(
                    judged_as_bucket(),
                    F.greatest(F.lit(0), F.floor((F.col(f"_x_out_{name}") - broker_credit("out", name)) / F.col(f"{m}_limit")) - 1),
                ).otherwise(F.floor(F.col(f"_x_out_{name}") / F.col(f"{m}_limit"))),
                F.lit(0),
            )
            for name, m in MEASURES
        ]
    )
    next_t0 = F.col("_next_t0_us")  # from the scan (periods.scan): the scope's next non-cursor row
    end = F.coalesce(next_t0, F.unix_micros(F.to_timestamp(F.date_add("day", 1))))
    gaps = (
        rows.withColumn("_g_from", t1)
        .withColumn("_g_p", p_us)
        .withColumn("_g_n", F.least(F.floor((end - F.col("_g_from")) / F.col("_g_p")), zero).cast("long"))
        # The opening debt's gap belongs to the day's first row.
        .withColumn("_g_owner", F.when(F.col("is_record"), F.col("t0_us")).otherwise(next_t0))
        .where("_g_n > 0 AND _g_owner IS NOT NULL")
        .select(*SCOPE, "_g_owner", "_g_from", "_g_p", "_g_n", _backlog_key().alias("_bk"))
    )
    b = backlog.select(
        F.col("level").alias("b_level"),
        F.col("cluster").alias("b_cluster"),
        F.col("_bk").alias("b_bk"),
        "from_us",
        "to_us",
    )
    g_to = F.col("_g_from") + F.col("_g_n") * F.col("_g_p")
    joined = gaps.join(
        b,
        (F.col("level") == F.col("b_level"))
        & (F.col("cluster") == F.col("b_cluster"))
        & (F.col("_bk") == F.col("b_bk"))
        & (F.col("from_us") < g_to)
        & (F.col("to_us").isNull() | (F.col("to_us") > F.col("_g_from"))),
    )
    lo = F.greatest(F.col("from_us"), F.col("_g_from")) - F.col("_g_from")
    hi = F.least(F.coalesce(F.col("to_us"), g_to), g_to) - F.col("_g_from")

    # Period starts _g_from + k * p (k >= 0) inside [lo, hi): ceil(hi / p) - ceil(lo / p).
    def ceil_div(x: Column) -> Column:
        return F.floor((x + F.col("_g_p") - 1) / F.col("_g_p"))

    counted = joined.groupBy(*SCOPE, "_g_owner").agg(F.sum(ceil_div(hi) - ceil_div(lo)).alias("_starved_empty"))
    c = counted.select(*[F.col(k).alias(f"c_{k}") for k in SCOPE], "_g_owner", "_starved_empty")
    cond = F.col("t0_us") == F.col("_g_owner")
    for k in SCOPE:
        cond = cond & F.col(k).eqNullSafe(F.col(f"c_{k}"))
    return (
        rows.join(c, cond & F.col("is_record"), "left")
        .withColumn("starved_empty_periods", F.coalesce(F.col("_starved_empty"), F.lit(0)).cast("long"))
        .drop(*[f"c_{k}" for k in SCOPE], "_g_owner", "_starved_empty")
    )
