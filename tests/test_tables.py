"""The table layer on real Spark with delta-spark: real Delta tables, read back by delta-rs and
DuckDB as independent readers."""

from __future__ import annotations

import glob
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import date, datetime, timezone

import duckdb
import pytest
from deltalake import DeltaTable as RsDeltaTable
from deltalake import write_deltalake
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from brokerlens.deliver.query import run_sql
from brokerlens.platform import table_admin, tables
from brokerlens.platform.tables import TableError, merge_table, read_table, table_version, write_table
from test_tables_merge import debt_rows
from brokerlens.platform.frames import rows_frame

D1, D2 = date(2026, 11, 21), date(2026, 11, 22)
AT = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def quarantine_rows(spark, day, n, reason, stage="land"):
    return rows_frame(
        spark,
        [(day, stage, "dispatch", "d/f.jsonl", i + 1, reason, None, "{}", AT) for i in range(n)],
        tables.table_schema("quarantine").struct,
    )


def counts(df):
    return {(r["day"], r["reason"]): r["count"] for r in df.groupBy("day", "reason").count().collect()}


def replace_day(spark, settings, day, n, reason, **kw):
    return write_table(quarantine_rows(spark, day, n, reason), "quarantine", "replace", [{"day": day, "stage": "land"}], settings=settings, **kw)


def location(settings, name="quarantine"):
    return tables.table_location(name, settings=settings)


@pytest.mark.slow
def test_replace_partition_leaves_other_days_and_one_copy(spark, settings):
    replace_day(spark, settings, D1, 3, "a")
    replace_day(spark, settings, D2, 2, "b")
    replace_day(spark, settings, D1, 4, "c")
    result = replace_day(spark, settings, D1, 4, "c")  # the same day again: a clean replace
    assert (result.rows, result.skipped) == (4, False)
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "c"): 4, (D2, "b"): 2}
    ops = [(r["version"], r["operation"]) for r in run_sql(spark, "DESCRIBE HISTORY quarantine", settings=settings)[1]]
    # version 0 creates the table with its schema; every replace is one WRITE commit.
    assert ops == [(4, "WRITE"), (3, "WRITE"), (2, "WRITE"), (1, "WRITE"), (0, "CREATE TABLE")]


def test_same_transaction_twice_leaves_one_copy(spark, settings):
    first = write_table(quarantine_rows(spark, D1, 5, "x"), "quarantine", "append", txn=("land/2026-11-21", 1), settings=settings)
    again = write_table(quarantine_rows(spark, D1, 5, "x"), "quarantine", "append", txn=("land/2026-11-21", 1), settings=settings)
    later = write_table(quarantine_rows(spark, D1, 2, "y"), "quarantine", "append", txn=("land/2026-11-21", 2), settings=settings)
    assert (first.rows, first.skipped) == (5, False)
    assert again.skipped and not later.skipped
    assert str(again) == "quarantine: already committed by this transaction, nothing written"
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "x"): 5, (D1, "y"): 2}


def test_data_files_are_zstd_without_dictionary_pages(spark, settings):
    """The session's Parquet settings reach Delta's writer: zstd pages, and no dictionaries even
    for a column of one repeated value (the writer would otherwise build one for every column)."""
    import pyarrow.parquet as pq

    replace_day(spark, settings, D1, 50, "same reason")
    files = sorted(_data_files(location(settings)))
    assert files
    for path in files:
        row_group = pq.ParquetFile(path).metadata.row_group(0)
        columns = [row_group.column(i) for i in range(row_group.num_columns)]
        assert {c.compression for c in columns} == {"ZSTD"}
        assert not [c.path_in_schema for c in columns if {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(c.encodings)]


def test_nothing_to_write_is_said_so(spark, settings):
    """An empty day replaced where the table has none (a landing kind without files): Delta
    commits nothing, and that is not a repeated transaction."""
    replace_day(spark, settings, D1, 2, "a")
    version = table_version("quarantine", settings, spark)
    result = replace_day(spark, settings, D2, 0, "none")
    assert (result.version, result.rows, result.skipped) == (None, 0, False)
    assert str(result) == "quarantine: nothing to write, no commit"
    assert table_version("quarantine", settings, spark) == version


@pytest.mark.slow
def test_time_travel_history_detail_and_optimize_by_name(spark, settings):
    replace_day(spark, settings, D1, 3, "old")  # version 1 (0 is the empty table)
    time.sleep(1.1)
    between = datetime.now(timezone.utc)
    time.sleep(1.1)
    replace_day(spark, settings, D1, 2, "new")  # version 2
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "new"): 2}
    assert counts(read_table("quarantine", version=1, settings=settings, spark=spark)) == {(D1, "old"): 3}
    assert counts(read_table("quarantine", timestamp=between, settings=settings, spark=spark)) == {(D1, "old"): 3}
    stamp = between.strftime("%Y-%m-%d %H:%M:%S.%f")
    assert run_sql(spark, "SELECT count(*) AS n FROM quarantine VERSION AS OF 0", settings=settings)[1][0]["n"] == 0
    assert run_sql(spark, "SELECT count(*) AS n FROM quarantine VERSION AS OF 1", settings=settings)[1][0]["n"] == 3
    assert run_sql(spark, f"SELECT reason FROM quarantine TIMESTAMP AS OF '{stamp}' LIMIT 1", settings=settings)[1][0]["reason"] == "old"
    history = run_sql(spark, "DESCRIBE HISTORY quarantine", settings=settings)[1]
    assert [r["version"] for r in history] == [2, 1, 0]
    assert all("Delta-Lake/" in r["engineInfo"] and "Apache-Spark/" in r["engineInfo"] for r in history)
    detail = run_sql(spark, "DESCRIBE DETAIL quarantine", settings=settings)[1][0]
    assert (detail["format"], list(detail["partitionColumns"])) == ("delta", ["day", "stage"])
    run_sql(spark, "OPTIMIZE quarantine", settings=settings)
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "new"): 2}
    with pytest.raises(TableError, match="cannot read quarantine as of 99"):
        read_table("quarantine", version=99, settings=settings, spark=spark).collect()


