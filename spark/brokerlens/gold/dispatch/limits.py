"""Dispatch rate limits over time: ``rate_limits`` as a timeline per limit scope with the quota
(msgs and bytes per ``ratePeriodInSecond``) integrated over time, and the joins that read the
limit in force and the quota up to an instant."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

# Measures: (prefix used in column names, limit column in rate_limits, delivered amount column).
MEASURES = (("msgs", "msg"), ("bytes", "byte"))
US = 1_000_000


def limit_timeline(limits: DataFrame) -> DataFrame:
    """rate_limits as a timeline per limit scope, with the quota integrated over time.

    One row per limit scope (``lk_level, lk_cluster, lk_key``: the broker at broker level, the
    topic partition at topic and subscription level) and effective start (``eff_from_us``,
    ``valid_from`` rounded up to the period grid; of two changes within one period the later
    one is in force at the period start). ``eff_to_us`` is the next start, null for the last row
    (which stays in force). ``{m}_cum``: quota of all periods before ``eff_from_us``;
    ``{m}_seg``: number of unlimited rows so far (inclusive).

    ``scrape_from_us`` / ``scrape_to_us``: where a snapshot interval (grain scrape) finds the row
    in force. A limit that follows a row without limit is in force from ``valid_from`` itself:
    collect dates such a change when it first saw it, so the broker's new limiter was running by
    then, and an interval that starts between that instant and the next period start is judged
    by it (its quota reaches back before ``eff_from_us``; the row without limit before it leaves
    no debt to carry). Any other change stays on the period grid.
    """
    p_us = F.col("period_seconds").cast("long") * F.lit(US)
    key = ["lk_level", "lk_cluster", "lk_key"]
    staged = (
        limits.select(
            F.col("level").alias("lk_level"),
            F.col("cluster").alias("lk_cluster"),
            F.when(F.col("level") == "broker", F.col("broker")).otherwise(F.col("topic")).alias("lk_key"),
            F.unix_micros("valid_from").alias("from_us"),
            F.greatest(F.col("period_seconds"), F.lit(1)).alias("period_seconds"),
            "count_entries",
            F.when(F.col("msg_limit") > 0, F.col("msg_limit")).alias("msg_q"),
            F.when(F.col("byte_limit") > 0, F.col("byte_limit")).alias("byte_q"),
            "msg_source",
            "byte_source",
        )
        .withColumn("p_us", p_us)
        .withColumn("eff_from_us", F.expr("(from_us + p_us - 1) div p_us * p_us"))
    )
    latest = Window.partitionBy(*key, "eff_from_us").orderBy(F.col("from_us").desc())
    ordered = Window.partitionBy(*key).orderBy("eff_from_us")
    unlimited = F.col("msg_q").isNull() & F.col("byte_q").isNull()
    staged = (
        staged.withColumn("_rank", F.row_number().over(latest))
        .where("_rank = 1")
        .withColumn("eff_to_us", F.lead("eff_from_us").over(ordered))
        .withColumn("_rn", F.row_number().over(ordered))
        .withColumn("scrape_from_us", F.when(F.coalesce(F.lag(unlimited).over(ordered), F.lit(False)), F.col("from_us")).otherwise(F.col("eff_from_us")))
        .withColumn("scrape_to_us", F.lead("scrape_from_us").over(ordered))
    )
    before = ordered.rowsBetween(Window.unboundedPreceding, -1)
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    for _, m in MEASURES:
        span = F.when(
            F.col(f"{m}_q").isNotNull() & F.col("eff_to_us").isNotNull(),
            _prorate(F.col(f"{m}_q"), F.col("eff_to_us") - F.col("eff_from_us"), F.col("p_us")),
        ).otherwise(F.lit(0))
        staged = (
            staged.withColumn(f"{m}_cum", F.coalesce(F.sum(span).over(before), F.lit(0)).cast("long"))
            .withColumn(
                f"{m}_seg",
                F.sum(F.col(f"{m}_q").isNull().cast("int")).over(upto).cast("long"),
            )
            .withColumn(
                # Token bucket: every rate change builds a new, full bucket. The scope's first row
                # (the limit in force at midnight) is carried over, not a change.
                f"{m}_seg_tb",
                F.sum((F.col(f"{m}_q").isNull() | (F.col("_rn") > 1)).cast("int")).over(upto).cast("long"),
            )
        )
    return staged.drop("_rank", "_rn", "from_us")


def round_half_up(value: Column) -> Column:
    """A non-negative double to the nearest whole number, half up (as Spark's ``round``, which
    goes through BigDecimal: slower than the rest of the row's arithmetic together)."""
    return F.floor(value + F.lit(0.5)).cast("long")


def _prorate(quota: Column, micros: Column, p_us: Column) -> Column:
    """quota × micros / p_us: exact in whole periods; a partial period (scrape grain) rounds
    half up to whole units."""
    rest = micros % p_us
    partial = F.when(rest != 0, round_half_up(quota * rest / p_us)).otherwise(F.lit(0))
    whole = ((micros - rest) / p_us).cast("long")  # an exact multiple: the double quotient is exact
    return (quota * whole + partial).cast("long")


def with_limit(df: DataFrame, timeline: DataFrame, at_us: str, prefix: str, scrape: Column | None = None) -> DataFrame:
    """Join the limit row in force at ``df[at_us]`` (columns renamed with ``prefix``); where
    ``scrape`` holds, the row in force for a snapshot interval (``scrape_from_us``).

    The limit table is small (limits × changes): broadcast, so the big side is not shuffled.
    No row in force (no rate_limits for the scope): the limit columns are null = unlimited.
    """
    t = timeline.select(*[F.col(c).alias(prefix + c) for c in timeline.columns])
    start, end = t[prefix + "eff_from_us"], t[prefix + "eff_to_us"]
    if scrape is not None:
        start = F.when(scrape, t[prefix + "scrape_from_us"]).otherwise(start)
        end = F.when(scrape, t[prefix + "scrape_to_us"]).otherwise(end)
    cond = (
        (df["level"] == t[prefix + "lk_level"])
        & (df["cluster"] == t[prefix + "lk_cluster"])
        & (F.when(df["level"] == "broker", df["broker"]).otherwise(df["topic"]) == t[prefix + "lk_key"])
        & (start <= df[at_us])
        & (end.isNull() | (df[at_us] < end))
    )
    return df.join(F.broadcast(t), cond, "left")


def quota_until(m: str, at_us: Column, prefix: str) -> Column:
    """Q(t): quota of all periods of the limit scope before ``at_us``, using the joined row."""
    q = F.col(f"{prefix}{m}_q")
    inside = F.when(q.isNotNull(), _prorate(q, at_us - F.col(f"{prefix}eff_from_us"), F.col(f"{prefix}p_us"))).otherwise(F.lit(0))
    return F.col(f"{prefix}{m}_cum") + inside
