"""Stages as Spark Connect clients of ``brokerlens connect-server`` (spark-submit with the
session's JARs and SQL settings, Delta's and brokerlens' extensions):

- gold dispatch's scan for a client that has no py4j, with the hand-worked day's numbers
  (test_dispatch_scan's), in a session without a class loader of its own;
- a backfill's two days landed at once, each client a session of its own, giving the tables
  that serial runs in a local session give (on the tests' own JVM's Connect service, warm: a
  cold server's JIT made it the suite's slowest after test_timezones);
- a killed Airflow task (the DAG's operator) interrupting its stage's Spark jobs by their tag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest
from airflow_harness import REPO, VENV_BIN, ConnectServer, connect_environ
from test_daily_dag_e2e import canonical, table_snapshot

from brokerlens.airflow_support import stage_tables
from brokerlens.pipeline import run_stage
from brokerlens.settings import Settings

pytestmark = pytest.mark.slow

# The client: test_dispatch_scan's worked day through periods.scan, printed as JSON rows.
CLIENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pyspark.sql import SparkSession
from test_dispatch_scan import SCHEMA, row
from brokerlens.gold.dispatch.periods import scan

spark = SparkSession.builder.getOrCreate()
rows = spark.createDataFrame([row("s1", 0, "record", 12), row("s1", 0, "debt", 5), row("s2", 0, "record", 3)], SCHEMA)
got = scan(rows).select("subscription", "t0_us", "counted_msgs", "_x_in_msgs", "_x_out_msgs").collect()
isolation = spark.conf.get("spark.sql.artifact.isolation.enabled")
print(json.dumps({"remote": type(spark).__module__, "isolation": isolation, "rows": sorted(list(r) for r in got)}))
"""


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """``brokerlens connect-server`` on loopback (its JARs and SQL settings are brokerlens'); its URL."""
    folder = tmp_path_factory.mktemp("connect")
    with ConnectServer({**os.environ, "BROKERLENS_HOME": str(folder / "var")}, folder) as server:
        yield server.url


def test_a_connect_client_runs_the_dispatch_scan(connect_server):
    env = {**os.environ, "SPARK_REMOTE": connect_server}
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(REPO / "tests")], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["remote"] == "pyspark.sql.connect.session"
    # The server's sessions share one class loader, and with it the generated code (ConnectServer.scala).
    assert got["isolation"] == "false"
    # s1: the opening debt of 5, then 12 on a quota of 10 with 5 owed: 7 carried; s2: 3 of 10
    assert got["rows"] == [["s1", 0, 5, 0, 5], ["s1", 0, 12, 5, 7], ["s2", 0, 3, 0, 0]]


D1, D2 = date(2026, 11, 21), date(2026, 11, 22)
BRONZE = stage_tables("land")


def client_env(url: str, home: Path, landing: Path) -> dict[str, str]:
    """A brokerlens command as a client of the server at ``url``, its lake under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKERLENS_")}
    return {**env, "BROKERLENS_HOME": str(home), "BROKERLENS_LANDING_DIR": str(landing), "BROKERLENS_SPARK__REMOTE": url}


def brokerlens(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(VENV_BIN / "brokerlens"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen) -> tuple[float, str]:
    """When the command ended, and its output; it must have succeeded."""
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return time.monotonic(), out


def demo_landing(tmp_path: Path, scale: float, *days: date) -> Path:
    landing = tmp_path / "landing"
    env = client_env("unused", tmp_path / "demo", landing)
    for day in days:
        finished(brokerlens(env, "demo-data", "--date", day.isoformat(), "--scale", str(scale)))
    return landing


def commit_times(lake: Path, day: date) -> list[int]:
    """When the bronze tables' commits that replaced ``day`` were made (ms)."""
    from deltalake import DeltaTable

    return [
        c["timestamp"]
        for table in BRONZE
        if (lake / table / "_delta_log").is_dir()
        for c in DeltaTable(str(lake / table)).history()
        if day.isoformat() in (c.get("operationParameters") or {}).get("predicate", "")
    ]


def test_two_days_land_at_once_each_a_session_of_its_own_as_serial_runs_do(connect_url, spark, tmp_path):
    landing = demo_landing(tmp_path, 0.01, D1, D2)
    runs = [brokerlens(client_env(connect_url, tmp_path / "parallel", landing), "land", "--date", day.isoformat()) for day in (D1, D2)]
    for run in runs:
        finished(run)
    # The same days one after the other, in this process's local session.
    serial = Settings(home=tmp_path / "serial", landing_dir=landing)
    for day in (D1, D2):
        run_stage("land", day, serial, spark)
    # At the same time: each day's commits began before the other's ended (one after the
    # other, one day's would all come first).
    first, second = commit_times(tmp_path / "parallel" / "lake", D1), commit_times(tmp_path / "parallel" / "lake", D2)
    assert len(first) == len(second) >= 6, (first, second)
    assert min(first) < max(second) and min(second) < max(first), (sorted(first), sorted(second))
    for table in BRONZE:
        for day in (D1, D2):
            got = canonical(table_snapshot(tmp_path / "parallel" / "lake", table, day)[1])
            assert got == canonical(table_snapshot(tmp_path / "serial" / "lake", table, day)[1]), (table, day)
    assert all(table_snapshot(tmp_path / "parallel" / "lake", "bronze_dispatch", day)[1] for day in (D1, D2))


# Airflow killing a task: the DAG's operator runs land in a thread; on_kill comes 10 s in.
KILL = """
import json, sys, threading, time
from brokerlens.airflow_support import StageOperator

operator = StageOperator(stage="land")
operator.day = sys.argv[1]
outcome = {}

def run():
    try:
        operator.execute({})
        outcome["error"] = None
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    outcome["ended"] = time.monotonic()

thread = threading.Thread(target=run)
thread.start()
time.sleep(10)
killed, killed_at = time.monotonic(), time.time()
operator.on_kill()
thread.join(300)
print(json.dumps({"error": outcome["error"], "after_kill": outcome["ended"] - killed, "killed_at_ms": killed_at * 1000}))
"""


def test_a_killed_task_interrupts_its_stages_jobs_and_commits_nothing_after(connect_server, tmp_path):
    landing = demo_landing(tmp_path, 1.0, D1)  # land takes 25-70 s on 2 cores: running at 10 s
    home = tmp_path / "killed"
    env = {**client_env(connect_server, home, landing), **connect_environ(connect_server)}
    proc = subprocess.run([sys.executable, "-c", KILL, D1.isoformat()], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # The running jobs were interrupted (the server's OPERATION_CANCELED), or the session was
    # gone when a thread of the stage went on (NO_ACTIVE_SESSION), or on_kill's stop() closed
    # the channel before the server's answer to a cancelled call came back (gRPC's CANCELLED,
    # "Channel closed!"), or a thread of the stage began a call after that (gRPC's "Cannot invoke
    # RPC on closed channel!"): the stage ended at once, with one of those errors.
    ended_by_kill = ("OPERATION_CANCELED", "NO_ACTIVE_SESSION", "StatusCode.CANCELLED", "Cannot invoke RPC on closed channel!")
    assert got["error"] and any(reason in got["error"] for reason in ended_by_kill), got["error"]
    assert got["after_kill"] < 5, got
    from deltalake import DeltaTable

    for table in BRONZE:
        # A table whose creation the kill cut short has a log folder but no commit: nothing committed.
        if any((home / "lake" / table / "_delta_log").glob("*.json")):
            assert all(c["timestamp"] < got["killed_at_ms"] for c in DeltaTable(str(home / "lake" / table)).history()), table