@pytest.mark.slow
def test_tables_are_registered_by_name_with_descriptions(spark, settings):
    replace_day(spark, settings, D1, 1, "a")
    names = table_admin.register_tables(spark, settings=settings)
    assert "dispatch_periods" in names and "quarantine" in names
    listed = {r["tableName"] for r in spark.sql("SHOW TABLES").collect()}
    assert set(names) <= listed
    described = {r["col_name"]: r["comment"] for r in spark.sql("DESCRIBE TABLE quarantine").collect()}
    assert described["reason"] == tables.table_schema("quarantine").column("reason").description
    # A never-written table exists by name, empty, with its schema.
    assert spark.sql("SELECT * FROM debt_state").columns == tables.table_schema("debt_state").column_names
    assert spark.sql("SELECT count(*) AS n FROM debt_state").first()["n"] == 0


@pytest.mark.slow
def test_independent_readers_deltalake_and_duckdb(spark, settings):
    replace_day(spark, settings, D1, 3, "a")
    replace_day(spark, settings, D2, 2, "b")
    replace_day(spark, settings, D1, 1, "c")
    path = location(settings)
    arrow = RsDeltaTable(path).to_pyarrow_table()
    assert sorted(zip(arrow["day"].to_pylist(), arrow["reason"].to_pylist())) == [(D1, "c"), (D2, "b"), (D2, "b")]
    assert arrow.schema.field("ingested_at").type.tz == "UTC"
    import duckdb_extension_delta

    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__), "extensions", "*", "delta.duckdb_extension"))[0]
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    got = con.execute(f"SELECT day, reason, count(*), min(ingested_at) FROM delta_scan('{path}') GROUP BY ALL ORDER BY ALL").fetchall()
    assert [(d, r, n) for d, r, n, _ in got] == [(D1, "c", 1), (D2, "b", 2)]
    assert got[0][3].astimezone(timezone.utc) == AT


def test_lake_written_by_delta_rs_is_read_and_written(spark, settings):
    """A table committed by the previous layer (delta-rs) keeps its rows and takes new writes."""
    schema = tables.table_schema("quarantine")
    old = quarantine_rows(spark, D1, 3, "from-delta-rs").toPandas()
    old["ingested_at"] = old["ingested_at"].dt.tz_localize("UTC")
    import pyarrow as pa

    write_deltalake(
        location(settings), pa.Table.from_pandas(old, schema=to_arrow_schema(schema.struct), preserve_index=False), partition_by=list(schema.partition_by)
    )
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "from-delta-rs"): 3}
    replace_day(spark, settings, D2, 2, "from-spark")
    merged = {(D1, "from-delta-rs"): 3, (D2, "from-spark"): 2}
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == merged
    arrow = RsDeltaTable(location(settings)).to_pyarrow_table()
    assert sorted(set(zip(arrow["day"].to_pylist(), arrow["reason"].to_pylist()))) == sorted(merged)


@pytest.mark.slow
def test_reader_sees_old_or_new_partition_never_a_mix(spark, settings):
    replace_day(spark, settings, D1, 40, "old")
    path = location(settings)
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            arrow = RsDeltaTable(path).to_pyarrow_table(columns=["reason"])
            seen.append(tuple(sorted(set(arrow["reason"].to_pylist()))) + (arrow.num_rows,))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(3):
            replace_day(spark, settings, D1, 40 + i + 1, f"new{i}")
    finally:
        stop.set()
        thread.join()
    allowed = {("old", 40), ("new0", 41), ("new1", 42), ("new2", 43)}
    assert seen and set(seen) <= allowed


