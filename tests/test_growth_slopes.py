"""brokerlens_growth_slopes (gold/holes/GrowthSlopes.scala) against what it replaced in
cursor_ranges.with_growth: Spark's own ``count`` and ``regr_slope`` over a window's range frame,
compared as doubles, bit for bit, on random cursors: snapshots at the same instant, gaps longer
than the window, null range counts, counts near 2^40, single snapshots."""

from __future__ import annotations

import random

from pyspark.sql import Window
from pyspark.sql import functions as F

from brokerlens.gold.holes.persistence import KEY
from brokerlens.platform.jars import GROWTH_SLOPES_FUNCTION

WINDOW_US = 6 * 3_600_000_000
# Between one snapshot and the next: mostly a minute, sometimes none, an hour, the window or more.
STEPS_US = [0, 1, 30_000_000, 60_000_000, 61_234_567, 3_600_000_000, WINDOW_US, WINDOW_US + 1, 7 * 3_600_000_000]
STEP_WEIGHTS = [1, 1, 2, 40, 5, 1, 1, 1, 1]


def random_snapshots(seed: int, cursors: int) -> list[tuple]:
    rng = random.Random(seed)
    rows = []
    for c in range(cursors):
        at_us, ranges = rng.randint(0, 10**12), None
        for i in range(rng.randint(1, 300)):
            step = rng.choices(STEPS_US, STEP_WEIGHTS)[0] if i else None
            # Snapshots at one instant repeat the count: a frame folds its peers in an order
            # neither side fixes, and equal pairs give the same bits in any order.
            if step != 0:
                ranges = rng.choice([None, rng.randint(0, 20_000), rng.randint(0, 5) * 1_000, 2**40 + rng.randint(0, 9)])
            at_us += step or 0
            rows.append((f"cluster-{c % 3}", f"persistent://t/n/topic-{c}", "sub", at_us, ranges))
    return rows


def test_growth_slopes_equal_regr_slope_over_a_range_frame(spark):
    snapshots = spark.createDataFrame(random_snapshots(30, 400), "cluster string, topic string, subscription string, at_us bigint, ranges bigint")
    snapshots = snapshots.withColumn("x", (F.col("at_us") - F.lit(86_400_000_000)) / F.lit(3.6e9))
    frame = Window.partitionBy(*KEY).orderBy("at_us").rangeBetween(-WINDOW_US, 0)
    expected = snapshots.select(
        *KEY, "at_us", F.count("ranges").over(frame).cast("int").alias("growth_snapshots"), F.regr_slope("ranges", "x").over(frame).alias("slope")
    ).distinct()  # snapshots at one instant share a frame
    folded = F.call_function(GROWTH_SLOPES_FUNCTION, F.collect_list(F.struct("at_us", "x", "ranges")), F.lit(WINDOW_US).cast("bigint"))
    got = snapshots.groupBy(*KEY).agg(folded.alias("growth")).select(*KEY, F.inline("growth"))

    assert got.count() == expected.count() == snapshots.select(*KEY, "at_us").distinct().count()
    assert got.exceptAll(expected).count() == 0
    assert expected.exceptAll(got).count() == 0
    # The comparison has something to compare: slopes of every sign, and frames without one.
    counts = got.agg(
        F.sum((F.col("slope") > 0).cast("int")),
        F.sum((F.col("slope") < 0).cast("int")),
        F.sum(F.col("slope").isNull().cast("int")),
        F.max("growth_snapshots"),
    ).first()
    assert all(n > 100 for n in counts[:3]) and counts[3] > 60
