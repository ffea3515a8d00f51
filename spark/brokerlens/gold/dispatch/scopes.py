"""The dispatch scopes every table of dispatch throttling is keyed by: a subscription, a topic
partition or a broker of a cluster (``level``; topic and subscription are null above their
level), the aggregates of one row set at every level at once, and the null-safe join on them."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

SCOPE = ["level", "cluster", "broker", "topic", "subscription"]
# Each level's keys, in SCOPE's order (a row of that level has the others null).
LEVEL_KEYS = {"subscription": SCOPE[1:], "topic": SCOPE[1:4], "broker": SCOPE[1:3]}


def scope_join(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
    """Join on the scope (null-safe: topic and subscription are null above their level).

    The right side's columns come back prefixed ``r_`` (fresh columns: both sides often derive
    from the same periods, which a plain self-join would find ambiguous)."""
    r = right.select(*[F.col(c).alias(f"r_{c}") for c in right.columns])
    cond = F.lit(True)
    for c in SCOPE:
        cond = cond & F.col(c).eqNullSafe(F.col(f"r_{c}"))
    return left.join(r, cond, how)


def per_level(rows: DataFrame, levels: dict[str, list[str]], *aggregates: Column) -> DataFrame:
    """``aggregates`` of ``rows`` grouped by each level's keys, in one aggregate over grouping
    sets (a union of an aggregate per level reads and shuffles ``rows`` once per level): a
    ``level`` column, every level's keys (null where not the row's level's), the aggregates."""
    keys = list(dict.fromkeys(k for by in levels.values() for k in by))
    # grouping_id: a bit per key, the first key's the highest, set where the key is left out.
    ids = {level: sum(1 << (len(keys) - 1 - n) for n, k in enumerate(keys) if k not in by) for level, by in levels.items()}
    grouped = rows.groupingSets(list(levels.values()), *keys).agg(F.grouping_id(*keys).alias("_level_id"), *aggregates)
    level = F.coalesce(*[F.when(F.col("_level_id") == id_, F.lit(name)) for name, id_ in ids.items()])
    return grouped.select(level.alias("level"), *[c for c in grouped.columns if c != "_level_id"])