def test_failed_job_leaves_table_as_it_was(spark, settings):
    replace_day(spark, settings, D1, 3, "good")
    before = table_version("quarantine", settings, spark)
    bad = quarantine_rows(spark, D1, 50, "bad").withColumn(
        "reason", F.when(F.col("line") == 37, F.raise_error(F.lit("boom at line 37"))).otherwise(F.col("reason"))
    )
    with pytest.raises(Exception, match="boom at line 37"):
        write_table(bad, "quarantine", "replace", [{"day": D1, "stage": "land"}], settings=settings)
    assert table_version("quarantine", settings, spark) == before
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "good"): 3}


@pytest.mark.slow
def test_conflicting_commit_is_retried_and_the_last_writer_wins(spark, settings, caplog):
    """A slow replace of D1 loses the race to a fast one, is retried on Delta's concurrency
    exception and commits last: D1 holds exactly its rows."""
    replace_day(spark, settings, D1, 1, "seed")
    # Each row sleeps 200 ms in its task: the slow writer's job outlasts the fast writer's.
    slow = (
        quarantine_rows(spark, D1, 10, "slow")
        .repartition(1)
        .withColumn("raw", F.expr("coalesce(reflect('java.lang.Thread', 'sleep', cast(200 as bigint)), '{}')"))
    )
    errors = []

    def write_slow():
        try:
            write_table(slow, "quarantine", "replace", [{"day": D1, "stage": "land"}], settings=settings)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    caplog.set_level(logging.INFO, logger="brokerlens.platform.tables")
    thread = threading.Thread(target=write_slow)
    thread.start()
    time.sleep(0.5)
    replace_day(spark, settings, D1, 3, "fast")
    thread.join()
    assert not errors
    assert any("concurrent commit" in r.getMessage() for r in caplog.records)
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "slow"): 10}


@pytest.mark.slow
def test_concurrent_writes_of_different_days_both_land(spark, settings):
    replace_day(spark, settings, D1, 1, "seed")
    errors = []

    def write(day, reason):
        try:
            for _ in range(3):
                replace_day(spark, settings, day, 2, reason)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(d, r)) for d, r in ((D1, "one"), (D2, "two"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "one"): 2, (D2, "two"): 2}


WRITER = textwrap.dedent(
    """
    import datetime, sys
    from pyspark.sql import functions as F
    from brokerlens.platform import tables
    from brokerlens.settings import get_settings
    from brokerlens.platform.spark import get_spark
    day, rows, reason, repeat, sleep_ms = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    day = datetime.date.fromisoformat(day)
    settings = get_settings()
    spark = get_spark(settings)
    df = spark.range(rows).selectExpr(
        f"DATE'{day}' AS day", "'land' AS stage", "'dispatch' AS kind", "'f' AS source_file", "id + 1 AS line",
        f"'{reason}' AS reason", "CAST(NULL AS STRING) AS detail",
        f"coalesce(reflect('java.lang.Thread', 'sleep', CAST({sleep_ms} AS BIGINT)), '{{}}') AS raw",
        "TIMESTAMP'2026-11-21 10:00:00' AS ingested_at").repartition(4)
    for _ in range(repeat):
        print("writing", flush=True)
        tables.write_table(df, "quarantine", "replace", [{"day": day, "stage": "land"}], settings=settings)
    print("done", flush=True)
    """
)


def start_writer(home, day, rows, reason, repeat=1, sleep_ms=0):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, day.isoformat(), str(rows), reason, str(repeat), str(sleep_ms)],
        env={**os.environ, "BROKERLENS_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVM dies with it
    )


