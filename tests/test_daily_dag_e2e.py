"""The daily DAG end to end, as `make run` runs it: `airflow dags test` on a demo day, the steps
clients of a real Spark Connect server (`brokerlens connect-server`, one Spark application), a
real SMTP server receiving the mail; the failing runs with each step its own real spark-submit
(`brokerlens_daily_spark_submit`), and on the Connect server.

Asserted: every task succeeded and logged its stage's summary; the tables each step declares
were written for the day; each table was validated (bronze after land, silver before gold) with
the row count it holds for the day; the mails received are exactly the messages `alert_notifications`
records, about exactly the alerts of `hole_alerts` that are new, escalated or resolved; a second
run of the same day changes no table and sends nothing; a failing step stops the later ones
and mails the failure notification.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from airflow_harness import REPO, ConnectServer, SmtpSink, airflow, airflow_env, body_text, connect_environ
from test_collect import TOKEN, admin, fixture  # noqa: F401 (admin: the replaying admin API)

pytestmark = pytest.mark.slow

DAY = date(2026, 11, 21)
DAILY, DAILY_SPARK_SUBMIT = "brokerlens_daily", "brokerlens_daily_spark_submit"
STAGES = ["land", "validate_bronze", "build_silver", "validate_silver", "build_gold", "alert", "report"]


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """One migrated Airflow database (sqlite) for the module's runs."""
    home = tmp_path_factory.mktemp("airflow-home")
    proc = airflow("db", "migrate", env=airflow_env(home, home / "unused", 8025), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return home


def run_cli(env: dict, *args: str) -> str:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("brokerlens")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def dags_test(env: dict, day: date, dag_id: str = DAILY) -> subprocess.CompletedProcess:
    return airflow("dags", "test", dag_id, day.isoformat(), env=env, timeout=3600)


def task_states(airflow_home: Path, day: date | None, dag_id: str = DAILY) -> dict[str, str]:
    """State of each task of the DAG's latest run (for ``day``), from Airflow's database."""
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        run_id = db.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = ? AND (? IS NULL OR date(logical_date) = ?) ORDER BY id DESC LIMIT 1",
            (dag_id, day and day.isoformat(), day and day.isoformat()),
        ).fetchone()[0]
        rows = db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)).fetchall()
    return dict(rows)


def declared_tables() -> dict[str, list[str]]:
    from brokerlens.airflow_support import stage_tables

    return {stage: stage_tables(stage) for stage in STAGES}


