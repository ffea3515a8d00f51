"""The measured dispatch stages on one input: the plain Spark pass, ``dispatch_periods`` and
the same computation in DuckDB SQL."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq

from brokerlens.platform.jvm import executed_plan

from .generate import SCOPE


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
       debt_in_msgs, allowed_msgs, 0::BIGINT AS credit_in_msgs, over_msgs, debt_out_msgs,
       debt_in_bytes, allowed_bytes, 0::BIGINT AS credit_in_bytes, over_bytes, debt_out_bytes,  -- period grain: no credit
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
    """Counts in the physical plan: shuffles, sorts, windows, Python UDF operators (dispatch's
    scan is an operator of the plan, DispatchScanExtension.scala)."""
    tree = executed_plan(frame)
    # One operator a line: tree glyphs, an optional whole-stage codegen id, then its name.
    operators = [m.group(1) for line in tree.splitlines() if (m := re.match(r"[\s:|+\-]*(?:\*\(\d+\)\s*)?(\w+)", line))]

    def count(*names: str) -> int:
        return sum(1 for op in operators if op in names)

    return {
        "shuffle_exchanges": count("Exchange"),
        "broadcast_exchanges": count("BroadcastExchange"),
        "sorts": count("Sort"),
        "windows": count("Window"),
        "python_udf_operators": count(
            "BatchEvalPython",
            "ArrowEvalPython",
            "FlatMapGroupsInPandas",
            "MapInPandas",
            "MapInArrow",
            "FlatMapCoGroupsInPandas",
            "AggregateInPandas",
            "WindowInPandas",
        ),
    }
