"""The command line as a user runs it: stdout holds only the answer, errors exit non-zero."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
from datetime import date

from typer.testing import CliRunner

from brokerlens import cli
from brokerlens.platform.spark import java_options
from brokerlens.platform.tables import table_schema, write_table
from brokerlens.platform.frames import rows_frame


def seed_quarantine(spark, settings):
    from datetime import datetime

    rows = [
        (date(2026, 11, 21), "land", "dispatch", "d.jsonl", i, r, None, "{}", datetime(2026, 11, 21, 1))
        for i, r in enumerate(["duplicate", "duplicate", "negative-counter"], start=1)
    ]
    write_table(rows_frame(spark, rows, table_schema("quarantine").struct), "quarantine", "append", settings=settings)


@pytest.mark.slow
def test_sql_json_prints_only_a_json_array(spark, settings, brokerlens_command):
    seed_quarantine(spark, settings)
    proc = subprocess.run(
        brokerlens_command("sql", "--format", "json", "SELECT reason, count(*) AS n, min(day) AS day FROM quarantine GROUP BY reason ORDER BY reason"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        {"reason": "duplicate", "n": 2, "day": "2026-11-21"},
        {"reason": "negative-counter", "n": 1, "day": "2026-11-21"},
    ]


@pytest.mark.slow
def test_driver_java_options_reach_the_driver_jvm(brokerlens_command):
    """``spark.driver_java_options`` follow brokerlens' own JVM options, and the driver JVM has them."""
    env = {**os.environ, "BROKERLENS_SPARK__DRIVER_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1 -Dbrokerlens.marker=here"}
    query = (
        "SELECT reflect('java.lang.System', 'getProperty', 'brokerlens.marker') AS marker, reflect('java.lang.System', 'getProperty', 'user.timezone') AS zone"
    )
    proc = subprocess.run(brokerlens_command("sql", "--format", "json", query), capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"marker": "here", "zone": "UTC"}]


def test_the_quick_compiler_alone_keeps_a_full_size_code_cache():
    """With ``-XX:TieredStopAtLevel=1`` in the settings' driver options, HotSpot would reserve
    48 MB for compiled code, which one land, silver and gold run filled before it stopped
    compiling; brokerlens' own options keep 240 MB whatever follows them."""
    flags = subprocess.run(
        ["java", *java_options().split(), "-XX:TieredStopAtLevel=1", "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    size = next(line.split()[3] for line in flags.splitlines() if line.split()[1:2] == ["ReservedCodeCacheSize"])
    assert int(size) == 240 * 1024 * 1024, size


@pytest.mark.slow
def test_a_typo_in_a_column_says_so_in_one_line_and_exits_2(spark, settings, brokerlens_command, brokerlens_home):
    seed_quarantine(spark, settings)
    proc = subprocess.run(brokerlens_command("sql", "SELECT nope FROM quarantine"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) <= 3, proc.stderr
    assert lines[-1].startswith("error: column nope not found in quarantine; did you mean: "), proc.stderr
    # Spark proposes the closest columns of quarantine (day, line, raw, kind, stage in Spark 4.1).
    assert "day" in lines[-1] and "line" in lines[-1]
    # Java's warnings and the query's stack trace went to the log file instead.
    log = (brokerlens_home / "logs" / "brokerlens.log").read_text()
    assert "UNRESOLVED_COLUMN" in log and "Traceback" in log

    proc = subprocess.run(brokerlens_command("--verbose", "sql", "SELECT nope FROM quarantine"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: column nope not found in quarantine")


def test_a_bad_path_is_one_line_with_the_trace_in_the_log(brokerlens_command, brokerlens_home, tmp_path):
    (tmp_path / "not-a-folder").write_text("")
    env = {**os.environ, "BROKERLENS_LANDING_DIR": str(tmp_path / "not-a-folder" / "landing")}
    proc = subprocess.run(brokerlens_command("demo-data", "--date", "2026-11-21"), capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: NotADirectoryError: ") and "not-a-folder" in last, proc.stderr
    assert "Traceback" in (brokerlens_home / "logs" / "brokerlens.log").read_text()


@pytest.mark.slow
def test_sql_csv_and_table(spark, settings):
    seed_quarantine(spark, settings)
    runner = CliRunner()
    out = runner.invoke(cli.app, ["sql", "-f", "csv", "SELECT line, reason FROM quarantine ORDER BY line"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == ["line,reason", "1,duplicate", "2,duplicate", "3,negative-counter"]
    out = runner.invoke(cli.app, ["sql", "SELECT count(*) AS n FROM quarantine"])
    assert out.exit_code == 0 and "3 rows" not in out.stdout and "1 row" in out.stdout


@pytest.mark.slow
def test_sql_unknown_table_and_bad_sql_fail_clearly(spark):
    runner = CliRunner()
    out = runner.invoke(cli.app, ["sql", "SELECT * FROM no_such_table"])
    assert out.exit_code == 2
    assert "unknown table no_such_table; tables are:" in out.stderr and "quarantine" in out.stderr
    out = runner.invoke(cli.app, ["sql", "SELEC oops FROM"])
    assert out.exit_code == 2 and "SQL syntax error" in out.stderr
    assert out.stdout == ""


def test_tables_lists_every_table_with_columns(spark, settings):
    seed_quarantine(spark, settings)
    out = CliRunner().invoke(cli.app, ["tables"])
    assert out.exit_code == 0
    assert "quarantine  [bronze, version 1]" in out.stdout  # version 0 created it empty
    assert "source_file" in out.stdout
