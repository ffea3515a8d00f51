"""The table layer's MERGE (state tables): update, insert and delete within partitions, and
MERGEs at once in one session."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import date
from functools import partial

import pytest

from brokerlens.deliver.query import run_sql
from brokerlens.platform import tables
from brokerlens.platform.tables import merge_table, read_table
from brokerlens.platform.frames import rows_frame

D1, D2 = date(2026, 11, 21), date(2026, 11, 22)


def debt_rows(spark, day, rows):
    """debt_state rows of one topic level: (topic, debt_msgs) each."""
    schema = tables.table_schema("debt_state")
    base = {
        "day": day,
        "level": "topic",
        "cluster": "c1",
        "broker": "b1",
        "subscription": None,
        "debt_bytes": 0,
        "last_period_start": None,
        "limiter_model": "classic",
    }
    return rows_frame(
        spark,
        [tuple({**base, "topic": t, "debt_msgs": msgs}[c] for c in schema.column_names) for t, msgs in rows],
        schema.struct,
    )


@pytest.mark.slow
def test_merge_updates_inserts_and_deletes_within_the_day(spark, settings):
    state = partial(debt_rows, spark)
    merge_table(state(D1, [("t1", 5), ("t2", 7)]), "debt_state", [{"day": D1}], settings=settings)
    merge_table(state(D2, [("t1", 1)]), "debt_state", [{"day": D2}], settings=settings)
    result = merge_table(state(D1, [("t1", 5), ("t2", 9), ("t3", 1)]), "debt_state", [{"day": D1}], settings=settings)
    merge_table(state(D1, [("t2", 9), ("t3", 1)]), "debt_state", [{"day": D1}], settings=settings)  # t1 drained: deleted
    got = {(r["day"], r["topic"]): r["debt_msgs"] for r in read_table("debt_state", settings=settings, spark=spark).collect()}
    assert got == {(D1, "t2"): 9, (D1, "t3"): 1, (D2, "t1"): 1}
    # t1 matched (5 -> 5) and t2 matched (7 -> 9): 2 updated, t3 inserted.
    assert result.rows == 3
    assert [r["operation"] for r in run_sql(spark, "DESCRIBE HISTORY debt_state", settings=settings)[1]][:4] == ["MERGE"] * 4


@pytest.mark.slow
def test_merges_at_once_in_one_session_each_find_their_own_commit(spark, settings):
    """A MERGE's commit is tagged through a session setting: two threads merging at once must
    not tag each other's commits (each result names its own version and rows)."""
    merge_table(debt_rows(spark, D1, [("t0", 1)]), "debt_state", [{"day": D1}], settings=settings)

    def merges(day, topics):
        return [merge_table(debt_rows(spark, day, [(t, n) for t in topics]), "debt_state", [{"day": day}], settings=settings) for n in (1, 2, 3)]

    with ThreadPoolExecutor(2) as pool:
        one, two = pool.map(merges, (D1, D2), (["a"], ["b", "c"]))
    results = one + two
    assert all(r.version is not None for r in results), results
    assert len({r.version for r in results}) == 6
    # The first merge of a day inserts its topics (and D1's deletes t0); the next two update them.
    assert [r.rows for r in one] == [1, 1, 1] and [r.rows for r in two] == [2, 2, 2]


def test_the_warning_of_a_merges_checkpointed_source_is_left_out(spark):
    """Delta runs a MERGE from a locally checkpointed copy of its source and unpersists it after,
    and Spark warns of that on every MERGE, through the RDD's logger ("RDD n was locally
    checkpointed, its lineage has been truncated ..."): nothing an operator can act on, in every
    build's log. brokerlens' log4j2 settings (platform/log4j2.properties) keep that logger to errors."""
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    assert not log4j.getLogger("org.apache.spark.rdd.MapPartitionsRDD").isWarnEnabled()
    assert log4j.getLogger("org.apache.spark.rdd.MapPartitionsRDD").isErrorEnabled()
    assert log4j.getLogger("org.apache.spark.scheduler.DAGScheduler").isWarnEnabled()  # Spark's other warnings stay
