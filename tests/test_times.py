"""Rows leave Spark with the instants they hold, whatever the zone of this process or the session."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from brokerlens.deliver.query import format_rows
from brokerlens.settings import Settings
from brokerlens.platform.times import collect, first, iso, minute

QUERY = """SELECT timestamp'2026-11-21 11:40:22.5' AS snapshot_at,
                  timestamp'9999-12-31 23:59:59' AS valid_to,
                  timestamp_ntz'2026-11-21 11:40:22' AS wall,
                  array(timestamp'2026-11-21 00:00:00') AS starts,
                  map('reload', timestamp'2026-11-21 23:30:00') AS events,
                  named_struct('at', timestamp'2026-11-21 05:00:00', 'ranges', 3) AS peak"""
AT = datetime(2026, 11, 21, 11, 40, 22, 500000, tzinfo=timezone.utc)


@pytest.fixture(params=["Asia/Kolkata", "America/Los_Angeles"])
def process_zone(request):
    """This process's zone (what PySpark's own collect() turns instants into) set to ``param``."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if before is None:
        os.environ.pop("TZ")
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_collect_gives_utc_instants_whatever_the_process_zone(spark, process_zone):
    df = spark.sql(QUERY)
    # PySpark's own collect() gives the wall time of this process's zone, unlabelled (and east of
    # UTC, fails on the last second of 9999, which rate_limits uses for "no end").
    assert df.select("snapshot_at").collect()[0]["snapshot_at"] != AT.replace(tzinfo=None)
    (row,) = collect(df)
    assert row["snapshot_at"] == AT and row["snapshot_at"].tzinfo == timezone.utc
    assert row["valid_to"] == datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
    assert row["wall"] == datetime(2026, 11, 21, 11, 40, 22) and row["wall"].tzinfo is None
    assert row["starts"] == [datetime(2026, 11, 21, tzinfo=timezone.utc)]
    assert row["events"] == {"reload": datetime(2026, 11, 21, 23, 30, tzinfo=timezone.utc)}
    assert row["peak"].at == datetime(2026, 11, 21, 5, tzinfo=timezone.utc) and row["peak"].ranges == 3
    assert first(df)["snapshot_at"] == AT
    assert format_rows(df.columns, [row], "csv").splitlines()[1] == (
        "2026-11-21T11:40:22.500000Z,9999-12-31T23:59:59Z,2026-11-21T11:40:22,"
        '"[""2026-11-21T00:00:00Z""]","{""reload"": ""2026-11-21T23:30:00Z""}",'
        '"{""at"": ""2026-11-21T05:00:00Z"", ""ranges"": 3}"'
    )
    assert minute(row["snapshot_at"]) == "2026-11-21 11:40 UTC"


def test_collect_ignores_the_session_zone_and_brokerlens_sessions_are_utc(spark, settings):
    from brokerlens.platform.spark import get_spark

    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        assert collect(spark.sql("SELECT timestamp'2026-11-21 11:40:22+00:00' AS t"))[0]["t"] == AT.replace(microsecond=0)
        assert get_spark(settings) is spark  # the active session, put back in UTC for the stages that use it
        assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    with pytest.raises(ValueError, match="spark.sql.session.timeZone is 'Asia/Kolkata'"):
        Settings(spark={"conf": {"spark.sql.session.timeZone": "Asia/Kolkata"}})


def test_iso_says_utc_and_refuses_a_naive_instant():
    assert iso(AT) == "2026-11-21T11:40:22.500000Z"
    assert iso(datetime(2026, 11, 21, 17, 10, 22, tzinfo=timezone.utc).astimezone()) == "2026-11-21T17:10:22Z"
    assert iso(datetime(2026, 11, 21, 11, 40)) == "2026-11-21T11:40:00"  # TIMESTAMP_NTZ: a wall time, no zone
    with pytest.raises(ValueError, match="naive"):
        minute(datetime(2026, 11, 21, 11, 40))


def test_what_people_read_is_collected_through_times():
    """The modules that print for people (mail, report, sql, validation) collect with times.collect."""
    root = Path(__file__).resolve().parents[1] / "spark" / "brokerlens"
    direct = re.compile(r"\.(collect|first|head|take|tail|toPandas|toLocalIterator)\(")
    found = [
        f"{p.relative_to(root)}:{n}"
        for folder in ("deliver", "quality")
        for p in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if direct.search(line)
    ]
    assert not found, f"rows collected without times.collect: {found}"