@pytest.mark.slow
def test_two_processes_same_day_and_another_day(spark, settings, brokerlens_home):
    """Two processes replace D1 at once (the last writer wins, never a mix) while a third
    writes D2 (kept)."""
    replace_day(spark, settings, D1, 1, "seed")
    procs = [
        start_writer(brokerlens_home, D1, 5, "a", repeat=2),
        start_writer(brokerlens_home, D1, 7, "b", repeat=2),
        start_writer(brokerlens_home, D2, 3, "c", repeat=2),
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    got = counts(read_table("quarantine", settings=settings, spark=spark))
    assert got in ({(D1, "a"): 5, (D2, "c"): 3}, {(D1, "b"): 7, (D2, "c"): 3})
    # Every commit is whole: each D1 version holds one writer's rows only.
    for version in range(table_version("quarantine", settings, spark) + 1):
        day1 = {k: v for k, v in counts(read_table("quarantine", version=version, settings=settings, spark=spark)).items() if k[0] == D1}
        assert day1 in ({}, {(D1, "seed"): 1}, {(D1, "a"): 5}, {(D1, "b"): 7}), (version, day1)


def _data_files(path):
    return {p for p in glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["during-write", "at-commit"])
def test_killed_write_leaves_a_readable_table_and_a_rerun_is_identical(spark, settings, brokerlens_home, point):
    """SIGKILL while Spark writes the data files, or once all of them are written (the commit
    window): the table reads at its previous version (or, if the commit won, wholly at the new
    one), and re-running the write gives the same table as an unbroken run."""
    replace_day(spark, settings, D1, 3, "good")
    before = table_version("quarantine", settings, spark)
    path = location(settings)
    on_disk = _data_files(path)
    # 4 tasks x 50 rows x 20 ms: a write of about a quarter of a second per task after start-up.
    proc = start_writer(brokerlens_home, D1, 200, "new", sleep_ms=20)
    deadline = time.time() + 300
    want = 1 if point == "during-write" else 4
    while len(_data_files(path) - on_disk) < want and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    after = table_version("quarantine", settings, spark)
    got = counts(read_table("quarantine", settings=settings, spark=spark))
    if after == before:
        assert got == {(D1, "good"): 3}
    else:  # the commit had happened before the kill: all of it is there
        assert (after, got) == (before + 1, {(D1, "new"): 200})
    # The re-run (as an Airflow retry would do it, a new transaction; here in this session).
    replace_day(spark, settings, D1, 200, "new")
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "new"): 200}
    assert sorted(read_table("quarantine", settings=settings, spark=spark).select("line").toPandas()["line"]) == list(range(1, 201))


@pytest.mark.slow
def test_vacuum_uses_the_tables_retention(spark, settings):
    replace_day(spark, settings, D1, 3, "a")
    replace_day(spark, settings, D1, 2, "b")
    # The replaced file is younger than the 7-day retention: kept for time travel.
    assert table_admin.vacuum(spark, "quarantine", dry_run=True, settings=settings) == []
    with pytest.raises(Exception, match="DELTA_VACUUM_RETENTION_PERIOD_TOO_SHORT"):
        run_sql(spark, "VACUUM quarantine RETAIN 0 HOURS", settings=settings)  # Delta's retention check is on
    run_sql(spark, "ALTER TABLE quarantine SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = 'interval 0 hours')", settings=settings)
    live = {os.path.normpath(f) for f in RsDeltaTable(location(settings)).file_uris()}
    replaced = _data_files(location(settings)) - live  # version 1's files, replaced by version 2
    removed = table_admin.vacuum(spark, "quarantine", settings=settings)
    assert replaced and {os.path.normpath(p.removeprefix("file:")) for p in removed} == replaced
    assert _data_files(location(settings)) == live
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "b"): 2}


def test_schema_is_enforced(spark, settings):
    df = quarantine_rows(spark, D1, 1, "a").drop("raw").withColumn("surprise", F.lit(1))
    with pytest.raises(TableError, match=r"missing columns \['raw'\], unexpected columns \['surprise'\]"):
        write_table(df, "quarantine", "append", settings=settings)
    state = debt_rows(spark, D1, [("t1", 1)]).drop("debt_msgs").withColumn("surprise", F.lit(1))
    with pytest.raises(TableError, match=r"missing columns \['debt_msgs'\], unexpected columns \['surprise'\]"):
        merge_table(state, "debt_state", [{"day": D1}], settings=settings)
    with pytest.raises(Exception, match="replaceWhere|REPLACE_WHERE"):
        write_table(quarantine_rows(spark, D2, 1, "a"), "quarantine", "replace", [{"day": D1, "stage": "land"}], settings=settings)
    assert read_table("quarantine", settings=settings, spark=spark).count() == 0
    # Only the schema's columns are written: a column it does not have is left out.
    write_table(quarantine_rows(spark, D1, 2, "a").withColumn("surprise", F.lit(1)), "quarantine", "append", settings=settings)
    assert read_table("quarantine", settings=settings, spark=spark).columns == tables.table_schema("quarantine").column_names
    assert counts(read_table("quarantine", settings=settings, spark=spark)) == {(D1, "a"): 2}


def test_unwritten_table_reads_empty_and_unknown_table_is_clear(spark, settings):
    assert read_table("quarantine", settings=settings, spark=spark).count() == 0
    with pytest.raises(Exception, match="unknown table 'nope'; known tables: .*quarantine"):
        read_table("nope", settings=settings, spark=spark)