def table_snapshot(lake: Path, table: str, day: date) -> tuple[int, list[dict]]:
    """(version, the day's rows) of a Delta table, read with delta-rs: no Spark here."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(lake / table))
    return dt.version(), dt.to_pyarrow_table(partitions=[("day", "=", day.isoformat())]).to_pylist()


def canonical(rows: list[dict]) -> list[str]:
    """Rows comparable across runs: all columns but ``ingested_at``, which says when a run
    landed or quarantined the record."""
    return sorted(repr(sorted((k, v) for k, v in r.items() if k != "ingested_at")) for r in rows)


@pytest.mark.heavy  # two whole DAG runs, 9 minutes on 2 cores; the failing and collection DAG runs stay in make test
def test_daily_dag_end_to_end_then_rerun_changes_nothing(airflow_home, tmp_path):
    home = tmp_path / "var"
    with SmtpSink(tmp_path / "mail") as sink, ConnectServer(airflow_env(airflow_home, home, sink.port), tmp_path / "server") as server:
        env = airflow_env(airflow_home, home, sink.port, BROKERLENS_DAG_RETRIES="0", **server.environ)
        run_cli(env, "demo-data", "--date", DAY.isoformat(), "--scale", "0.01")

        first = dags_test(env, DAY)
        log = first.stdout + first.stderr
        assert first.returncode == 0, log[-6000:]
        assert task_states(airflow_home, DAY) == {s: "success" for s in STAGES}
        # Each step was a client of the Connect server, and its log has its stage's summary
        # (StageResult.render, logged line by line by the operator): the heading, then what it
        # wrote.
        assert len(re.findall(r"\] brokerlens \w+ 2026-11-21 on Spark Connect \(spark_connect_default\)", log)) == len(STAGES)
        assert "Spark-Submit cmd" not in log
        for stage in STAGES:  # the heading of validate --layer bronze is "validate bronze <day>"
            assert re.search(rf"\] {stage.replace('_', ' ')} {DAY.isoformat()} +\[airflow\.task\.", log), stage
        assert re.search(r"\] +bronze_dispatch: \d+ rows in \d+ files, version \d+ +\[airflow\.task", log)
        assert re.search(r"\] .*quarantined=\d+", log)

        lake = home / "lake"
        declared = {t for ts in declared_tables().values() for t in ts}
        written = {t for t in declared if (lake / t / "_delta_log").is_dir()}
        # Every table the steps declare, but publish-rate conformance: written only for the
        # publish-rate limits configured in settings (none here).
        assert declared - written == {"publish_rate_conformance"}
        before = {t: table_snapshot(lake, t, DAY) for t in written}
        for t in declared_tables()["land"] + ["dispatch_periods", "cursor_ranges", "hole_alerts"]:
            assert before[t][1] or t == "quarantine", f"{t} has no rows for {DAY}"
        assert before["quarantine"][1], "demo data has deliberately bad records"

        # Validation saw the data: every bronze and silver table, each with the rows it holds for
        # the day, in the table and in the validation reports alike.
        validated = {t: len(before[t][1]) for t in written if t.startswith("bronze_") or t in declared_tables()["build_silver"]}
        assert all(validated.values()), validated
        results = before["validation_results"][1]
        assert {(r["table_name"], r["rows"]) for r in results} == set(validated.items())
        reports = list((home / "reports" / "validation" / DAY.isoformat()).glob("*.json"))
        assert len(reports) == 2  # validate_bronze, validate_silver
        assert {(r["table_name"], r["rows"]) for p in reports for r in json.loads(p.read_text())} == set(validated.items())

        # The mails received are the messages alert_notifications records ...
        mails = sink.messages()
        assert mails, "no alert mail received"
        assert not [m for m in mails if " failed" in m["Subject"]]
        notified = before["alert_notifications"][1]
        by_id = {m["Message-ID"]: m for m in mails}
        assert set(by_id) == {r["message_id"] for r in notified}
        # ... about the day's alerts that are new, escalated or resolved, each in its mail.
        to_mail = {(a["topic"], a["subscription"]) for a in before["hole_alerts"][1] if a["state"] in ("new", "escalated", "resolved")}
        assert {(r["topic"], r["subscription"]) for r in notified} == to_mail
        for r in notified:
            mail = by_id[r["message_id"]]
            assert r["subscription"] in body_text(mail)
            assert {p.get_content_type() for p in mail.walk()} >= {"text/plain", "text/html"}
        # Every received mail went to the SMTP sink through the Airflow connection's port.
        assert all(m["X-Envelope-To"] for m in mails)

        second = dags_test(env, DAY)
        assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
        assert task_states(airflow_home, DAY) == {s: "success" for s in STAGES}
        assert len(sink.messages()) == len(mails), "the re-run sent mail again"
        after = {t: table_snapshot(lake, t, DAY) for t in written}
        # Same rows in every table (a day's partitions are replaced by new versions with the
        # same rows); nothing appended to what was sent. validation_results is the history of
        # validate runs: two more runs (bronze, silver), with as many results.
        history = "validation_results"
        assert {t: canonical(rows) for t, (_, rows) in after.items() if t != history} == {t: canonical(rows) for t, (_, rows) in before.items() if t != history}
        runs = lambda rows: Counter(r["run_at"] for r in rows)  # noqa: E731
        first_runs, all_runs = runs(before[history][1]), runs(after[history][1])
        assert len(first_runs) == 2 and len(all_runs) == 4
        assert set(all_runs.values()) == set(first_runs.values())
        assert after["alert_notifications"][0] == before["alert_notifications"][0]
        # Delta SQL by name: the re-run replaced the day (one more WRITE with its replaceWhere
        # predicate), committed by Spark with Delta; version 1 (the first run) is still there.
        history = json.loads(run_cli(env, "sql", "--format", "json", "DESCRIBE HISTORY dispatch_periods"))
        writes = [h for h in history if h["operation"] == "WRITE"]
        assert len(writes) == 2 and all("Delta-Lake/" in h["engineInfo"] for h in history)
        assert all("2026-11-21" in h["operationParameters"]["predicate"] for h in writes)
        rows = len(before["dispatch_periods"][1])
        first = json.loads(run_cli(env, "sql", "--format", "json", f"SELECT count(*) AS n FROM dispatch_periods VERSION AS OF {writes[-1]['version']}"))
        assert first == [{"n": rows}]

    # Where make run says the outputs are.
    assert list((home / "reports").rglob("*.html"))


def test_a_failing_step_stops_the_later_ones_and_mails_the_failure(airflow_home, tmp_path, connect_url):
    """The daily DAG with its tasks clients of the tests' own JVM (connect_url), as they are of
    the Connect server in production; a spark-submit's exit code for a data failure is
    test_dags' (a spark-submit per task cost this test two new JVMs)."""
    home = tmp_path / "var"
    day = date(2026, 11, 22)
    with SmtpSink(tmp_path / "mail") as sink:
        # Retries as in production: a data failure must not be retried anyway.
        env = airflow_env(airflow_home, home, sink.port, BROKERLENS_FAILURE_EMAIL="oncall@example.com", **connect_environ(connect_url))
        break_validation(env, home, day)
        run = dags_test(env, day)
        log = run.stdout + run.stderr
        assert run.returncode != 0
        states = task_states(airflow_home, day)
        assert states["land"] == "success" and states["validate_bronze"] == "failed", states
        assert all(states[s] == "upstream_failed" for s in STAGES[2:]), states
        assert "validate failed (not retried)" in log
        mails = sink.messages()
    assert len(mails) == 1
    mail = mails[0]
    assert mail["Subject"] == f"[brokerlens] {DAILY} {day.isoformat()}: validate_bronze failed"
    assert mail["To"] == "oncall@example.com"
    text = body_text(mail)
    assert "step: validate_bronze" in text and f"day: {day.isoformat()}" in text
    assert "Not run: alert, build_gold, build_silver, report, validate_silver." in text
    # The mail says what failed: the stage's summary, with the count of offending rows.
    policies = table_snapshot(home / "lake", "bronze_policies", day)[1]
    offending = sum(p["kind"] != "broker-config" for p in policies)
    assert 0 < offending < len(policies)
    assert (f"bronze_policies: expect_column_values_to_be_in_set(kind) failed on {offending} of {len(policies)} rows") in text
    # Nothing downstream ran: no silver or gold table, no report.
    assert not (home / "lake" / "rate_limits").exists() and not (home / "lake" / "hole_alerts").exists()
    assert not list(home.rglob("*.html"))


