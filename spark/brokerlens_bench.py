"""`make bench`: speed and memory of the dispatch stages at scale, against reference points.

For each size (a generated day of one-second throttling periods for broker, topic-partition
and subscription scopes), on the same Parquet input:

* ``plain_pass``: read, repartition by scope, sort by period within partitions, write
  Parquet. The floor for any computation that needs each scope's periods in order.
* ``dispatch_periods``: the gold computation (``brokerlens.gold.dispatch.periods.dispatch_periods``).
* ``duckdb``: the same over-delivery and debt computation in DuckDB SQL (one row per record,
  empty periods drained through the integrated quota, running sum and running minimum:
  Lindley's recursion), same cores, output also to Parquet.
* at the ``variant_sizes``: dispatch_periods again under candidate Spark settings (``VARIANTS``).

Then three consecutive days through the real table layer (is day N+1 slower as history
accumulates?), the landing stage on demo data, and windows of a large cluster's generated day
(``brokerlens_bench_large``) through every daily step, projected to 50,000 partitions.
Results: ``var/bench/results.json``.

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
import re
import shutil
import socket
import subprocess
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

# Under the "brokerlens" logger, which logs.configure sets to INFO (also when run as __main__).
log = logging.getLogger("brokerlens.bench")

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


def generate_day(
    day: date, partitions: int, seed: int = 0, periods: int = PERIODS_PER_DAY
) -> tuple[pa.Table, pa.Table]:
    """One day of silver ``dispatch_intervals`` (period grain) and ``rate_limits``.

    Subscriptions deliver below their quota most of the time, with gaps (idle seconds and
    idle stretches of up to an hour) and bursts over quota (batch entries, reads sized by
    ``dispatcherMaxReadBatchSize``); a partition's topic-level delivery is the sum of its
    subscriptions', a broker's the sum of its partitions'. Half the partitions change their
    subscription quota at a period start during the day; a third have a byte limit.
    Rows are ordered by scope, then period (the layout silver writes). ``periods``: the first
    periods of the day only (tests).
    """
    topo = Topology(partitions)
    rng = np.random.default_rng([seed, day.toordinal(), partitions])
    T = periods
    P, S = partitions, SUBSCRIPTIONS_PER_PARTITION
    n_sub = P * S
    t = np.arange(T)

    # Quotas per partition (subscription level); topic level 3 x that, broker 0.8 x its topics'.
    q_sub = rng.choice([100, 500, 1000, 2000], size=P)
    change_at = np.where(rng.random(P) < 0.5, rng.integers(T // 4, 3 * T // 4, size=P), PERIODS_PER_DAY)
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
    lengths = rng.integers(T // 1440 + 1, T // 24 + 2, size=(n_sub, 2))  # 1 min to 1 h in a day
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


def write_input(
    folder: Path, day: date, partitions: int, files: int = 4, periods: int = PERIODS_PER_DAY
) -> dict[str, list[str]]:
    """The generated day as Parquet: intervals split by scope into ``files`` files, and limits."""
    intervals, limits = generate_day(day, partitions, periods=periods)
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


def write_out(frame, out: Path | None) -> int:
    """Write ``frame`` as Parquet to ``out`` and count what was written; ``out`` None: compute
    every row and column but write nothing (Spark's ``noop`` sink), to tell computing from
    writing. Returns -1 then (nothing to count; the stage's rows are the input's)."""
    if out is None:
        frame.write.format("noop").mode("overwrite").save()
        return -1
    frame.write.mode("overwrite").parquet(str(out))
    return frame.sparkSession.read.parquet(str(out)).count()


def plain_pass(spark, inputs: dict, out: Path | None, partitions: int) -> int:
    """Read, shuffle by scope, sort by period within partitions, write: the floor."""
    df = spark.read.parquet(*inputs["intervals"])
    return write_out(df.repartition(partitions, *SCOPE).sortWithinPartitions(*SCOPE, "interval_start"), out)


BIG = 1 << 40  # an unlimited quota in the running sums: any debt drains in one period

# The same computation as dispatch_periods, to the same columns (one row per record, empty
# periods drained through the quota integrated over time, Q(t); the over-delivery causes),
# written for DuckDB. For each record with counted
# amount d: P = C - d - Q(t0) just before it, S = C - Q(t1) just after it (C: running sum of
# d); debt_in = P - min(-opening, min of P and S over the scope's earlier records, P) and
# debt_out = S - min(that floor, S): Lindley's recursion. An unlimited stretch is a quota of
# BIG per period, which drains any debt at once.
DUCKDB_SQL = """
COPY (
WITH lim0 AS (
  SELECT level, cluster, CASE WHEN level = 'broker' THEN broker ELSE topic END AS k,
         epoch_us(valid_from) AS f, epoch_us(valid_to) AS e,
         greatest(period_seconds, 1)::BIGINT * 1000000 AS step, count_entries,
         CASE WHEN msg_limit > 0 THEN msg_limit END AS msg_q,
         CASE WHEN byte_limit > 0 THEN byte_limit END AS byte_q,
         period_seconds, msg_source, byte_source
  FROM read_parquet($limits)),
lim AS (  -- quota of all periods of the limit scope before f
  SELECT *,
    coalesce(sum(coalesce(msg_q, {big}) * ((e - f) // step)) OVER before, 0)::BIGINT AS msg_cum,
    coalesce(sum(coalesce(byte_q, {big}) * ((e - f) // step)) OVER before, 0)::BIGINT AS byte_cum
  FROM lim0
  WINDOW before AS (PARTITION BY level, cluster, k ORDER BY f
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
iv AS (
  SELECT *, epoch_us(interval_start) AS t0,
         epoch_us(interval_start) + (interval_seconds * 1000000)::BIGINT AS t1
  FROM read_parquet($intervals)),
scopes AS (  -- an integer id per scope: the window partitions by it instead of five strings
  SELECT row_number() OVER () AS sid, *
  FROM (SELECT DISTINCT level, cluster, broker, topic, subscription FROM iv)),
rows AS (
  SELECT s.sid, i.*, l.msg_q, l.byte_q, l.period_seconds, l.msg_source, l.byte_source,
    CASE WHEN l.count_entries AND i.entries IS NOT NULL THEN 'entries'
         WHEN l.count_entries THEN 'msgs-no-entries' ELSE 'msgs' END AS count_unit,
    CASE WHEN l.count_entries AND i.entries IS NOT NULL THEN i.entries ELSE i.msgs END AS counted,
    l.msg_cum + coalesce(l.msg_q, {big}) * ((i.t0 - l.f) // l.step) AS mq0,
    l.msg_cum + coalesce(l.msg_q, {big}) * ((i.t1 - l.f) // l.step) AS mq1,
    l.byte_cum + coalesce(l.byte_q, {big}) * ((i.t0 - l.f) // l.step) AS bq0,
    l.byte_cum + coalesce(l.byte_q, {big}) * ((i.t1 - l.f) // l.step) AS bq1,
    coalesce(o.debt_msgs, 0) AS d0_msgs, coalesce(o.debt_bytes, 0) AS d0_bytes
  FROM iv i
  JOIN scopes s
    ON i.level = s.level AND i.cluster = s.cluster AND i.broker IS NOT DISTINCT FROM s.broker
   AND i.topic IS NOT DISTINCT FROM s.topic AND i.subscription IS NOT DISTINCT FROM s.subscription
  LEFT JOIN lim l
    ON l.level = i.level AND l.cluster = i.cluster
   AND l.k = CASE WHEN i.level = 'broker' THEN i.broker ELSE i.topic END
   AND l.f <= i.t0 AND i.t0 < l.e
  LEFT JOIN read_parquet($opening) o
    ON o.level = s.level AND o.cluster = s.cluster AND o.broker IS NOT DISTINCT FROM s.broker
   AND o.topic IS NOT DISTINCT FROM s.topic AND o.subscription IS NOT DISTINCT FROM s.subscription),
running AS (
  SELECT *,
    sum(counted) OVER upto::BIGINT - counted - mq0 AS p_msgs,
    sum(counted) OVER upto::BIGINT - mq1 AS s_msgs,
    sum(bytes) OVER upto::BIGINT - bytes - bq0 AS p_bytes,
    sum(bytes) OVER upto::BIGINT - bq1 AS s_bytes
  FROM rows
  WINDOW upto AS (PARTITION BY sid ORDER BY t0 ROWS UNBOUNDED PRECEDING)),
floors AS (
  SELECT *,
    least(-d0_msgs, p_msgs, min(least(p_msgs, s_msgs)) OVER before) AS f_msgs,
    least(-d0_bytes, p_bytes, min(least(p_bytes, s_bytes)) OVER before) AS f_bytes
  FROM running
  WINDOW before AS (PARTITION BY sid ORDER BY t0 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
debts AS (
  SELECT *,
    CASE WHEN msg_q IS NULL THEN 0 ELSE p_msgs - f_msgs END AS debt_in_msgs,
    CASE WHEN msg_q IS NOT NULL THEN greatest(0, msg_q - (p_msgs - f_msgs)) END AS allowed_msgs,
    CASE WHEN msg_q IS NULL THEN 0
         ELSE greatest(0, counted - greatest(0, msg_q - (p_msgs - f_msgs))) END AS over_msgs,
    CASE WHEN msg_q IS NULL THEN 0 ELSE s_msgs - least(f_msgs, s_msgs) END AS debt_out_msgs,
    CASE WHEN byte_q IS NULL THEN 0 ELSE p_bytes - f_bytes END AS debt_in_bytes,
    CASE WHEN byte_q IS NOT NULL THEN greatest(0, byte_q - (p_bytes - f_bytes)) END AS allowed_bytes,
    CASE WHEN byte_q IS NULL THEN 0
         ELSE greatest(0, bytes - greatest(0, byte_q - (p_bytes - f_bytes))) END AS over_bytes,
    CASE WHEN byte_q IS NULL THEN 0 ELSE s_bytes - least(f_bytes, s_bytes) END AS debt_out_bytes,
    CASE WHEN msgs > 0 THEN floor(coalesce(redelivered_msgs, 0) * bytes / msgs + 0.5) ELSE 0 END
      AS redelivered_bytes,
    CASE WHEN count_unit = 'entries'
         THEN CASE WHEN msgs > 0 THEN floor(coalesce(redelivered_msgs, 0) * entries / msgs + 0.5) ELSE 0 END
         ELSE coalesce(redelivered_msgs, 0) END AS redelivered_units
  FROM floors),
causes AS (  -- the over-delivery causes, in the order dispatch_periods splits them
  SELECT *,
    least(over_msgs, redelivered_units) AS over_redelivery_msgs,
    least(over_bytes, redelivered_bytes) AS over_redelivery_bytes
  FROM debts)
SELECT day, level, cluster, broker, topic, subscription, interval_start AS period_start,
       interval_seconds, grain, period_seconds AS rate_period_seconds, count_unit,
       msgs, bytes, entries, redelivered_msgs, counted AS counted_msgs,
       msg_q AS msg_limit, byte_q AS byte_limit,
       CASE WHEN msg_q IS NOT NULL THEN mq1 - mq0 END AS quota_msgs,
       CASE WHEN byte_q IS NOT NULL THEN bq1 - bq0 END AS quota_bytes,
       debt_in_msgs, allowed_msgs, over_msgs, debt_out_msgs,
       debt_in_bytes, allowed_bytes, over_bytes, debt_out_bytes,
       coalesce(allowed_msgs = 0, false) OR coalesce(allowed_bytes = 0, false) AS starved,
       0::BIGINT AS starved_empty_periods,  -- no cursor_snapshots in the benchmark
       least(over_msgs - over_redelivery_msgs,
             CASE WHEN count_unit = 'msgs' AND entries IS NOT NULL THEN greatest(0, msgs - entries) ELSE 0 END)
         AS over_batch_msgs,
       over_redelivery_msgs, over_redelivery_bytes,
       over_bytes - over_redelivery_bytes AS over_approx_bytes,
       msg_source, byte_source, source,
       'classic' AS limiter_model, NULL::BIGINT AS tokens_out_msgs, NULL::BIGINT AS tokens_out_bytes,
       bytes AS counted_bytes, 'charged' AS charge_rule, false AS filtered_entries_charged
FROM causes
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



def opening_debt_file(folder: Path, day: date) -> str:
    """An empty ``debt_state`` partition of the day before (zero opening debt), as Parquet."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from brokerlens.platform.schemas import table_schema

    path = folder / "debt_state.parquet"
    schema = to_arrow_schema(table_schema("debt_state").struct)
    pq.write_table(schema.empty_table(), path)
    return str(path)


def dispatch_frame(spark, inputs: dict, opening: str):
    """``dispatch_periods`` over the generated day (not yet run)."""
    from brokerlens.gold.dispatch.periods import dispatch_periods

    return dispatch_periods(
        spark.read.parquet(*inputs["intervals"]),
        spark.read.parquet(*inputs["limits"]),
        spark.read.parquet(opening),
    )


def spark_dispatch(spark, inputs: dict, opening: str, out: Path | None) -> int:
    """``dispatch_periods`` over the generated day, written as Parquet (like the plain pass)."""
    return write_out(dispatch_frame(spark, inputs, opening), out)


def plan_summary(frame) -> dict[str, int]:
    """Counts in the physical plan: shuffles, sorts, windows, Python UDF operators. The plan
    under dispatch's scan is in it: the scan's RDD is named by it (DispatchScan.java)."""
    tree = frame._jdf.queryExecution().executedPlan().treeString()
    # One operator a line: tree glyphs, an optional whole-stage codegen id, then its name.
    operators = [m.group(1) for line in tree.splitlines()
                 if (m := re.match(r"[\s:|+\-]*(?:\*\(\d+\)\s*)?(\w+)", line))]

    def count(*names: str) -> int:
        return sum(1 for op in operators if op in names)

    return {
        "shuffle_exchanges": count("Exchange"),
        "broadcast_exchanges": count("BroadcastExchange"),
        "sorts": count("Sort"),
        "windows": count("Window"),
        "python_udf_operators": count(
            "BatchEvalPython", "ArrowEvalPython", "FlatMapGroupsInPandas", "MapInPandas", "MapInArrow",
            "FlatMapCoGroupsInPandas", "AggregateInPandas", "WindowInPandas",
        ),
    }


# ---------------------------------------------------------------------------------- harness


class Bench:
    """Runs stages, timing each and recording its peak memory."""

    def __init__(self, spark, cores: int):
        self.spark = spark
        self.cores = cores
        self.sampler = MemorySampler()

    def measure(self, fn: Callable[[], int], rows: int | None = None) -> dict:
        """Run ``fn`` (returns the rows it produced); ``rows`` overrides the rate's row count."""
        _reset_heap_peak(self.spark)
        self.sampler.reset()
        load = os.getloadavg()[0]
        started = time.perf_counter()
        produced = fn()
        seconds = max(0.01, round(time.perf_counter() - started, 2))  # the file is self-consistent
        rows = rows if rows is not None else produced
        return {
            "rows": rows,
            "seconds": seconds,
            "rows_per_second_per_core": round(rows / seconds / self.cores),
            **self.sampler.snapshot(),
            **_heap_peak_mb(self.spark),
            "load_avg_1m_before": round(load, 2),
        }

    def close(self) -> None:
        self.sampler.close()


def ratio(a: dict, b: dict) -> float:
    return round(a["seconds"] / b["seconds"], 2)


# Candidate settings for dispatch_periods, measured on the same input (suggestions for the
# settings' defaults). The scan's shuffle (DispatchScan.java) is planned without adaptive
# execution, so it keeps spark.sql.shuffle.partitions (brokerlens' default 8) where adaptive
# execution would coalesce them: one partition per core is the candidate.
VARIANTS: dict[str, dict[str, str]] = {
    "dispatch_periods[shuffle_partitions=2]": {"spark.sql.shuffle.partitions": "2"},
}


def with_conf(spark, conf: dict[str, str], fn: Callable[[], int]) -> int:
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        return fn()
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def bench_sizes(
    bench: Bench,
    work: Path,
    sizes: tuple[int, ...],
    day: date,
    periods: int = PERIODS_PER_DAY,
    done: Callable[[dict], None] = lambda entry: None,
    variant_sizes: tuple[int, ...] = (),
) -> list[dict]:
    """Each size in turn; ``done`` gets each size's entry as soon as it is measured. The
    ``VARIANTS`` of dispatch_periods run at ``variant_sizes``."""
    spark, out = bench.spark, []
    opening = opening_debt_file(work, day)
    warm = None
    for partitions in sizes:
        topo = Topology(partitions)
        started = time.perf_counter()
        inputs = write_input(work / f"input-p{partitions}", day, partitions, periods=periods)
        generated = time.perf_counter() - started
        input_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
        log.info("size %s partitions: %s scopes, %s records (%.1fs to generate)", partitions, topo.scopes, input_rows, generated)
        if warm is None:  # JIT and first-job costs, so that the smallest size is not penalised
            plain_pass(spark, inputs, work / "warmup", int(spark.conf.get("spark.sql.shuffle.partitions")))
            spark_dispatch(spark, inputs, opening, work / "warmup")
            warm = True
        shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
        stages = {
            "plain_pass": bench.measure(lambda: plain_pass(spark, inputs, work / "out-plain", shuffle)),
            "dispatch_periods": bench.measure(lambda: spark_dispatch(spark, inputs, opening, work / "out-dispatch")),
            "duckdb": bench.measure(lambda: duckdb_dispatch(inputs, opening, work / "out-duckdb.parquet", bench.cores)),
        }
        # The same two without writing: how much of each is computing, how much writing
        # (dispatch_periods writes 36 columns, the plain pass the input's 15).
        stages["plain_pass[no write]"] = bench.measure(lambda: plain_pass(spark, inputs, None, shuffle), rows=input_rows)
        stages["dispatch_periods[no write]"] = bench.measure(
            lambda: spark_dispatch(spark, inputs, opening, None), rows=input_rows
        )
        if partitions in variant_sizes:
            for name, conf in VARIANTS.items():
                stages[name] = bench.measure(
                    lambda: with_conf(spark, conf, lambda: spark_dispatch(spark, inputs, opening, work / "out-variant"))
                )
        plan = plan_summary(dispatch_frame(spark, inputs, opening))
        entry = {
            "partitions": partitions,
            "scopes": topo.scopes,
            "input_rows": input_rows,
            "dense_periods": topo.scopes * periods,
            "generate_seconds": round(generated, 2),
            "stages": stages,
            "ratios": {
                "dispatch_periods/plain_pass": ratio(stages["dispatch_periods"], stages["plain_pass"]),
                "dispatch_periods/duckdb": ratio(stages["dispatch_periods"], stages["duckdb"]),
                "dispatch_periods[no write]/plain_pass[no write]": ratio(
                    stages["dispatch_periods[no write]"], stages["plain_pass[no write]"]
                ),
                **{f"{name}/dispatch_periods": ratio(stages[name], stages["dispatch_periods"])
                   for name in VARIANTS if name in stages},
            },
            "variant_conf": {name: VARIANTS[name] for name in VARIANTS if name in stages},
            "dispatch_plan": plan,
        }
        log.info("size %s: %s", partitions, json.dumps({k: v["seconds"] for k, v in stages.items()}))
        out.append(entry)
        done(entry)
        shutil.rmtree(inputs["intervals"][0].rsplit("/", 1)[0], ignore_errors=True)
    return out


def bench_days(
    bench: Bench, work: Path, partitions: int, first: date, days: int = 3, periods: int = PERIODS_PER_DAY
) -> dict:
    """Build consecutive days through the real table layer: day N+1 reads day N's closing debt
    from ``debt_state``; its time must not grow with the days already in the lake."""
    from brokerlens.gold.dispatch.build import build_dispatch
    from brokerlens.platform.settings import Settings
    from brokerlens.platform.tables import write_table

    spark = bench.spark
    home = work / "days-home"
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(home=home)
    out = []
    for n in range(days):
        day = first + timedelta(days=n)
        inputs = write_input(work / f"days-input-{n}", day, partitions, periods=periods)
        for table, files in (("dispatch_intervals", inputs["intervals"]), ("rate_limits", inputs["limits"])):
            write_table(spark.read.parquet(*files), table, "replace", [{"day": day}], settings=settings)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
        writes: list = []
        result = bench.measure(lambda: len(writes.extend(build_dispatch(day, settings).writes) or writes), rows=rows)
        out.append({"day": day.isoformat(), **result, "write_seconds": {w.table: w.seconds for w in writes}})
        log.info("day %s built in %ss", day, result["seconds"])
        shutil.rmtree(work / f"days-input-{n}", ignore_errors=True)
    return {
        "partitions": partitions,
        "stage": "build_dispatch (dispatch_periods, debt_state, dispatch_daily through brokerlens.platform.tables)",
        "days": out,
        "last_over_first": round(out[-1]["seconds"] / out[0]["seconds"], 2),
    }


def landing_floor(spark, landing_day: Path, out: Path) -> int:
    """The floor for ``land``: a plain Spark pass over the same landing files, each kind read
    the simplest way (the JSON reader, multi-line for the stats files; the text reader for
    Prometheus metrics) and written as Parquet, with no checks, envelopes or quarantine."""
    from brokerlens.land import PARSERS

    rows = 0
    for parser in PARSERS:
        paths = [str(p) for p in sorted((landing_day / parser.KIND).glob("*")) if p.name.endswith(parser.SUFFIXES)]
        if not paths:
            continue
        if parser.KIND == "metrics":
            frame = spark.read.text(paths)
        else:
            frame = spark.read.json(paths, multiLine=parser.WHOLE_FILE)
        rows += write_out(frame, out / parser.KIND)
    return rows


def bench_landing(bench: Bench, work: Path, scales: tuple[float, ...], day: date) -> list[dict]:
    """demo-data landing files, then their floor (``landing_floor``) and ``land`` (landing →
    bronze) side by side, per demo scale."""
    from brokerlens.land import land_day
    from brokerlens.platform.settings import Settings
    from brokerlens.sources.demo import generate_day as demo_day

    out = []
    for scale in scales:
        home = work / f"land-home-{scale:g}"
        shutil.rmtree(home, ignore_errors=True)
        settings = Settings(home=home)
        started = time.perf_counter()
        demo = demo_day(day, settings, scale=scale)
        generated = time.perf_counter() - started
        landed: dict = {}

        def land() -> int:
            result = land_day(day, settings)
            landed.update(result.metrics)
            return sum(w.rows for w in result.writes if w.rows > 0)

        landing_day = settings.landing / day.isoformat()
        # Untimed once first: the floor then measures reading and writing, not the JVM's
        # warm-up on JSON (land, measured next, gets the same warm JVM).
        landing_floor(bench.spark, landing_day, work / "out-floor")
        floor = bench.measure(lambda: landing_floor(bench.spark, landing_day, work / "out-floor"))
        entry = {"scale": scale, "demo_seconds": round(generated, 2), **bench.measure(land)}
        entry["floor"] = floor
        entry["land/floor"] = ratio(entry, floor)
        entry["landing_files_mb"] = round(
            sum(p.stat().st_size for p in (settings.landing / day.isoformat()).rglob("*") if p.is_file()) / 2**20, 1
        )
        entry["land_metrics"] = {k: v for k, v in landed.items() if isinstance(v, (int, float))}
        entry["demo_metrics"] = {k: v for k, v in demo.metrics.items() if isinstance(v, (int, float))}
        out.append(entry)
        log.info("landing at scale %s: %ss", scale, entry["seconds"])
        shutil.rmtree(home, ignore_errors=True)
    return out


def daily_step(bench: Bench, stage: str, layer: str | None, day: date, settings, rows: int | None = None):
    """One daily step in this process, measured (``rows``: as ``Bench.measure``; by default the
    rows it wrote): (its name, its StageResult, the figures). ``alert`` is a dry run: no SMTP
    server in the bench."""
    from brokerlens.pipeline import run_stage

    options = {"layer": layer} if layer else {}
    if stage == "alert":
        options["dry_run"] = True
    done: list = []

    def run() -> int:
        done.append(run_stage(stage, day, settings, **options))
        return sum(w.rows for w in done[0].writes)

    measured = bench.measure(run, rows=rows)
    return (f"{stage} {layer}" if layer else stage), done[0], measured


def bench_demo_day(bench: Bench, work: Path, scale: float, day: date) -> dict:
    """The daily stages in order on one demo day, in this process (no spark-submit start-up):
    seconds per stage and per committed table (the table layer's write path)."""
    from brokerlens.pipeline import DAILY_STEPS
    from brokerlens.platform.settings import Settings
    from brokerlens.sources.demo import generate_day as demo_day

    home = work / "demo-day-home"
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(home=home)
    demo_day(day, settings, scale=scale)
    stages = {}
    for stage, layer in DAILY_STEPS:
        step, result, measured = daily_step(bench, stage, layer, day, settings)
        stages[step] = {"seconds": measured["seconds"], "write_seconds": {w.table: w.seconds for w in result.writes}}
        log.info("demo day %s: %ss", step, measured["seconds"])
    shutil.rmtree(home, ignore_errors=True)
    return {"scale": scale, "stages": stages, "total_seconds": round(sum(s["seconds"] for s in stages.values()), 2)}


# Issue 16, target 4: 50,000 partitions on 16 and 64 cores (and the generated size on this machine).
PROJECTED = ((50_000, 16), (50_000, 64))
LARGE_PARTITIONS = 2000
LARGE_MINUTES = (15, 30)  # two windows: the day projected from their difference


def bench_large_day(bench: Bench, work: Path, partitions: int, windows: tuple[int, ...], day: date) -> dict:
    """A large cluster's day (``brokerlens_bench_large``): for each window of the day's first
    minutes, its landing files, then the daily steps in this process as ``bench_demo_day`` runs
    them, each measured with the rows of the layer it reads; the whole day projected from the
    windows (``project_day``)."""
    from brokerlens.platform.settings import Settings
    from brokerlens_bench_large import MINUTES

    out = []
    for minutes in windows:
        home = work / f"large-home-{minutes}"
        shutil.rmtree(home, ignore_errors=True)
        out.append(large_window(bench, Settings(home=home), partitions, minutes, day))
        shutil.rmtree(home, ignore_errors=True)
    return {
        "partitions": partitions,
        "windows": out,
        "projection": project_day(out, partitions, bench.cores, MINUTES),
        # Driver memory against rows: the bronze rows and the peaks of each window, in order.
        "memory_by_rows": [{"bronze_rows": w["stages"]["land"]["rows_out"], "jvm_rss_mb": w["peak_jvm_rss_mb"],
                            "jvm_heap_peak_mb": w["peak_jvm_heap_peak_mb"],
                            "python_driver_rss_mb": w["peak_python_driver_rss_mb"]} for w in out],
    }


def large_window(bench: Bench, settings, partitions: int, minutes: int, day: date) -> dict:
    """One window: generated, then each daily step with its rows in (the layer it reads:
    landing records, bronze, silver, gold), rows out (what it wrote, per table) and memory."""
    from brokerlens.pipeline import DAILY_STEPS
    from brokerlens_bench_large import write_large_day

    log.info("large day: %s partitions, first %s minutes: generating", partitions, minutes)
    started = time.perf_counter()
    landing = write_large_day(settings.landing, day, partitions, minutes)
    entry = {"minutes": minutes, "generate_seconds": round(time.perf_counter() - started, 2), "landing": landing,
             "landing_mb": round(sum(k["bytes"] for k in landing.values()) / 2**20, 1), "stages": {}}
    rows_in = sum(k["records"] for k in landing.values())
    for stage, layer in DAILY_STEPS:
        step, result, measured = daily_step(bench, stage, layer, day, settings, rows=rows_in)
        log.info("large day, first %s minutes: %s in %ss", minutes, step, measured["seconds"])
        tables = {w.table: w.rows for w in result.writes}
        rows_out = sum(max(rows, 0) for rows in tables.values())
        measured.update(rows_in=measured.pop("rows"), rows_out=rows_out, tables=tables)
        if stage == "land":
            measured["input_mb"] = entry["landing_mb"]
            measured["mb_per_second_per_core"] = round(entry["landing_mb"] / measured["seconds"] / bench.cores, 2)
            entry["quarantined"] = result.metrics.get("quarantined", 0)
        if stage in ("land", "build"):
            rows_in = rows_out
        entry["stages"][step] = measured
    entry["total_seconds"] = round(sum(s["seconds"] for s in entry["stages"].values()), 2)
    for key in ("jvm_rss_mb", "jvm_heap_peak_mb", "python_driver_rss_mb"):
        entry[f"peak_{key}"] = max(s[key] for s in entry["stages"].values())
    log.info("large day, first %s minutes: %s MB landed and built in %ss", minutes, entry["landing_mb"], entry["total_seconds"])
    return entry


def project_day(windows: list[dict], partitions: int, cores: int, day_minutes: int) -> dict:
    """The whole day from the measured windows (all steps' seconds together). From two windows,
    the seconds split into a part per minute of data (the difference of the two largest, at
    least 0), scaled to the day's minutes and partitions and divided among the cores, and a
    fixed part (process warm-up, planning, Delta commits) kept as it is. From one window, all of
    it is scaled: an upper bound, since the fixed part is scaled too."""
    ordered = sorted(windows, key=lambda w: w["minutes"])
    last = ordered[-1]

    def seconds(window: dict) -> float:
        return sum(s["seconds"] for s in window["stages"].values())

    if len(ordered) > 1:
        before = ordered[-2]
        per_minute = max(0.0, (seconds(last) - seconds(before)) / (last["minutes"] - before["minutes"]))
        basis = f"the difference of the first {before['minutes']} and {last['minutes']} minutes"
    else:
        per_minute = seconds(last) / last["minutes"]
        basis = f"the first {last['minutes']} minutes, fixed costs scaled too (an upper bound)"
    fixed = max(0.0, seconds(last) - per_minute * last["minutes"])
    mb_per_minute = last["landing_mb"] / last["minutes"]

    def day(p: int, c: int) -> dict:
        data = day_minutes * p / partitions
        return {"partitions": p, "cores": c, "landing_gb": round(mb_per_minute * data / 1024, 1),
                "hours": round((fixed + per_minute * data * cores / c) / 3600, 2)}

    return {"basis": basis, "fixed_seconds": round(fixed, 1), "seconds_per_minute_of_data": round(per_minute, 2),
            "days": [day(partitions, cores), *(day(p, c) for p, c in PROJECTED)]}


REPO = Path(__file__).resolve().parents[1]
_STEP_START = re.compile(r"^step \d+ of \S+: (\S+)$")
_STEP_END = re.compile(r"^step \d+ of \S+: (\S+) (\S+) in \d+ s$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_applications(events: Path) -> list[dict]:
    """Each Spark application's start, end and jobs' submission times (epoch seconds), from its
    event log."""
    apps = []
    for log_path in sorted(events.iterdir()):
        app: dict = {"jobs": [], "end": None}
        # Spark 4 writes a folder per application (eventlog_v2_<app>/events_<n>_<app>) by default.
        parts = sorted(log_path.glob("events_*")) if log_path.is_dir() else [log_path]
        for part in parts:
            for line in part.read_text().splitlines():
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerApplicationStart":
                    app["start"] = event["Timestamp"] / 1000
                elif kind == "SparkListenerJobStart":
                    app["jobs"].append(event["Submission Time"] / 1000)
                elif kind == "SparkListenerApplicationEnd":
                    app["end"] = event["Timestamp"] / 1000
        if "start" in app:
            apps.append(app)
    return sorted(apps, key=lambda a: a["start"])


def task_fixed_cost(start: float, end: float, apps: list[dict]) -> dict:
    """A task's fixed cost: from its start to its first Spark job, and of that, the time to its
    own SparkContext (a spark-submit's; none on the stage server, whose application was up)."""
    jobs = [j for a in apps for j in a["jobs"] if start <= j <= end]
    if not jobs:
        return {}
    own = next((a for a in apps if start <= a["start"] <= end), None)
    return {
        "fixed_seconds": round(min(jobs) - start, 1),
        "to_spark_context_seconds": round(own["start"] - start, 1) if own else 0.0,
    }


_SERVER_READY = re.compile(r"^stack: stage server ready in (\d+) s")


def bench_dag(work: Path, day: date, stage_server: bool = True) -> dict:
    """The demo day through the real daily DAG, as ``make run`` runs it (``infra/stack.sh run-day
    --demo-data``: ``airflow dags test``, mail to the stack's SMTP sink), the tasks on the stage
    server (started and warmed up before the DAG, its time reported apart) or, with
    ``stage_server=False``, each a spark-submit. Per task: wall seconds and the fixed cost (task
    start to its first Spark job, from Spark's event log)."""
    home = work / "dag-home"
    shutil.rmtree(home, ignore_errors=True)
    events = home / "spark-events"
    events.mkdir(parents=True)
    env = {
        **os.environ,
        "BROKERLENS_HOME": str(home),
        "BROKERLENS_SMTP__PORT": str(_free_port()),
        "PYTHONUNBUFFERED": "1",  # step lines as they happen: their arrival times are measured
        "BROKERLENS_SPARK__CONF": json.dumps(
            {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false"}
        ),
    }
    env.pop("BROKERLENS_STAGE_SERVER", None)  # stack.sh's own server, in this home
    if not stage_server:
        env["BROKERLENS_STAGE_SERVER"] = ""
    started = dag_started = time.time()
    tasks: dict[str, dict] = {}
    output: list[str] = []
    server_seconds = None
    with subprocess.Popen(
        [str(REPO / "infra" / "stack.sh"), "run-day", day.isoformat(), "--demo-data"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as proc:
        for line in proc.stdout:
            now, line = time.time(), line.rstrip()
            output.append(line)
            if line.startswith("stack: airflow dags test"):
                dag_started = now
            elif ready := _SERVER_READY.match(line):
                server_seconds = int(ready[1])
            elif end := _STEP_END.match(line):
                tasks.setdefault(end[1], {"start": now}).update(end=now, state=end[2])
            elif start := _STEP_START.match(line):
                tasks[start[1]] = {"start": now}
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"run-day exited {proc.returncode}: " + " | ".join(output[-5:]))
    apps = spark_applications(events)
    stages = {
        task: {"state": t.get("state"), "seconds": round(t.get("end", t["start"]) - t["start"], 1),
               **task_fixed_cost(t["start"], t.get("end", started + wall), apps)}
        for task, t in tasks.items()
    }
    shutil.rmtree(home, ignore_errors=True)
    return {
        "day": day.isoformat(),
        "tasks_run_on": "the stage server" if stage_server else "a spark-submit each",
        # The stage server's start, warm-up included: once per server, not per day.
        **({"stage_server_start_seconds": server_seconds} if stage_server else {}),
        "wall_seconds": round(wall, 1),  # demo data, Airflow's database, the server's start, the DAG run
        "dag_seconds": round(started + wall - dag_started, 1),  # `airflow dags test` alone
        "tasks": stages,
    }


def _guarded(what: str, fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:  # recorded in the results file and logged with its traceback
        log.exception("bench %s failed", what)
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"}


def environment(spark, cores: int) -> dict:
    import duckdb
    import pyspark

    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    conf = spark.sparkContext.getConf()
    return {
        "cores": cores,
        "cpu": cpu,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "spark_master": conf.get("spark.master"),
        "spark_driver_memory": conf.get("spark.driver.memory", "1g"),
        "spark_shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def run(
    out: Path,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    days_partitions: int | None = None,
    land_scales: tuple[float, ...] = (1.0,),
    work: Path | None = None,
    day: date = date(2026, 11, 20),
    periods: int = PERIODS_PER_DAY,
    command: str = "brokerlens_bench.run",
    variant_sizes: tuple[int, ...] = (),
    demo_day_scale: float | None = 1.0,
    dag: bool = False,
    large_partitions: int | None = None,
    large_minutes: tuple[int, ...] = LARGE_MINUTES,
    spark=None,
) -> dict:
    """The whole benchmark; writes the results to ``out`` (JSON) and returns them."""
    from brokerlens.platform.spark import get_spark
    from brokerlens.platform.times import iso

    spark = spark or get_spark()
    work = work or out.parent / "work"
    work.mkdir(parents=True, exist_ok=True)
    cores = spark.sparkContext.defaultParallelism
    started = datetime.now(timezone.utc).replace(microsecond=0)
    bench = Bench(spark, cores)

    def save(*_) -> None:  # after every section: a run cut short still leaves its figures
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")

    try:
        results: dict = {
            "command": command,
            "started_at": iso(started),
            "environment": environment(spark, cores),
            "notes": {
                "rows": "dispatch_intervals records of the day (one per scope and one-second period with "
                "delivery; idle periods have no record); dispatch_periods has one row per record",
                "rows_per_second_per_core": "rows / seconds / cores (Spark local[*] and DuckDB threads on the same cores)",
                "memory": "peak RSS sampled every 0.1 s: the driver JVM (runs the tasks in local mode), this "
                "Python process (DuckDB runs in it), Spark's Python workers summed; JVM heap peak from MXBeans",
                "large_day": "the first minutes of a generated day (brokerlens_bench_large) through the daily steps; "
                "per stage rows_in are the rows of the layer it reads (landing records, bronze, silver or gold "
                "rows), rows_out what it wrote. Projection (project_day): the seconds per minute of data (the "
                "difference of the two largest windows) grow linearly with minutes x partitions and shrink "
                "linearly with cores; the rest (warm-up, planning, Delta commits) stays fixed. It leaves out "
                "the shuffle, skew and memory effects of many more rows per task",
            },
            "complete": False,
            "sizes": [],
        }
        bench_sizes(
            bench, work, sizes, day, periods,
            done=lambda entry: save(results["sizes"].append(entry)), variant_sizes=variant_sizes,
        )
        # The consecutive days and the landing use other stages: a failure there is recorded
        # in the results (and logged) rather than losing the measurements above.
        if days_partitions:
            results["days"] = _guarded(
                "days", lambda: bench_days(bench, work, days_partitions, day + timedelta(days=1), periods=periods)
            )
            save()
        if land_scales:
            results["landing"] = _guarded("landing", lambda: bench_landing(bench, work, land_scales, day))
            save()
        if demo_day_scale:
            results["demo_day"] = _guarded("demo_day", lambda: bench_demo_day(bench, work, demo_day_scale, day))
            save()
        if large_partitions:
            results["large_day"] = _guarded(
                "large_day", lambda: bench_large_day(bench, work, large_partitions, large_minutes, day)
            )
            save()
        if dag:
            results["dag"] = _guarded("dag", lambda: bench_dag(work, day))
            save()
            results["dag_spark_submit"] = _guarded("dag_spark_submit", lambda: bench_dag(work, day, stage_server=False))
        results["targets"] = targets(results)
    finally:
        bench.close()
    results["complete"] = True
    results["finished_at"] = iso(datetime.now(timezone.utc).replace(microsecond=0))
    results["total_seconds"] = round((datetime.now(timezone.utc) - started).total_seconds(), 1)
    save()
    shutil.rmtree(work, ignore_errors=True)
    return results


def failed_sections(results: dict) -> dict[str, str]:
    """The guarded sections that raised, with their error (the run is then incomplete as a benchmark)."""
    return {name: section["error"] for name in ("days", "landing", "demo_day", "large_day", "dag", "dag_spark_submit")
            if isinstance(section := results.get(name), dict) and "error" in section}


def targets(results: dict) -> dict:
    """Issue 16's figures side by side: land / its floor per demo scale, dispatch_periods / the
    plain pass and / DuckDB at the largest size, the DAG's wall time."""
    out: dict = {}
    for entry in results.get("landing") if isinstance(results.get("landing"), list) else []:
        out[f"land/floor at demo scale {entry['scale']:g} ({entry['landing_files_mb']} MB)"] = entry["land/floor"]
    if results["sizes"]:
        largest = max(results["sizes"], key=lambda size: size["input_rows"])
        for name in ("dispatch_periods/plain_pass", "dispatch_periods/duckdb"):
            out[f"{name} at {largest['input_rows']:,} records"] = largest["ratios"][name]
    for section, name in (("dag", "demo day through the DAG (stage server), s"),
                          ("dag_spark_submit", "demo day through the DAG (a spark-submit per task), s")):
        dag = results.get(section)
        if isinstance(dag, dict) and "tasks" in dag:
            out[name] = dag["dag_seconds"]
    large = results.get("large_day")
    if isinstance(large, dict) and "windows" in large:
        for d in large["projection"]["days"]:
            out[f"large day: projected hours for {d['partitions']:,} partitions on {d['cores']} cores"] = d["hours"]
        minutes = ", ".join(str(w["minutes"]) for w in large["windows"])
        out[f"large day: peak JVM RSS MB per window ({minutes} min)"] = ", ".join(
            f"{m['jvm_rss_mb']:.0f}" for m in large["memory_by_rows"])
    return out


def markdown(results: dict) -> str:
    """The README table for a results file (no dispatch table when no size ran: ``--sizes ''``)."""
    lines = [] if not results["sizes"] else [
        "| records | plain pass s | dispatch_periods s | DuckDB s | vs plain | vs DuckDB | no write: plain, dispatch s | dispatch rows/s/core | JVM RSS MB | JVM old gen MB | Python workers MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in results["sizes"]:
        st = size["stages"]
        d = st["dispatch_periods"]
        lines.append(
            f"| {size['input_rows']:,} | {st['plain_pass']['seconds']} | {d['seconds']} | {st['duckdb']['seconds']} | "
            f"{size['ratios']['dispatch_periods/plain_pass']}× | {size['ratios']['dispatch_periods/duckdb']}× | "
            f"{st['plain_pass[no write]']['seconds']}, {st['dispatch_periods[no write]']['seconds']} | "
            f"{d['rows_per_second_per_core']:,} | {d['jvm_rss_mb']:.0f} | {d['jvm_old_gen_peak_mb']:.0f} | {d['python_workers_rss_mb']:.0f} |"
        )
    if isinstance(results.get("days"), dict) and "days" in results["days"]:
        days = results["days"]
        lines += [
            "",
            f"Consecutive days through the table layer ({days['days'][0]['rows']:,} records a day): "
            + ", ".join(f"{d['day']} {d['seconds']} s" for d in days["days"])
            + f" (last / first {days['last_over_first']}×).",
        ]
    for entry in results.get("landing", []) if isinstance(results.get("landing"), list) else []:
        lines.append(
            f"Landing at demo scale {entry['scale']:g} ({entry['landing_files_mb']} MB of landing files): "
            f"{entry['seconds']} s, {entry['rows']:,} bronze rows."
        )
    demo = results.get("demo_day")
    if isinstance(demo, dict) and "stages" in demo:
        lines.append(
            f"Demo day (scale {demo['scale']:g}) through every stage in one process: "
            + ", ".join(f"{stage} {entry['seconds']} s" for stage, entry in demo["stages"].items())
            + f" (total {demo['total_seconds']} s)."
        )
    for section in ("dag", "dag_spark_submit"):
        dag = results.get(section)
        if isinstance(dag, dict) and "tasks" in dag:
            server = (f"; the stage server started, warm-up included, in {dag['stage_server_start_seconds']} s before it"
                      if dag.get("stage_server_start_seconds") is not None else "")
            lines.append(
                f"Demo day through the daily DAG (`airflow dags test`, the tasks on {dag.get('tasks_run_on', 'a spark-submit each')}): "
                f"{dag['dag_seconds']} s ({dag['wall_seconds']} s with the demo data and Airflow's database{server}). "
                "Per task, wall s (fixed cost: start to first Spark job, of which before its SparkContext): "
                + ", ".join(
                    f"{task} {t['seconds']}" + (f" ({t['fixed_seconds']}, {t['to_spark_context_seconds']})" if "fixed_seconds" in t else "")
                    for task, t in dag["tasks"].items()
                )
                + "."
            )
    large = results.get("large_day")
    if isinstance(large, dict) and "windows" in large:
        lines += ["", *large_day_markdown(large)]
    for name, error in failed_sections(results).items():
        lines.append(f"The {name} section failed: {error}.")
    if results.get("targets"):
        lines += ["", "| issue 16 target | measured |", "|---|---:|"]
        lines += [f"| {name} | {value} |" for name, value in results["targets"].items()]
    return "\n".join(lines)


def large_day_markdown(large: dict) -> list[str]:
    """The large day's stages at its largest window, a line per window, the projection."""
    window = max(large["windows"], key=lambda w: w["minutes"])
    lines = [
        f"Large day, {large['partitions']:,} partitions x 3 subscriptions, the first {window['minutes']} minutes "
        f"({window['landing_mb']} MB of landing files):",
        "",
        "| stage | rows in | rows out | s | rows/s/core | MB/s/core | JVM RSS MB | heap MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for step, s in window["stages"].items():
        lines.append(
            f"| {step} | {s['rows_in']:,} | {s['rows_out']:,} | {s['seconds']} | {s['rows_per_second_per_core']:,} | "
            f"{s.get('mb_per_second_per_core', '')} | {s['jvm_rss_mb']:.0f} | {s['jvm_heap_peak_mb']:.0f} |"
        )
    lines.append("")
    for w in large["windows"]:
        lines.append(
            f"First {w['minutes']} minutes: {w['landing_mb']} MB generated in {w['generate_seconds']} s, "
            f"{w['stages']['land']['rows_out']:,} bronze rows, {w['total_seconds']} s through the daily steps, "
            f"peak JVM RSS {w['peak_jvm_rss_mb']:.0f} MB, heap {w['peak_jvm_heap_peak_mb']:.0f} MB."
        )
    lines.append(
        f"Projected from {large['projection']['basis']} ({large['projection']['fixed_seconds']} s fixed, "
        f"{large['projection']['seconds_per_minute_of_data']} s per minute of data, divided among the cores): "
        + ", ".join(f"{d['partitions']:,} partitions on {d['cores']} cores {d['hours']} h ({d['landing_gb']} GB)"
                    for d in large["projection"]["days"])
        + "."
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    from brokerlens.platform import logs

    parser = argparse.ArgumentParser(prog="python -m brokerlens_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="results file (default $BROKERLENS_HOME/bench/results.json)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="topic partitions per size, comma-separated (scopes = 4 x partitions + brokers)")
    parser.add_argument("--days-partitions", type=int, default=DEFAULT_SIZES[1],
                        help="size of the 3 consecutive days built through the table layer (0: skip)")
    parser.add_argument("--land-scales", default="1,10", help="demo-data scales for the landing stage, with its floor ('' to skip)")
    parser.add_argument("--variant-sizes", default=str(DEFAULT_SIZES[1]),
                        help="sizes (partitions) at which the dispatch_periods setting variants also run ('' to skip)")
    parser.add_argument("--demo-day-scale", type=float, default=1.0,
                        help="demo-data scale of the day run through every stage (0: skip)")
    parser.add_argument("--no-dag", dest="dag", action="store_false",
                        help="skip the demo day through the daily DAG (infra/stack.sh run-day, on the stage server and with a spark-submit per task)")
    parser.add_argument("--large-partitions", type=int, default=LARGE_PARTITIONS,
                        help="topic partitions of the large day (x 3 subscriptions, 10 brokers; 0: skip)")
    parser.add_argument("--large-minutes", default=",".join(map(str, LARGE_MINUTES)),
                        help="windows of the large day from 00:00, minutes, comma-separated; each is landed and built")
    parser.add_argument("--latest", type=Path, default=None, help="also copy the results here (e.g. infra/bench/latest.json)")
    args = parser.parse_args(argv)
    logs.configure(0)
    from brokerlens.platform.settings import get_settings

    out = args.out or get_settings().home.resolve() / "bench" / "results.json"
    results = run(
        out,
        sizes=tuple(int(s) for s in args.sizes.split(",") if s),
        days_partitions=args.days_partitions or None,
        variant_sizes=tuple(int(s) for s in args.variant_sizes.split(",") if s),
        land_scales=tuple(float(s) for s in args.land_scales.split(",") if s),
        demo_day_scale=args.demo_day_scale or None,
        dag=args.dag,
        large_partitions=args.large_partitions or None,
        large_minutes=tuple(int(m) for m in args.large_minutes.split(",") if m),
        command=" ".join(["python -m brokerlens_bench", *(argv if argv is not None else sys.argv[1:])]),
    )
    if args.latest:
        args.latest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, args.latest)
    print(markdown(results))
    print(f"results: {out}")
    return 1 if failed_sections(results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
