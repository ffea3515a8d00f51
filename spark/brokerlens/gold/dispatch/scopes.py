"""The dispatch scopes every table of dispatch throttling is keyed by: a subscription, a topic
partition or a broker of a cluster (``level``; topic and subscription are null above their
level), and the null-safe join on them."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

SCOPE = ["level", "cluster", "broker", "topic", "subscription"]


def scope_join(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
    """Join on the scope (null-safe: topic and subscription are null above their level).

    The right side's columns come back prefixed ``r_`` (fresh columns: both sides often derive
    from the same periods, which a plain self-join would find ambiguous)."""
    r = right.select(*[F.col(c).alias(f"r_{c}") for c in right.columns])
    cond = F.lit(True)
    for c in SCOPE:
        cond = cond & F.col(c).eqNullSafe(F.col(f"r_{c}"))
    return left.join(r, cond, how)