def stage_output(log: str) -> list[str]:
    """What the stage's command printed, as the task log shows it (the lines SparkSubmitHook
    copies from spark-submit)."""
    task_logger = r"\[airflow\.task\.(?:hooks\.[\w.]*SparkSubmitHook|operators\.[\w.]*StageSubmitOperator)\]"
    lines = re.findall(rf"\] (.*?) +{task_logger}", log)
    return [line for line in lines if not line.startswith("Spark-Submit cmd")]


@pytest.mark.parametrize("on_connect", [False, True], ids=["spark-submit", "spark-connect"])
def test_a_stage_failure_ends_its_task_log_with_the_reason(airflow_home, tmp_path, on_connect, request):
    """Light: one task (report, on empty tables) through the DAG's operator, failing on a path
    that only the task's own environment names. On Spark Connect, the task is a client of the
    tests' own JVM (connect_url): the server's process is not what this is about."""
    home, blocker = tmp_path / "var", tmp_path / "a-file"
    blocker.write_text("")
    day = date(2026, 11, 23)
    with SmtpSink(tmp_path / "mail") as sink:
        env = airflow_env(
            airflow_home,
            home,
            sink.port,
            BROKERLENS_FAILURE_EMAIL="oncall@example.com",
            BROKERLENS_DAG_RETRIES="0",
            BROKERLENS_REPORTS_DIR=str(blocker / "reports"),
            **(connect_environ(request.getfixturevalue("connect_url")) if on_connect else {}),
        )
        run = airflow("tasks", "test", DAILY if on_connect else DAILY_SPARK_SUBMIT, "report", day.isoformat(), env=env, timeout=900)
    log = run.stdout + run.stderr
    assert "new_state=failed" in log, log[-3000:]
    assert ("on Spark Connect" in log) == on_connect
    error = f"NotADirectoryError: [Errno 20] Not a directory: '{blocker / 'reports' / day.isoformat()}'"
    if on_connect:  # the stage ran in the task's process: Airflow records its exception
        assert error in log and "Spark-Submit cmd" not in log
        return
    reason = f"error: {error}"
    # The stage's last line is its reason; a user's mistake (a path) prints no stack trace.
    output = stage_output(log)
    assert output and output[-1] == reason, output[-5:]
    assert not any("Traceback" in line for line in output)
    # What Airflow records as the task's error is that reason, without spark-submit's traceback.
    assert f"report failed (exit code 2):\n{reason}" in log
    assert "The above exception was the direct cause" not in log and "Cannot execute: spark-submit" not in log
    assert "During handling of the above exception" not in log


