"""Token buckets: limits as EMQX writes them, and conformance of an observed series.

A limit ``N[unit],D`` allows N (messages, or bytes with a unit) per duration D: the bucket holds
b = N tokens and refills at r = N / D tokens per second (``100KB,10s``: r = 10,240 B/s,
b = 102,400 B). A plain ``N`` is ``N,1s`` (r = b = N), which is also how Pulsar's
PublishRate (``publishThrottlingRateInMsg``/``InByte``, per second) behaves.
Long run, the bucket passes at most r per second; in one second at most b + r (a full bucket
emptied while r more tokens arrive).

Conformance. A limiter in front of a connection (EMQX, Pulsar publish throttling) pauses reading:
what the bucket does not allow is delayed, not dropped. With the bucket full at the start and
``S(t) = A(t) − r·t`` (A: cumulative amount observed), the token deficit is Lindley's recursion
``D(t) = S(t) − min(0, min_{s≤t} S(s))`` (the largest excess ``A(t) − A(s) − r·(t − s)`` over
any window ending at t) and the traffic the bucket would still hold back at t is
``max(0, D(t) − b)``; the bucket level is ``max(0, b − D(t))``. A series conforms exactly when
nothing is ever held back. Running sums and minima compute this with window functions, like the
dispatch debt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_ROUNDING = 1e-9
_LIMIT = re.compile(
    r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<size>[kmg]?b)?\s*"
    r"(?:,\s*(?P<d>\d+(?:\.\d+)?)?\s*(?P<unit>ms|s|m|h|d)\s*)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TokenBucket:
    rate: float  # r, tokens per second
    burst: float  # b, bucket size
    bytes: bool  # tokens are bytes (the limit had a size unit)
    text: str

    @property
    def peak(self) -> float:
        """Most the bucket lets through in one second: M = b + r."""
        return self.burst + self.rate


def parse_limit(text: str | int | float) -> TokenBucket:
    """``100,10s``, ``100KB,10s``, ``1MB,1m``, ``1000`` → rate and burst, as EMQX reads them."""
    raw = str(text)
    m = _LIMIT.match(raw)
    if not m:
        raise ValueError(f"cannot read rate limit {raw!r}: expected N[KB|MB|GB][,<duration>] such as 100,10s or 100KB,10s")
    size = (m["size"] or "").lower()
    burst = float(m["n"]) * _SIZE_UNITS[size]
    seconds = float(m["d"] or 1) * _DURATION_SECONDS[(m["unit"] or "s").lower()]
    if burst <= 0 or seconds <= 0:
        raise ValueError(f"rate limit {raw!r} must be positive")
    return TokenBucket(rate=burst / seconds, burst=burst, bytes=bool(size), text=raw.strip())


def conformance(
    df: DataFrame,
    keys: Sequence[str],
    *,
    start: str = "interval_start",
    seconds: str = "interval_seconds",
    amount: str = "observed",
    rate: str = "rate",
    burst: str = "burst",
) -> DataFrame:
    """Add ``bucket_level``, ``delayed``, ``allowed`` and ``throttled`` to a series.

    One series per ``keys`` (+ rate and burst: a changed limit starts a new, full bucket), rows
    are intervals ``[start, start + seconds)`` with ``amount`` spread evenly over each (one
    second per row for a per-second series). Time between intervals passes with nothing
    observed: the bucket refills. Within an evenly spread interval the deficit is monotone, so
    its extremes lie at interval ends, which is where the running minimum looks.
    """
    series = [*keys, rate, burst]
    ordered = Window.partitionBy(*series).orderBy(start)
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    t0 = F.min(start).over(Window.partitionBy(*series))
    r, b, a = F.col(rate), F.col(burst), F.col(amount)
    elapsed_end = (F.unix_micros(start) - F.unix_micros(t0)) / 1e6 + F.col(seconds)
    s_end = F.sum(a).over(running) - r * elapsed_end  # S at the interval's end
    s_start = F.col("_s_end") - a + r * F.col(seconds)  # S at its start (after any gap)
    deficit = F.col("_s_end") - F.least(F.lit(0.0), F.col("_s_min"), F.col("_s_end"))

    # Rounding of fractional rates must not turn an exactly conforming interval into a throttled one.
    def held_back(d: Column) -> Column:
        excess = d - b
        return F.when(excess > _ROUNDING * (b + r), excess).otherwise(F.lit(0.0))

    # Deficit at the interval's start: the previous one's, drained by r over the gap between them.
    gap = F.unix_micros(start) / 1e6 - F.lag(F.unix_micros(start) / 1e6 + F.col(seconds)).over(ordered)
    deficit_at_start = F.greatest(F.lit(0.0), F.coalesce(F.lag("_deficit").over(ordered) - r * gap, F.lit(0.0)))
    return (
        df.withColumn("_s_end", s_end)
        .withColumn("_s_min", F.min(s_start).over(running))
        .withColumn("_deficit", deficit)
        .withColumn("bucket_level", F.greatest(F.lit(0.0), b - F.col("_deficit")))
        .withColumn("delayed", held_back(F.col("_deficit")))
        .withColumn("allowed", a + held_back(deficit_at_start) - F.col("delayed"))
        .withColumn("throttled", F.col("delayed") > 0)
        .drop("_s_end", "_s_min", "_deficit")
    )
