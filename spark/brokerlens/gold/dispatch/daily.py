"""Gold ``dispatch_daily``: one row per dispatch scope and day (periods over quota, excess, debt,
starved, main cause), next to Pulsar's own throttle counters (PIP-406), and the worst scopes of a
day as lines for the build output, the report and alerts."""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .cursors import NOT_CHARGED
from .models import CLASSIC
from .scopes import LEVEL_KEYS, SCOPE, per_level, scope_join


def throttle_events(topic_stats: DataFrame) -> DataFrame:
    """PIP-406 counters of the day per dispatch scope: (SCOPE, pulsar_throttled_msg_events,
    pulsar_throttled_bytes_events).

    Each subscription's ``dispatchThrottled{Msg,Bytes}EventsBy{Subscription,Topic,Broker}Limit``
    counts since its dispatcher started: the day's events are the increases between successive
    snapshots of the day (a lower value after a topic reload counts from 0). The subscription
    limit's events are the subscription scope's; the topic limit's, summed over the topic
    partition's subscriptions, the topic scope's; the broker limit's, summed over the broker,
    the broker scope's. Null where Pulsar (< 4.0) does not report them.
    """
    keys = LEVEL_KEYS["subscription"]
    series = Window.partitionBy(*keys).orderBy("collected_at")
    counters = {f"{level}_{unit}": f"dispatch_throttled_{unit}_events_by_{level}_limit" for level in LEVEL_KEYS for unit in ("msg", "bytes")}
    # Each previous value in a column of its own: used three times below, a lag written inline
    # would be three window functions.
    previous = topic_stats.where(F.col("subscription").isNotNull()).select(
        *keys, *counters.values(), *[F.lag(c).over(series).alias(f"_before_{name}") for name, c in counters.items()]
    )
    columns = []
    for name, counter in counters.items():
        c, before = F.col(counter), F.col(f"_before_{name}")
        # First snapshot of the day: no increase seen yet (0); reset: counted from 0.
        columns.append(F.when(c.isNull(), F.lit(None)).when(before.isNull(), F.lit(0)).when(c >= before, c - before).otherwise(c).alias(name))
    deltas = previous.select(*keys, *columns)
    sums = per_level(
        deltas,
        LEVEL_KEYS,
        *[F.sum(f"{level}_{unit}").alias(f"_{level}_{unit}") for level in LEVEL_KEYS for unit in ("msg", "bytes")],
    )

    def of_level(unit: str) -> Column:
        """Per row, the sum of its own level's counter."""
        return F.coalesce(*[F.when(F.col("level") == level, F.col(f"_{level}_{unit}")) for level in LEVEL_KEYS])

    return sums.select(
        "level",
        *keys,
        of_level("msg").alias("pulsar_throttled_msg_events"),
        of_level("bytes").alias("pulsar_throttled_bytes_events"),
    )


def scrape_slack(limit: str) -> Column:
    # A counter row's allowance holds one period's quota of slack (periods.py: the snapshots are
    # not aligned with the limiter's periods); the limiter's own allowance, used up whenever the
    # broker throttled, is the one without it.
    return F.when(F.col("grain") == "scrape", F.coalesce(F.col(limit), F.lit(0))).otherwise(F.lit(0))