def test_collection_dag_snapshots_a_cluster_into_landing(airflow_home, tmp_path, admin):
    home = tmp_path / "var"
    env = airflow_env(airflow_home, home, 8025, BROKERLENS_ADMIN_URL=admin, BROKERLENS_ADMIN_TOKEN=TOKEN, BROKERLENS_COLLECT__BACKOFF_SECONDS="0")
    run = airflow("dags", "test", "brokerlens_collect", env=env, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert task_states(airflow_home, None, "brokerlens_collect") == {"collect": "success"}
    assert TOKEN not in log
    # The task log has the stage's summary; landing has the cluster's stats, verbatim.
    assert re.search(r"\] collect \d{4}-\d\d-\d\d\n  topics=\d+, partitions=\d+, ", log)
    [stats_file] = home.glob("landing/*/topic-stats/collect-*")
    envelopes = {e["topic"]: e for e in json.loads(stats_file.read_text())}
    assert envelopes["persistent://acme/orders/order-events"]["stats"] == fixture("/admin/v2/persistent/acme/orders/order-events/stats")


def break_validation(env: dict, home: Path, day: date) -> None:
    """A day that lands cleanly but fails a critical expectation: a stricter suite that expects
    only broker configuration among the policies, on a demo day that has namespace policies.
    Only the policies are kept, so that land is quick."""
    run_cli(env, "demo-data", "--date", day.isoformat(), "--scale", "0.01")
    for kind in (home / "landing" / day.isoformat()).iterdir():
        if kind.is_dir() and kind.name != "policies":
            shutil.rmtree(kind)
    suites = home.parent / "expectations"
    shutil.copytree(REPO / "expectations", suites)
    path = suites / "bronze_policies.json"
    suite = json.loads(path.read_text())
    suite["expectations"].append(
        {
            "type": "expect_column_values_to_be_in_set",
            "kwargs": {"column": "kind", "value_set": ["broker-config"]},
            "meta": {"severity": "critical"},
        }
    )
    path.write_text(json.dumps(suite))
    env["BROKERLENS_EXPECTATIONS_DIR"] = str(suites)
