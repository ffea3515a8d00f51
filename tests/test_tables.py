"""The table layer on real Spark and real Delta tables (delta-rs commits)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import date, datetime, timezone

import duckdb
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from brokerlens import tables
from brokerlens.tables import TableError, read_table, write_table

D1, D2 = date(2026, 11, 21), date(2026, 11, 22)
AT = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def quarantine_rows(spark, day, n, reason, stage="land"):
    return spark.createDataFrame(
        [(day, stage, "dispatch", "d/f.jsonl", i + 1, reason, None, "{}", AT) for i in range(n)],
        tables.table_schema("quarantine").struct,
    )


def counts(df):
    return {(r["day"], r["reason"]): r["count"] for r in df.groupBy("day", "reason").count().collect()}


def replace_day(spark, day, n, reason, **kw):
    return write_table(
        quarantine_rows(spark, day, n, reason), "quarantine", "replace", [{"day": day, "stage": "land"}], **kw
    )


def test_replace_partition_leaves_other_days_and_one_copy(spark, settings):
    replace_day(spark, D1, 3, "a")
    replace_day(spark, D2, 2, "b")
    replace_day(spark, D1, 4, "c")
    replace_day(spark, D1, 4, "c")  # the same day again: a clean replace
    assert counts(read_table("quarantine")) == {(D1, "c"): 4, (D2, "b"): 2}


def test_same_transaction_twice_leaves_one_copy(spark, settings):
    first = write_table(quarantine_rows(spark, D1, 5, "x"), "quarantine", "append", txn=("land/2026-11-21", 1))
    again = write_table(quarantine_rows(spark, D1, 5, "x"), "quarantine", "append", txn=("land/2026-11-21", 1))
    assert (first.rows, first.skipped) == (5, False)
    assert again.skipped
    assert read_table("quarantine").count() == 5
    # Staging folders of the skipped write are gone, no orphan parquet files remain.
    live = set(DeltaTable(str(tables.table_path("quarantine"))).file_uris())
    on_disk = {p for p in glob.glob(str(tables.table_path("quarantine") / "**/*.parquet"), recursive=True)}
    assert on_disk == live


def test_time_travel_by_version_and_timestamp(spark, settings):
    replace_day(spark, D1, 3, "old")
    time.sleep(1.1)
    between = datetime.now(timezone.utc)
    time.sleep(1.1)
    replace_day(spark, D1, 2, "new")
    assert counts(read_table("quarantine")) == {(D1, "new"): 2}
    assert counts(read_table("quarantine", version=0)) == {(D1, "old"): 3}
    assert counts(read_table("quarantine", timestamp=between)) == {(D1, "old"): 3}


def test_independent_readers_deltalake_and_duckdb(spark, settings):
    replace_day(spark, D1, 3, "a")
    replace_day(spark, D2, 2, "b")
    replace_day(spark, D1, 1, "c")
    path = str(tables.table_path("quarantine"))
    arrow = DeltaTable(path).to_pyarrow_table()
    assert sorted(zip(arrow["day"].to_pylist(), arrow["reason"].to_pylist())) == [
        (D1, "c"), (D2, "b"), (D2, "b")
    ]
    assert arrow.schema.field("ingested_at").type.tz == "UTC"
    import duckdb_extension_delta

    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__), "extensions", "*", "delta.duckdb_extension"))[0]
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    got = con.execute(
        f"SELECT day, reason, count(*), min(ingested_at) FROM delta_scan('{path}') GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert [(d, r, n) for d, r, n, _ in got] == [(D1, "c", 1), (D2, "b", 2)]
    assert got[0][3].astimezone(timezone.utc) == AT


def test_reader_sees_old_or_new_partition_never_a_mix(spark, settings):
    replace_day(spark, D1, 40, "old")
    path = str(tables.table_path("quarantine"))
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            arrow = DeltaTable(path).to_pyarrow_table(columns=["reason"])
            seen.append(tuple(sorted(set(arrow["reason"].to_pylist()))) + (arrow.num_rows,))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(3):
            replace_day(spark, D1, 40 + i + 1, f"new{i}")
    finally:
        stop.set()
        thread.join()
    allowed = {("old", 40), ("new0", 41), ("new1", 42), ("new2", 43)}
    assert seen and set(seen) <= allowed


def test_failed_job_leaves_table_as_it_was(spark, settings):
    replace_day(spark, D1, 3, "good")
    before = DeltaTable(str(tables.table_path("quarantine"))).version()
    bad = quarantine_rows(spark, D1, 50, "bad").withColumn(
        "reason", F.when(F.col("line") == 37, F.raise_error(F.lit("boom at line 37"))).otherwise(F.col("reason"))
    )
    with pytest.raises(Exception, match="boom at line 37"):
        write_table(bad, "quarantine", "replace", [{"day": D1, "stage": "land"}])
    assert DeltaTable(str(tables.table_path("quarantine"))).version() == before
    assert counts(read_table("quarantine")) == {(D1, "good"): 3}
    assert not list((tables.table_path("quarantine") / tables.STAGING).glob("*"))


def test_failed_commit_removes_its_files(spark, settings, monkeypatch):
    replace_day(spark, D1, 3, "good")

    def broken_commit(*args, **kwargs):
        raise OSError("disk full while writing the log")

    monkeypatch.setattr(tables, "_commit", broken_commit)
    with pytest.raises(OSError, match="disk full"):
        replace_day(spark, D1, 9, "lost")
    path = tables.table_path("quarantine")
    assert counts(read_table("quarantine")) == {(D1, "good"): 3}
    assert set(glob.glob(str(path / "**/*.parquet"), recursive=True)) == set(DeltaTable(str(path)).file_uris())


def test_killed_write_leaves_previous_version_and_vacuum_removes_orphans(spark, settings, brokerlens_home):
    replace_day(spark, D1, 3, "good")
    path = tables.table_path("quarantine")
    script = textwrap.dedent(
        """
        import os, datetime
        from brokerlens import tables
        from brokerlens.spark import get_spark
        tables._commit = lambda *a, **k: os._exit(9)   # killed between data files and commit
        spark = get_spark()
        df = spark.createDataFrame(
            [(datetime.date(2026, 11, 21), "land", "dispatch", "f", 1, "killed", None, "{}",
              datetime.datetime(2026, 11, 21))], tables.table_schema("quarantine").struct)
        tables.write_table(df, "quarantine", "replace", [{"day": datetime.date(2026, 11, 21), "stage": "land"}])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "BROKERLENS_HOME": str(brokerlens_home)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    on_disk = set(glob.glob(str(path / "**/*.parquet"), recursive=True))
    live = set(DeltaTable(str(path)).file_uris())
    assert DeltaTable(str(path)).version() == 0
    assert counts(read_table("quarantine")) == {(D1, "good"): 3}
    orphans = on_disk - live
    assert orphans, "the killed write should have left unreferenced files"
    removed = tables.vacuum("quarantine", retention_hours=0)
    assert len(removed) >= len(orphans)
    assert set(glob.glob(str(path / "**/*.parquet"), recursive=True)) == live


