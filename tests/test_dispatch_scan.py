"""DispatchScan.java, gold dispatch's one pass over each scope's rows, on its own: every output
column of a hand-worked day (seed 002's arithmetic: quota 10 a period, an opening debt of 5),
two scopes in one partition, the lookahead past cursor snapshots, and a clear error on a missing
column; and the SQL table function that runs it (DispatchScanExtension.scala): the planner's own
shuffle and sort under it, and its usage on a wrong call. The recursion against a sequential
reference is test_dispatch's property test."""

from __future__ import annotations

import re

import pytest
from pyspark.errors import AnalysisException, IllegalArgumentException
from pyspark.sql import types as T

from brokerlens.gold.dispatch.cursors import CAUGHT_UP, CURSOR_SOURCE
from brokerlens.gold.dispatch.periods import scan
from brokerlens.gold.dispatch.scopes import SCOPE
from brokerlens.platform.jvm import executed_plan
from brokerlens.platform.frames import rows_frame

S = 1_000_000
COLUMNS = [
    ("level", T.StringType()), ("cluster", T.StringType()), ("broker", T.StringType()),
    ("topic", T.StringType()), ("subscription", T.StringType()), ("t0_us", T.LongType()),
    ("is_record", T.BooleanType()), ("source", T.StringType()), ("_cursor_state", T.StringType()),
    ("throttle_non_backlog", T.BooleanType()), ("_unit_msgs", T.LongType()), ("bytes", T.LongType()),
    ("msg_limit", T.LongType()), ("byte_limit", T.LongType()),
    ("_q0_msgs", T.LongType()), ("_q1_msgs", T.LongType()), ("_seg_msgs", T.LongType()),
    ("_q0_bytes", T.LongType()), ("_q1_bytes", T.LongType()), ("_seg_bytes", T.LongType()),
]  # fmt: skip
SCHEMA = T.StructType([T.StructField(n, t) for n, t in COLUMNS])
TOPIC = "persistent://tenant/ns/orders-partition-0"


def row(sub, second, kind, amount, state=None, *, limited=True, q=None):
    """A scope row at ``second``: kind "record", "debt" (the opening debt) or "cursor"; a limit of
    10 messages per 1 s period (quota 10 × seconds integrated), bytes unlimited."""
    source = {"record": "dispatch", "debt": "debt_state", "cursor": CURSOR_SOURCE}[kind]
    q0, q1 = q if q else (10 * second, 10 * (second + (1 if kind == "record" else 0)))
    return ("subscription", "c1", "b1:8080", TOPIC, sub, second * S, kind == "record", source, state, False,
            amount, 0, 10 if limited else None, None, q0, q1, 0, None, None, None)  # fmt: skip


def scanned(spark, rows):
    out = scan(rows_frame(spark, rows, SCHEMA))
    keep = ["subscription", "t0_us", "is_record", "_cursor_last", "counted_msgs", "_x_in_msgs", "_x_out_msgs",
            "_x_in_bytes", "_x_out_bytes", "_next_t0_us"]  # fmt: skip
    return sorted(tuple(r) for r in out.select(*keep).collect())


def test_scan_outputs_of_a_worked_day(spark):
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # both scopes in one partition: state resets
    try:
        got = scanned(spark, [
            row("s1", 0, "record", 12),
            row("s1", 0, "debt", 5),
            row("s1", 1, "cursor", 0, CAUGHT_UP),
            row("s1", 1, "record", 7),  # caught up, non-backlog throttling off: not charged
            row("s1", 3, "cursor", 0, "backlogged"),
            row("s1", 4, "record", 30),
            row("s2", 2, "record", 9, limited=False),
        ])  # fmt: skip
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    # (sub, t0, is_record, cursor state, counted, x in, x out (msgs), x in, x out (bytes), next t0)
    assert got == [
        ("s1", 0, False, None, 5, 0, 5, None, None, 0),  # the opening debt: 5
        ("s1", 0, True, None, 12, 5, 7, None, None, 1 * S),  # allowance 10 - 5: 7 over, debt 7
        ("s1", 1 * S, False, CAUGHT_UP, 0, 7, 7, None, None, None),
        ("s1", 1 * S, True, CAUGHT_UP, 0, 7, 0, None, None, 4 * S),  # drained; next skips the cursor
        ("s1", 3 * S, False, "backlogged", 0, 0, 0, None, None, None),
        ("s1", 4 * S, True, "backlogged", 30, 0, 20, None, None, None),  # 30 on a quota of 10: debt 20
        ("s2", 2 * S, True, None, 9, None, None, None, None, None),  # no limit: no recursion, no state
    ]  # fmt: skip


def test_a_missing_column_is_named(spark):
    frame = rows_frame(spark, [row("s1", 0, "record", 1)], SCHEMA).drop("_seg_msgs")
    with pytest.raises(IllegalArgumentException, match="DispatchScan: no column _seg_msgs"):
        scan(frame)


def test_the_scan_is_a_table_function_the_planner_feeds(spark):
    rows = rows_frame(spark, [row("s1", 0, "record", 12), row("s1", 0, "debt", 5), row("s2", 0, "record", 3)], SCHEMA)
    rows.createOrReplaceTempView("scan_rows")
    try:
        query = f"""SELECT subscription, t0_us, counted_msgs, _x_in_msgs, _x_out_msgs
            FROM brokerlens_dispatch_scan(TABLE(scan_rows), '{",".join(SCOPE)}', '{CAUGHT_UP}', '{CURSOR_SOURCE}')"""
        frame = spark.sql(query)
        got = sorted(tuple(r) for r in frame.collect())
        plan = executed_plan(frame)
    finally:
        spark.catalog.dropTempView("scan_rows")
    # s1: the opening debt of 5, then 12 on a quota of 10 with 5 owed: 7 carried
    assert got == [("s1", 0, 5, 0, 5), ("s1", 0, 12, 5, 7), ("s2", 0, 3, 0, 0)]
    # Spark's own exchange on the scope and sort under the scan, planned adaptively.
    assert re.search(r"^\W*(\*\(\d+\) )?DispatchScan \[level, cluster, broker, topic, subscription\]", plan, re.M), plan
    assert "AdaptiveSparkPlan isFinalPlan=true" in plan
    assert "Exchange hashpartitioning(level" in plan and "Sort [level" in plan


def test_a_wrong_call_gets_the_usage(spark):
    rows_frame(spark, [row("s1", 0, "record", 1)], SCHEMA).createOrReplaceTempView("scan_rows")
    try:
        with pytest.raises((AnalysisException, IllegalArgumentException), match=r"brokerlens_dispatch_scan\(TABLE\(rows\), 'scope columns"):
            spark.sql("SELECT * FROM brokerlens_dispatch_scan(TABLE(scan_rows), 'level')")
    finally:
        spark.catalog.dropTempView("scan_rows")
