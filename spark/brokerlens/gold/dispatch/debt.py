"""Gold ``debt_state``: each dispatch scope's limiter debt at midnight after the day, drained from
the scope's last period through the empty periods to midnight; the next day starts from it."""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .limits import MEASURES, US, limit_timeline, quota_until, round_half_up, with_limit
from .models import CLASSIC, TOKEN_BUCKETS
from .scopes import SCOPE, scope_join


def closing_debt(
    periods: DataFrame,
    limits: DataFrame,
    opening_debt: DataFrame | None,
    day: date,
) -> DataFrame:
    """``debt_state`` rows for ``day``: each scope's debt at midnight after ``day``.

    From the scope's last row of the day, the debt drains through the empty periods up to
    midnight (to 0 if a stretch without limit comes in between). Scopes that only carried
    opening debt drain through the whole day. Scopes of the day are all written (debt 0
    included), so a built day always has its partition.
    """
    timeline = limit_timeline(limits)
    # Each scope's last row: an aggregate, combined within each task before the shuffle (a
    # window would sort every period of the day by scope and time).
    last_values = F.struct(
        (F.unix_micros("period_start") + round_half_up(F.col("interval_seconds") * US)).alias("at_us"),
        *[F.coalesce(F.col(f"{m}_limit") - F.col(f"tokens_out_{name}"), F.col(f"debt_out_{name}")).alias(f"debt_{name}") for name, m in MEASURES],
        F.col("period_start").alias("last_period_start"),
        F.col("limiter_model").alias("limiter_model"),
    )
    last = periods.groupBy(*SCOPE).agg(F.max_by(last_values, "period_start").alias("_last")).select(*SCOPE, "_last.*")
    midnight_start = F.unix_micros(F.to_timestamp(F.lit(day.isoformat())))
    if opening_debt is not None:
        carried = scope_join(opening_debt, last.select(*SCOPE), "left_anti")
        last = last.unionByName(
            carried.select(
                *SCOPE,
                midnight_start.alias("at_us"),
                "debt_msgs",
                "debt_bytes",
                F.lit(None).cast("timestamp").alias("last_period_start"),
                F.coalesce("limiter_model", F.lit(CLASSIC)).alias("limiter_model"),
            )
        )
    end_us = (day + timedelta(days=1) - date(1970, 1, 1)).days * 86_400 * US
    joined = with_limit(last, timeline, "at_us", "a_").withColumn("_end_us", F.lit(end_us))
    joined = with_limit(joined, timeline, "_end_us", "e_")
    out = joined
    for name, m in MEASURES:
        tb = F.col("limiter_model").isin(*TOKEN_BUCKETS)
        reset = (
            F.col(f"a_{m}_q").isNull()
            | F.col(f"e_{m}_q").isNull()
            | F.when(tb, F.col(f"e_{m}_seg_tb") != F.col(f"a_{m}_seg_tb")).otherwise(F.col(f"e_{m}_seg") != F.col(f"a_{m}_seg"))
        )
        drain = quota_until(m, F.col("_end_us"), "e_") - quota_until(m, F.col("at_us"), "a_")
        out = out.withColumn(
            f"debt_{name}",
            F.when(reset, F.lit(0)).otherwise(F.greatest(F.lit(0), F.col(f"debt_{name}") - F.greatest(F.lit(0), drain))),
        )
    return out.select(F.lit(day).cast("date").alias("day"), *SCOPE, "debt_msgs", "debt_bytes", "last_period_start", "limiter_model")
