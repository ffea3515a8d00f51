"""`make bench`: speed and memory of the dispatch stages at scale, against reference points.

For each size (a generated day of one-second throttling periods for broker, topic-partition
and subscription scopes), on the same Parquet input:

* ``plain_pass``: read, repartition by scope, sort by period within partitions, write
  Parquet. The floor for any computation that needs each scope's periods in order.
* ``dispatch_periods``: the gold computation (``brokerlens.dispatch.dispatch_periods``).
* ``duckdb``: the same over-delivery and debt computation in DuckDB SQL (dense period grid,
  running sum and running minimum: Lindley's recursion), same cores, output also to Parquet.
* ``prototype_single_shuffle``: PROTOTYPE of a one-shuffle debt computation (records only
  through the window, gap periods generated afterwards), measured here so it can move into
  ``dispatch.py``.

Then three consecutive days through the real table layer (is day N+1 slower as history
accumulates?) and the landing stage on demo data. Results: ``var/bench/results.json``.

Memory: peak RSS of the driver JVM (in ``local[*]`` it also runs the tasks), of the Python
driver process and of Spark's Python workers, sampled every 0.1 s by a thread; the JVM's peak
heap use per stage from its memory pool MXBeans (reset before each stage).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

PERIODS_PER_DAY = 86_400  # ratePeriodInSecond = 1 (Pulsar's default)
SUBSCRIPTIONS_PER_PARTITION = 3
PARTITIONS_PER_BROKER = 4
PARTITIONS_PER_TOPIC = 4
# Partitions per size: 4 times more each step. Scopes = partitions x (3 subscriptions + the
# partition itself) + brokers; 86,400 one-second periods each.
DEFAULT_SIZES = (2, 8, 32)
CLUSTER = "bench"
SCOPE = ["level", "cluster", "broker", "topic", "subscription"]


# ------------------------------------------------------------------------------- generator


@dataclass(frozen=True)
class Topology:
    partitions: int

    @property
    def brokers(self) -> int:
        return -(-self.partitions // PARTITIONS_PER_BROKER)

    @property
    def scopes(self) -> int:
        return self.partitions * (SUBSCRIPTIONS_PER_PARTITION + 1) + self.brokers

    @property
    def period_rows(self) -> int:
        return self.scopes * PERIODS_PER_DAY

    def topic(self, p: int) -> str:
        t, i = divmod(p, PARTITIONS_PER_TOPIC)
        return f"persistent://bench/ns{t % 4}/orders-{t}-partition-{i}"

    def broker(self, p: int) -> str:
        return f"broker-{p // PARTITIONS_PER_BROKER}.bench:8080"


def _day_start_us(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()) * 1_000_000


def _strings(values: list[str | None], index: np.ndarray) -> pa.Array:
    """A string column from a small dictionary and an index per row (no per-row Python)."""
    dictionary = pa.array(values, pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), dictionary).cast(pa.string())


def _const(value: str, n: int) -> pa.Array:
    return _strings([value], np.zeros(n, np.int32))


def generate_day(day: date, partitions: int, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """One day of silver ``dispatch_intervals`` (period grain) and ``rate_limits``.

    Subscriptions deliver below their quota most of the time, with gaps (idle seconds and
    idle stretches of up to an hour) and bursts over quota (batch entries, reads sized by
    ``dispatcherMaxReadBatchSize``); a partition's topic-level delivery is the sum of its
    subscriptions', a broker's the sum of its partitions'. Half the partitions change their
    subscription quota at a period start during the day; a third have a byte limit.
    Rows are ordered by scope, then period (the layout silver writes).
    """
    topo = Topology(partitions)
    rng = np.random.default_rng([seed, day.toordinal(), partitions])
    T = PERIODS_PER_DAY
    P, S = partitions, SUBSCRIPTIONS_PER_PARTITION
    n_sub = P * S
    t = np.arange(T)

    # Quotas per partition (subscription level); topic level 3 x that, broker 0.8 x its topics'.
    q_sub = rng.choice([100, 500, 1000, 2000], size=P)
    change_at = np.where(rng.random(P) < 0.5, rng.integers(6 * 3600, 18 * 3600, size=P), T)
    q_sub_after = np.where(change_at < T, q_sub * rng.choice([0.5, 2.0], size=P), q_sub).astype(np.int64)
    # Subscriptions of a partition read the same entries: one message size and batch size.
    part_size = rng.integers(100, 4000, size=P)
    avg_size = np.repeat(part_size, S)
    batch = np.repeat(rng.choice([1, 5, 20, 100], size=P), S)

    quota_per_sub = np.where(t[None, :] < change_at[:, None], q_sub[:, None], q_sub_after[:, None])
    quota_per_sub = np.repeat(quota_per_sub, S, axis=0)  # (n_sub, T)
    rate = quota_per_sub * rng.uniform(0.3, 0.9, size=(n_sub, 1))
    msgs = rng.poisson(rate)
    burst = rng.random((n_sub, T)) < 0.03
    msgs = np.where(burst, (quota_per_sub * rng.uniform(1.05, 3.0, size=(n_sub, T))).astype(np.int64), msgs)
    idle = rng.random((n_sub, T)) < 0.08
    starts = rng.integers(0, T, size=(n_sub, 2))
    lengths = rng.integers(60, 3600, size=(n_sub, 2))
    for k in range(2):
        idle |= (t[None, :] >= starts[:, k : k + 1]) & (t[None, :] < starts[:, k : k + 1] + lengths[:, k : k + 1])
    msgs = np.where(idle, 0, msgs).astype(np.int64)
    entries = -(-msgs // batch[:, None])
    nbytes = (msgs * avg_size[:, None] * rng.lognormal(0.0, 0.1, size=(n_sub, T))).astype(np.int64)
    redelivered = rng.binomial(msgs, np.where(rng.random(n_sub) < 0.2, 0.02, 0.0)[:, None])
    del rate, burst, idle, quota_per_sub

    def up(a: np.ndarray, groups: int) -> np.ndarray:
        return a.reshape(groups, -1, T).sum(axis=1)

    broker_pad = topo.brokers * PARTITIONS_PER_BROKER - P  # last broker may hold fewer partitions

    def to_broker(a: np.ndarray) -> np.ndarray:
        return up(np.concatenate([a, np.zeros((broker_pad, T), np.int64)]), topo.brokers)

    levels = []
    for level, m, e, b, r in (
        ("subscription", msgs, entries, nbytes, redelivered),
        ("topic", up(msgs, P), up(entries, P), up(nbytes, P), up(redelivered, P)),
    ):
        levels.append((level, m, e, b, r))
    _, tm, te, tb, tr = levels[1]
    levels.append(("broker", to_broker(tm), to_broker(te), to_broker(tb), to_broker(tr)))

    names_broker = [topo.broker(p) for p in range(P)]
    names_topic = [topo.topic(p) for p in range(P)]
    day_us = _day_start_us(day)
    parts = []
    for level, m, e, b, r in levels:
        scope, period = np.nonzero(m > 0)  # an exporter has no record for an idle scope
        n = len(scope)
        if level == "subscription":
            part = scope // S
            broker, topic = _strings(names_broker, part), _strings(names_topic, part)
            subscription = _strings([f"sub-{k}" for k in range(S)], scope % S)
        elif level == "topic":
            broker, topic = _strings(names_broker, scope), _strings(names_topic, scope)
            subscription = pa.nulls(n, pa.string())
        else:
            broker = _strings([topo.broker(k * PARTITIONS_PER_BROKER) for k in range(topo.brokers)], scope)
            topic = subscription = pa.nulls(n, pa.string())
        parts.append(
            pa.table(
                {
                    "day": pa.array(np.full(n, day.toordinal() - date(1970, 1, 1).toordinal(), np.int32), pa.date32()),
                    "level": _const(level, n),
                    "cluster": _const(CLUSTER, n),
                    "broker": broker,
                    "topic": topic,
                    "subscription": subscription,
                    "interval_start": pa.array(day_us + period * 1_000_000, pa.timestamp("us", tz="UTC")),
                    "interval_seconds": pa.array(np.ones(n)),
                    "grain": _const("period", n),
                    "msgs": pa.array(m[scope, period]),
                    "bytes": pa.array(b[scope, period]),
                    "entries": pa.array(e[scope, period]),
                    "redelivered_msgs": pa.array(r[scope, period]),
                    "source": _const("dispatch", n),
                    "counter_reset": pa.array(np.zeros(n, bool)),
                }
            )
        )
    intervals = pa.concat_tables(parts)
    limits = _limits(day, topo, q_sub, q_sub_after, change_at, part_size, rng)
    return intervals, limits


def _limits(day, topo, q_sub, q_sub_after, change_at, part_size, rng) -> pa.Table:
    day_us = _day_start_us(day)
    end_us = day_us + PERIODS_PER_DAY * 1_000_000
    byte_limited = rng.random(topo.partitions) < 1 / 3
    rows: dict[str, list] = {k: [] for k in (
        "level", "broker", "topic", "valid_from", "valid_to", "msg_limit", "byte_limit", "msg_source", "byte_source")}

    def add(level, broker, topic, start, end, msg_limit, byte_limit, source):
        for key, value in zip(rows, (level, broker, topic, start, end, msg_limit, byte_limit, source,
                                     source if byte_limit is not None else "default")):
            rows[key].append(value)

    for p in range(topo.partitions):
        topic = topo.topic(p)
        q0, q1, at = int(q_sub[p]), int(q_sub_after[p]), int(change_at[p])
        byte0 = int(q0 * part_size[p] * 1.2) if byte_limited[p] else None
        if at < PERIODS_PER_DAY:
            add("subscription", None, topic, day_us, day_us + at * 1_000_000, q0, byte0, "namespace-policy")
            byte1 = int(q1 * part_size[p] * 1.2) if byte_limited[p] else None
            add("subscription", None, topic, day_us + at * 1_000_000, end_us, q1, byte1, "topic-policy")
        else:
            add("subscription", None, topic, day_us, end_us, q0, byte0, "namespace-policy")
        add("topic", None, topic, day_us, end_us, 3 * max(q0, q1), None, "broker-config")
    for b in range(topo.brokers):
        held = range(b * PARTITIONS_PER_BROKER, min(topo.partitions, (b + 1) * PARTITIONS_PER_BROKER))
        quota = int(0.8 * sum(3 * max(q_sub[p], q_sub_after[p]) for p in held))
        add("broker", topo.broker(b * PARTITIONS_PER_BROKER), None, day_us, end_us, quota, None, "broker-config")
    n = len(rows["level"])
    return pa.table(
        {
            "day": pa.array([day] * n, pa.date32()),
            "level": pa.array(rows["level"], pa.string()),
            "cluster": pa.array([CLUSTER] * n, pa.string()),
            "broker": pa.array(rows["broker"], pa.string()),
            "topic": pa.array(rows["topic"], pa.string()),
            "valid_from": pa.array(rows["valid_from"], pa.timestamp("us", tz="UTC")),
            "valid_to": pa.array(rows["valid_to"], pa.timestamp("us", tz="UTC")),
            "msg_limit": pa.array(rows["msg_limit"], pa.int64()),
            "byte_limit": pa.array(rows["byte_limit"], pa.int64()),
            "period_seconds": pa.array([1] * n, pa.int32()),
            "count_entries": pa.array([False] * n),
            "relative_to_publish_rate": pa.array([False] * n),
            "msg_source": pa.array(rows["msg_source"], pa.string()),
            "byte_source": pa.array(rows["byte_source"], pa.string()),
        }
    )


def write_input(folder: Path, day: date, partitions: int, files: int = 4) -> dict[str, list[str]]:
    """The generated day as Parquet: intervals split by scope into ``files`` files, and limits."""
    intervals, limits = generate_day(day, partitions)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[str]] = {"intervals": [], "limits": []}
    step = -(-intervals.num_rows // files)
    for i in range(files):
        path = folder / f"dispatch_intervals-{i}.parquet"
        pq.write_table(intervals.slice(i * step, step), path, compression="zstd", row_group_size=1 << 20)
        out["intervals"].append(str(path))
    path = folder / "rate_limits.parquet"
    pq.write_table(limits, path)
    out["limits"].append(str(path))
    return out


# ---------------------------------------------------------------------------------- memory


class MemorySampler:
    """Peak RSS of this process, of the driver JVM and of Spark's Python workers.

    A daemon thread samples the process tree every ``interval`` seconds; ``reset`` starts a
    new stage. Workers are summed per sample (their peak together, not each one's).
    """

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.me = psutil.Process()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.reset()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with getattr(self, "_lock", threading.Lock()):
            self.peak = {"python_driver_rss_mb": 0.0, "jvm_rss_mb": 0.0, "python_workers_rss_mb": 0.0}

    def _sample(self) -> None:
        driver = self.me.memory_info().rss
        jvm = workers = 0
        for proc in self.me.children(recursive=True):
            try:
                name = proc.name()
                rss = proc.memory_info().rss
                if name == "java":
                    jvm += rss
                elif name.startswith("python"):
                    workers += rss
            except psutil.Error:
                continue  # a worker that just exited
        mb = 1 / 2**20
        with self._lock:
            for key, value in (("python_driver_rss_mb", driver), ("jvm_rss_mb", jvm), ("python_workers_rss_mb", workers)):
                self.peak[key] = max(self.peak[key], round(value * mb, 1))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def snapshot(self) -> dict[str, float]:
        self._sample()
        with self._lock:
            return dict(self.peak)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _heap_pools(spark):
    jvm = spark.sparkContext._jvm
    pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    return [p for p in pools if str(p.getType().toString()) == "Heap memory"]


def _reset_heap_peak(spark) -> None:
    spark.sparkContext._jvm.java.lang.System.gc()
    for pool in _heap_pools(spark):
        pool.resetPeakUsage()


def _heap_peak_mb(spark) -> dict[str, float]:
    """Peak heap use since the last reset: all pools summed (an upper bound of the peak of the
    sum) and the old generation alone (what survived young collections: retained memory)."""
    total = old = 0
    for pool in _heap_pools(spark):
        used = pool.getPeakUsage().getUsed()
        total += used
        if "Old" in str(pool.getName()) or "Tenured" in str(pool.getName()):
            old += used
    return {"jvm_heap_peak_mb": round(total / 2**20, 1), "jvm_old_gen_peak_mb": round(old / 2**20, 1)}


# ---------------------------------------------------------------------------------- stages


def plain_pass(spark, inputs: dict, out: Path, partitions: int) -> int:
    """Read, shuffle by scope, sort by period within partitions, write: the floor."""
    df = spark.read.parquet(*inputs["intervals"])
    df.repartition(partitions, *SCOPE).sortWithinPartitions(*SCOPE, "interval_start").write.mode(
        "overwrite"
    ).parquet(str(out))
    return spark.read.parquet(str(out)).count()


BIG = 1 << 40  # an unlimited quota in the running sums: any debt drains in one period

DUCKDB_SQL = """
COPY (
WITH iv0 AS (
  SELECT level, cluster, broker, topic, subscription, epoch_us(interval_start) AS t,
         msgs, bytes, entries
  FROM read_parquet($intervals)),
lim AS (
  SELECT level, cluster, broker, topic, epoch_us(valid_from) AS f, epoch_us(valid_to) AS e,
         period_seconds::BIGINT * 1000000 AS step, msg_limit, byte_limit, count_entries
  FROM read_parquet($limits)),
scopes AS (  -- an integer id per scope: windows partition by it instead of five strings
  SELECT row_number() OVER () AS sid, *
  FROM (SELECT DISTINCT level, cluster, broker, topic, subscription FROM iv0)),
iv AS (
  SELECT s.sid, i.t, i.msgs, i.bytes, i.entries
  FROM iv0 i JOIN scopes s
    ON i.level = s.level AND i.cluster = s.cluster AND i.broker IS NOT DISTINCT FROM s.broker
   AND i.topic IS NOT DISTINCT FROM s.topic AND i.subscription IS NOT DISTINCT FROM s.subscription),
grid AS (  -- every period of the day for every scope: no record = nothing delivered
  SELECT s.sid, l.msg_limit, l.byte_limit, l.count_entries,
         coalesce(o.debt_msgs, 0) AS d0_msgs, coalesce(o.debt_bytes, 0) AS d0_bytes,
         unnest(range(l.f, l.e, l.step)) AS t
  FROM scopes s
  JOIN lim l
    ON l.level = s.level AND l.cluster = s.cluster
   AND CASE WHEN s.level = 'broker' THEN l.broker = s.broker ELSE l.topic = s.topic END
  LEFT JOIN read_parquet($opening) o
    ON o.level = s.level AND o.cluster = s.cluster AND o.broker IS NOT DISTINCT FROM s.broker
   AND o.topic IS NOT DISTINCT FROM s.topic AND o.subscription IS NOT DISTINCT FROM s.subscription),
periods AS (
  SELECT g.*, coalesce(i.msgs, 0) AS msgs, coalesce(i.bytes, 0) AS bytes,
         coalesce(i.entries, 0) AS entries,
         coalesce(CASE WHEN g.count_entries THEN i.entries ELSE i.msgs END, 0) AS counted,
         counted - coalesce(g.msg_limit, {big}) AS x_msgs,
         coalesce(i.bytes, 0) - coalesce(g.byte_limit, {big}) AS x_bytes
  FROM grid g LEFT JOIN iv i ON i.sid = g.sid AND i.t = g.t),
running AS (  -- S_t = sum of (delivered - q) up to t
  SELECT *, sum(x_msgs) OVER w::BIGINT AS s_msgs, sum(x_bytes) OVER w::BIGINT AS s_bytes
  FROM periods
  WINDOW w AS (PARTITION BY sid ORDER BY t ROWS UNBOUNDED PRECEDING)),
debt AS (  -- Lindley: debt_t = S_t - min(-opening debt, min_{{k<=t}} S_k)
  SELECT *,
    s_msgs - least(-d0_msgs, min(s_msgs) OVER upto) AS debt_out_msgs,
    s_bytes - least(-d0_bytes, min(s_bytes) OVER upto) AS debt_out_bytes,
    s_msgs - x_msgs - least(-d0_msgs, coalesce(min(s_msgs) OVER before, 0)) AS debt_in_msgs,
    s_bytes - x_bytes - least(-d0_bytes, coalesce(min(s_bytes) OVER before, 0)) AS debt_in_bytes
  FROM running
  WINDOW upto AS (PARTITION BY sid ORDER BY t ROWS UNBOUNDED PRECEDING),
         before AS (PARTITION BY sid ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
SELECT s.level, s.cluster, s.broker, s.topic, s.subscription, make_timestamp(d.t) AS period_start,
       msg_limit AS quota_msgs, byte_limit AS quota_bytes,
       msgs AS delivered_msgs, bytes AS delivered_bytes, entries AS delivered_entries,
       counted AS counted_msgs,
       CASE WHEN msg_limit IS NULL THEN 0 ELSE debt_in_msgs END AS debt_in_msgs,
       greatest(0, msg_limit - debt_in_msgs) AS allowed_msgs,
       CASE WHEN msg_limit IS NULL THEN 0
            ELSE greatest(0, counted - greatest(0, msg_limit - debt_in_msgs)) END AS over_msgs,
       CASE WHEN msg_limit IS NULL THEN 0 ELSE debt_out_msgs END AS debt_out_msgs,
       CASE WHEN byte_limit IS NULL THEN 0 ELSE debt_in_bytes END AS debt_in_bytes,
       greatest(0, byte_limit - debt_in_bytes) AS allowed_bytes,
       CASE WHEN byte_limit IS NULL THEN 0
            ELSE greatest(0, bytes - greatest(0, byte_limit - debt_in_bytes)) END AS over_bytes,
       CASE WHEN byte_limit IS NULL THEN 0 ELSE debt_out_bytes END AS debt_out_bytes
FROM debt d JOIN scopes s USING (sid)
) TO '{out}' (FORMAT parquet, COMPRESSION zstd)
""".format(big=BIG, out="{out}")


def duckdb_dispatch(inputs: dict, opening: str, out: Path, threads: int) -> int:
    """The over-delivery and debt computation in DuckDB SQL over the same Parquet files."""
    import duckdb

    out.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute(f"SET threads = {threads}")
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
        con.execute(
            DUCKDB_SQL.replace("{out}", str(out).replace("'", "''")),
            {"intervals": inputs["intervals"], "limits": inputs["limits"], "opening": opening},
        )
        return con.execute("SELECT count(*) FROM read_parquet($p)", {"p": str(out)}).fetchone()[0]
    finally:
        con.close()


# --------------------------------------------------------------- prototype for dispatch.py


def prototype_dispatch_periods(intervals, limits, opening):
    """PROTOTYPE, for the lead to move into ``dispatch.py``: per-period debt with ONE shuffle.

    The dense grid (86,400 periods per scope) is never joined or shuffled. Only the day's
    records go through one exchange by scope and one sort by period; the running sum and
    running minimum (Lindley) are taken over records, with the quota of the periods in
    between drained in closed form through the cumulative quota ``Q(t)``; the gap periods
    are generated afterwards (``explode(sequence(...))``) from the neighbouring records.

    * ``Q(t)`` (quota summed over the periods up to and including ``t``) comes from a small
      array of limit segments per limit key, attached by a broadcast join: no range join.
    * Between records S falls (nothing delivered), so the minimum of S over a gap is at its
      last period: ``S_t - counted_t + q_t``. Running min over records of
      ``least(S_t, S_t - counted_t + q_t)`` is the running min over all periods.
    * A gap period ``k`` after a record with closing debt ``d`` and cumulative quota ``Q_p``
      starts with ``debt_in = max(0, d - (Q(k - 1) - Q_p))``.

    Input: silver ``dispatch_intervals`` (period grain) and ``rate_limits`` of one day, and the
    opening debt per scope (``level, cluster, broker, topic, subscription, debt_msgs,
    debt_bytes``). Output: one row per scope and period, the columns of ``DUCKDB_SQL``.
    Assumes one ``ratePeriodInSecond`` per scope per day and limits covering the day.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col, lit = F.col, F.lit
    lim_key = F.when(col("level") == "broker", col("broker")).otherwise(col("topic"))
    before = Window.partitionBy("level", "cluster", "lim_key").orderBy("f").rowsBetween(
        Window.unboundedPreceding, -1
    )
    segments = (
        limits.select(
            "level",
            "cluster",
            lim_key.alias("lim_key"),
            F.unix_micros("valid_from").alias("f"),
            F.unix_micros("valid_to").alias("e"),
            (col("period_seconds").cast("long") * 1_000_000).alias("step"),
            F.coalesce("msg_limit", lit(BIG)).alias("qm"),
            F.coalesce("byte_limit", lit(BIG)).alias("qb"),
            "msg_limit",
            "byte_limit",
            "count_entries",
        )
        .withColumn("n", F.floor((col("e") - col("f")) / col("step")))
        .withColumn("qm0", F.coalesce(F.sum(col("qm") * col("n")).over(before), lit(0)))
        .withColumn("qb0", F.coalesce(F.sum(col("qb") * col("n")).over(before), lit(0)))
        .groupBy("level", "cluster", "lim_key")
        .agg(
            F.sort_array(
                F.collect_list(
                    F.struct("f", "e", "step", "qm", "qb", "qm0", "qb0", "msg_limit", "byte_limit", "count_entries")
                )
            ).alias("segs")
        )
    )
    opening = opening.select(*[col(c).alias(f"o_{c}") for c in SCOPE], "debt_msgs", "debt_bytes")
    records = (
        intervals.select(
            *SCOPE,
            lim_key.alias("lim_key"),
            F.unix_micros("interval_start").alias("t"),
            F.unix_micros(col("day").cast("timestamp")).alias("day_start"),
            "msgs",
            "bytes",
            "entries",
        )
        .join(F.broadcast(segments), ["level", "cluster", "lim_key"], "left")
        .join(
            F.broadcast(opening),
            [col(c).eqNullSafe(col(f"o_{c}")) for c in SCOPE],
            "left",
        )
    )

    def seg_at(x):
        return F.element_at(F.filter("segs", lambda s: (s["f"] <= x) & (x < s["e"])), 1)

    def cumulative(seg, x, q, q0):  # Q(x): quota of every period up to and including x
        return seg[q0] + seg[q] * (F.floor((x - seg["f"]) / seg["step"]) + 1)

    by_scope = Window.partitionBy(*SCOPE).orderBy("t")
    upto = by_scope.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    d0m, d0b = F.coalesce("debt_msgs", lit(0)), F.coalesce("debt_bytes", lit(0))
    rec = (
        records.withColumn("seg", seg_at(col("t")))
        .withColumn("counted", F.when(col("seg.count_entries"), col("entries")).otherwise(col("msgs")))
        .withColumn("Qm", cumulative(col("seg"), col("t"), "qm", "qm0"))
        .withColumn("Qb", cumulative(col("seg"), col("t"), "qb", "qb0"))
        .withColumn("Sm", F.sum("counted").over(upto) - col("Qm"))
        .withColumn("Sb", F.sum("bytes").over(upto) - col("Qb"))
        .withColumn("mm", F.min(F.least(col("Sm"), col("Sm") - col("counted") + col("seg.qm"))).over(upto))
        .withColumn("mb", F.min(F.least(col("Sb"), col("Sb") - col("bytes") + col("seg.qb"))).over(upto))
        .withColumn("debt_m", col("Sm") - F.least(-d0m, col("mm")))
        .withColumn("debt_b", col("Sb") - F.least(-d0b, col("mb")))
        .withColumn("t_prev", F.coalesce(F.lag("t").over(by_scope), col("day_start") - col("seg.step")))
        .withColumn("seg_prev", F.lag("seg").over(by_scope))
        .withColumn("Qm_prev", F.coalesce(F.lag("Qm").over(by_scope), lit(0)))
        .withColumn("Qb_prev", F.coalesce(F.lag("Qb").over(by_scope), lit(0)))
        .withColumn("debt_m_prev", F.coalesce(F.lag("debt_m").over(by_scope), d0m))
        .withColumn("debt_b_prev", F.coalesce(F.lag("debt_b").over(by_scope), d0b))
        .withColumn(
            "t_last",
            F.when(F.lead("t").over(by_scope).isNull(), col("day_start") + PERIODS_PER_DAY * 1_000_000 - col("seg.step"))
            .otherwise(col("t")),
        )
    )
    k = col("k")
    after = k > col("t")  # trailing periods after the day's last record
    base_seg = F.when(after, col("seg")).when(k == col("t"), col("seg")).otherwise(col("seg_prev"))
    periods = (
        rec.withColumn("k", F.explode(F.sequence(col("t_prev") + col("seg.step"), col("t_last"), col("seg.step"))))
        .withColumn("sk", F.when(base_seg.isNotNull() & (k < base_seg["e"]), base_seg).otherwise(seg_at(k)))
        .withColumn("here", k == col("t"))
    )
    out = [*SCOPE, F.timestamp_micros(k).alias("period_start"),
           col("sk.msg_limit").alias("quota_msgs"), col("sk.byte_limit").alias("quota_bytes")]
    delivered = {
        "delivered_msgs": F.when(col("here"), col("msgs")).otherwise(0),
        "delivered_bytes": F.when(col("here"), col("bytes")).otherwise(0),
        "delivered_entries": F.when(col("here"), col("entries")).otherwise(0),
        "counted_msgs": F.when(col("here"), col("counted")).otherwise(0),
    }
    out += [v.alias(n) for n, v in delivered.items()]
    for unit, q, q0, limit, counted in (
        ("msgs", "qm", "qm0", "msg_limit", "counted_msgs"),
        ("bytes", "qb", "qb0", "byte_limit", "delivered_bytes"),
    ):
        s = unit[0]
        base_debt = F.when(after, col(f"debt_{s}")).otherwise(col(f"debt_{s}_prev"))
        base_q = F.when(after, col(f"Q{s}")).otherwise(col(f"Q{s}_prev"))
        drained = cumulative(col("sk"), k, q, q0) - col(f"sk.{q}") - base_q  # Q(k - 1) - Q_base
        debt_in = F.greatest(lit(0), base_debt - drained)
        allowed = F.greatest(lit(0), col(f"sk.{limit}") - debt_in)
        unlimited = col(f"sk.{limit}").isNull()
        out += [
            F.when(unlimited, 0).otherwise(debt_in).alias(f"debt_in_{unit}"),
            allowed.alias(f"allowed_{unit}"),
            F.when(unlimited, 0).otherwise(F.greatest(lit(0), delivered[counted] - allowed)).alias(f"over_{unit}"),
            F.when(unlimited, 0)
            .otherwise(F.greatest(lit(0), debt_in + delivered[counted] - col(f"sk.{q}")))
            .alias(f"debt_out_{unit}"),
        ]
    return periods.select(*out)