def dispatch_daily(
    periods: DataFrame,
    opening_debt: DataFrame | None,
    closing: DataFrame,
    day: date,
    events: DataFrame | None = None,
    models: DataFrame | None = None,
) -> DataFrame:
    """Gold ``dispatch_daily``: one row per scope of the day (with rows or with carried debt).

    ``events``: ``throttle_events`` of the day, put next to ``periods_exhausted`` (where the
    model says the allowance was used up); null when Pulsar did not report them. ``models``:
    the day's ``limiter_models``, for ``limiter_model_source`` (null without)."""
    agg = periods.groupBy(*SCOPE).agg(
        F.when(F.countDistinct("grain") > 1, F.lit("mixed")).otherwise(F.first("grain")).alias("grain"),
        F.count(F.lit(1)).alias("periods"),
        F.sum("msgs").alias("msgs"),
        F.sum("bytes").alias("bytes"),
        F.sum(((F.col("over_msgs") > 0) | (F.col("over_bytes") > 0)).cast("int")).alias("periods_over"),
        F.sum((F.col("over_msgs") > 0).cast("int")).alias("periods_over_msgs"),
        F.sum((F.col("over_bytes") > 0).cast("int")).alias("periods_over_bytes"),
        F.sum("over_msgs").alias("excess_msgs"),
        F.sum("over_bytes").alias("excess_bytes"),
        F.max("debt_out_msgs").alias("max_debt_msgs"),
        F.max("debt_out_bytes").alias("max_debt_bytes"),
        (F.sum(F.col("starved").cast("int")) + F.sum("starved_empty_periods")).alias("periods_starved"),
        F.sum(
            (
                (F.col("charge_rule") != NOT_CHARGED)
                & (
                    F.coalesce(F.col("counted_msgs") >= F.col("allowed_msgs") - scrape_slack("msg_limit"), F.lit(False))
                    | F.coalesce(F.col("counted_bytes") >= F.col("allowed_bytes") - scrape_slack("byte_limit"), F.lit(False))
                )
            ).cast("int")
        ).alias("periods_exhausted"),
        F.sum((F.col("charge_rule") == NOT_CHARGED).cast("int")).alias("periods_not_charged"),
        F.sum("over_batch_msgs").alias("_batch_msgs"),
        F.sum("over_redelivery_msgs").alias("_redelivery_msgs"),
        F.sum("over_redelivery_bytes").alias("_redelivery_bytes"),
        F.sum("over_approx_bytes").alias("_approx_bytes"),
        F.max("limiter_model").alias("_model"),  # one per scope: the model of its broker that day
    )
    out = scope_join(agg, closing.select(*SCOPE, "debt_msgs", "debt_bytes", "limiter_model"), "full_outer").select(
        *[F.coalesce(F.col(k), F.col(f"r_{k}")).alias(k) for k in SCOPE],
        *[k for k in agg.columns if k not in SCOPE and k != "_model"],
        F.coalesce(F.col("_model"), F.col("r_limiter_model"), F.lit(CLASSIC)).alias("limiter_model"),
        F.coalesce(F.col("r_debt_msgs"), F.lit(0)).alias("closing_debt_msgs"),
        F.coalesce(F.col("r_debt_bytes"), F.lit(0)).alias("closing_debt_bytes"),
    )
    if opening_debt is not None:
        columns = out.columns
        out = scope_join(out, opening_debt.select(*SCOPE, "debt_msgs", "debt_bytes"), "left").select(
            *columns,
            F.coalesce(F.col("r_debt_msgs"), F.lit(0)).alias("opening_debt_msgs"),
            F.coalesce(F.col("r_debt_bytes"), F.lit(0)).alias("opening_debt_bytes"),
        )
    else:
        out = out.withColumn("opening_debt_msgs", F.lit(0)).withColumn("opening_debt_bytes", F.lit(0))
    counts = [
        "periods", "msgs", "bytes", "periods_over", "periods_over_msgs", "periods_over_bytes",
        "excess_msgs", "excess_bytes", "max_debt_msgs", "max_debt_bytes", "periods_starved", "periods_exhausted",
        "periods_not_charged", "_batch_msgs", "_redelivery_msgs", "_redelivery_bytes", "_approx_bytes",
    ]  # fmt: skip
    out = out.fillna(0, subset=counts).fillna("period", subset=["grain"])
    if events is not None:
        columns = out.columns
        out = scope_join(out, events, "left").select(
            *columns,
            F.col("r_pulsar_throttled_msg_events").alias("pulsar_throttled_msg_events"),
            F.col("r_pulsar_throttled_bytes_events").alias("pulsar_throttled_bytes_events"),
        )
    else:
        out = out.withColumn("pulsar_throttled_msg_events", F.lit(None).cast("long")).withColumn("pulsar_throttled_bytes_events", F.lit(None).cast("long"))

    if models is not None:
        m = models.select(F.col("cluster").alias("m_cluster"), F.col("broker").alias("m_broker"), "limiter_model_source")
        cond = (F.col("cluster") == F.col("m_cluster")) & F.col("broker").eqNullSafe(F.col("m_broker"))
        out = out.join(F.broadcast(m), cond, "left").drop("m_cluster", "m_broker")
    else:
        out = out.withColumn("limiter_model_source", F.lit(None).cast("string"))

    def share(part: str | Column, total: str) -> Column:
        part = F.col(part) if isinstance(part, str) else part
        return F.when(F.col(total) > 0, part / F.col(total))

    out = (
        out.withColumn("day", F.lit(day).cast("date"))
        .withColumn("share_batch_msgs", share("_batch_msgs", "excess_msgs"))
        .withColumn("share_redelivery_msgs", share("_redelivery_msgs", "excess_msgs"))
        .withColumn(
            "share_other_msgs",
            share(F.col("excess_msgs") - F.col("_batch_msgs") - F.col("_redelivery_msgs"), "excess_msgs"),
        )
        .withColumn("share_redelivery_bytes", share("_redelivery_bytes", "excess_bytes"))
        .withColumn("share_approx_bytes", share("_approx_bytes", "excess_bytes"))
    )
    causes = [
        ("batch", F.col("share_batch_msgs")),
        ("redelivery", F.greatest("share_redelivery_msgs", "share_redelivery_bytes")),
        ("byte-approximation", F.col("share_approx_bytes")),
        ("other", F.col("share_other_msgs")),
    ]
    best = F.greatest(*[F.coalesce(v, F.lit(-1.0)) for _, v in causes])
    main = F.lit(None).cast("string")
    for label, value in reversed(causes):  # first listed wins a tie
        main = F.when(F.coalesce(value, F.lit(-1.0)) == best, F.lit(label)).otherwise(main)
    out = out.withColumn("main_cause", F.when((F.col("excess_msgs") > 0) | (F.col("excess_bytes") > 0), main))
    return out.drop("_batch_msgs", "_redelivery_msgs", "_redelivery_bytes", "_approx_bytes")


