"""frames.rows_frame: the rows PySpark's own createDataFrame gives, made through Arrow (no Python
worker); a naive datetime taken as UTC."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pytest
from pyspark.sql import Row

from brokerlens.platform.frames import empty_frame, rows_frame
from brokerlens.platform.jvm import executed_plan
from brokerlens.platform.schemas import table_schemas

UTC = dt.timezone.utc
KOLKATA = dt.timezone(dt.timedelta(hours=5, minutes=30))
DDL = (
    "d date, t timestamp, a array<string>, s struct<x: bigint, y: array<struct<z: string>>>, m map<string, bigint>, "
    "n decimal(20,3), b boolean, l bigint, f double, i int, ntz timestamp_ntz"
)
ROWS = [
    (dt.date(2026, 11, 21), dt.datetime(2026, 11, 21, 1, 2, 3, 456789, tzinfo=UTC), ["a", None], (1, [("p",), Row(z="q")]), {"k": 2},
     Decimal("1.5"), True, 2**40, 1.25, 7, dt.datetime(2026, 1, 1, 3)),
    (None,) * 11,
    (dt.date(2026, 11, 22), dt.datetime(2026, 11, 22, 4, 0, tzinfo=KOLKATA), [], Row(x=3, y=None), {}, Decimal("0"), False, -1, -0.5, -7, None),
]  # fmt: skip


def test_the_rows_pysparks_own_path_gives(spark):
    ours, theirs = rows_frame(spark, ROWS, DDL), spark.createDataFrame(ROWS, DDL)
    assert ours.schema == theirs.schema
    assert ours.collect() == theirs.collect()
    # Kolkata's 04:00 on the 22nd is 22:30 UTC on the 21st.
    assert ours.selectExpr("date_format(t, 'yyyy-MM-dd HH:mm')").collect()[2][0] == "2026-11-21 22:30"
    # No Python worker: the rows are a local relation of the plan, not an RDD of rows that
    # Python workers pickle.
    assert "LocalTableScan" in executed_plan(ours) and "ExistingRDD" not in executed_plan(ours)
    assert "ExistingRDD" in executed_plan(theirs)


def test_mappings_and_named_rows_by_name_a_missing_column_null_a_naive_time_utc(spark):
    got = rows_frame(spark, [{"b": 1, "a": "x"}, Row(b=2, a="y", t=dt.datetime(2026, 11, 21, 23, 59))], "a string, b bigint, t timestamp")
    assert [tuple(r) for r in got.selectExpr("a", "b", "cast(t AS string)").collect()] == [("x", 1, None), ("y", 2, "2026-11-21 23:59:00")]
    assert math.isnan(rows_frame(spark, [(float("nan"),)], "f double").first()[0])


def test_a_row_of_another_width_says_so(spark):
    with pytest.raises(ValueError, match=r"a row of 1 values for 2 columns \(a, b\)"):
        rows_frame(spark, [("x",)], "a string, b bigint")


def test_every_tables_empty_frame(spark):
    for name, schema in table_schemas().items():
        frame = empty_frame(name, spark)
        assert frame.schema == schema.struct and frame.count() == 0, name