def test_concurrent_writes_of_different_days_both_land(spark, settings):
    replace_day(spark, D1, 1, "seed")
    errors = []

    def write(day, reason):
        try:
            for _ in range(3):
                replace_day(spark, day, 2, reason)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(d, r)) for d, r in ((D1, "one"), (D2, "two"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counts(read_table("quarantine")) == {(D1, "one"): 2, (D2, "two"): 2}


def test_schema_is_enforced(spark, settings):
    df = quarantine_rows(spark, D1, 1, "a").drop("raw").withColumn("surprise", F.lit(1))
    with pytest.raises(TableError, match=r"missing columns \['raw'\], unexpected columns \['surprise'\]"):
        write_table(df, "quarantine", "append")
    with pytest.raises(TableError, match="outside the partitions"):
        write_table(quarantine_rows(spark, D2, 1, "a"), "quarantine", "replace", [{"day": D1, "stage": "land"}])
    assert not tables.table_exists("quarantine")


def test_unwritten_table_reads_empty_and_unknown_table_is_clear(spark, settings):
    assert read_table("quarantine").count() == 0
    with pytest.raises(Exception, match="unknown table 'nope'; known tables: .*quarantine"):
        read_table("nope")


def test_native_format_without_jars_says_so(spark, settings, monkeypatch):
    native = settings.model_copy(update={"table_format": "native"})
    with pytest.raises(TableError, match="needs the Delta Lake JARs"):
        read_table("quarantine", settings=native)