def worst_scopes(daily: DataFrame, limit: int = 10) -> DataFrame:
    """The worst scopes of a day: most periods over quota, then most excess, then most debt.

    For ``brokerlens build`` output, the report and alerts (``read_table("dispatch_daily")``
    filtered to a day, then this)."""
    return (
        daily.where("periods_over > 0 OR periods_starved > 0 OR closing_debt_msgs > 0 OR closing_debt_bytes > 0")
        .orderBy(
            F.col("periods_over").desc(),
            F.col("excess_msgs").desc(),
            F.col("excess_bytes").desc(),
            F.col("periods_starved").desc(),
            F.col("max_debt_msgs").desc(),
            *SCOPE,
        )
        .limit(limit)
    )


def _scope_label(row) -> str:
    parts = [row["level"], row["cluster"], row["broker"] if row["level"] == "broker" else row["topic"]]
    if row["subscription"] is not None:
        parts.append(row["subscription"])
    return " ".join(str(p) for p in parts)


def worst_scope_lines(daily: DataFrame, limit: int = 10) -> list[str]:
    rows = worst_scopes(daily, limit).collect()  # at most `limit` rows
    if not rows:
        return ["dispatch: no scope over quota or starved"]
    lines = ["dispatch, worst scopes (periods over / excess msgs, bytes / max debt msgs, bytes / starved / main cause):"]
    for r in rows:
        lines.append(
            f"  {_scope_label(r)}: {r['periods_over']}/{r['periods']} over, "
            f"excess {r['excess_msgs']} msgs {r['excess_bytes']} B, "
            f"max debt {r['max_debt_msgs']} msgs {r['max_debt_bytes']} B, "
            f"{r['periods_starved']} starved, cause {r['main_cause'] or '-'}"
        )
    return lines
