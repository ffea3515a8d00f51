"""The demo day through the real daily DAG (``infra/stack.sh run-day``), its tasks clients of
the Spark Connect server and with a spark-submit per task, with each task's fixed cost from
Spark's event log; and alternated with the DAG of the last commit that ran its tasks on
brokerlens' own stage server, so that one run compares the two."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from datetime import date
from pathlib import Path

from .stage_server_commit import REPO, STAGE_SERVER_COMMIT, alternated, medians, stage_server_checkout

_STEP_START = re.compile(r"^step \d+ of \S+: (\S+)$")
_STEP_END = re.compile(r"^step \d+ of \S+: (\S+) (\S+) in \d+ s$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_applications(events: Path) -> list[dict]:
    """Each Spark application's start, end and jobs' submission times (epoch seconds), from its
    event log."""
    apps = []
    for log_path in sorted(events.iterdir()):
        app: dict = {"jobs": [], "end": None}
        # Spark 4 writes a folder per application (eventlog_v2_<app>/events_<n>_<app>) by default.
        parts = sorted(log_path.glob("events_*")) if log_path.is_dir() else [log_path]
        for part in parts:
            for line in part.read_text().splitlines():
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerApplicationStart":
                    app["start"] = event["Timestamp"] / 1000
                elif kind == "SparkListenerJobStart":
                    app["jobs"].append(event["Submission Time"] / 1000)
                elif kind == "SparkListenerApplicationEnd":
                    app["end"] = event["Timestamp"] / 1000
        if "start" in app:
            apps.append(app)
    return sorted(apps, key=lambda a: a["start"])


def task_fixed_cost(start: float, end: float, apps: list[dict]) -> dict:
    """A task's fixed cost: from its start to its first Spark job, and of that, the time to its
    own SparkContext (a spark-submit's; none on the Connect server, whose application was up)."""
    jobs = [j for a in apps for j in a["jobs"] if start <= j <= end]
    if not jobs:
        return {}
    own = next((a for a in apps if start <= a["start"] <= end), None)
    return {
        "fixed_seconds": round(min(jobs) - start, 1),
        "to_spark_context_seconds": round(own["start"] - start, 1) if own else 0.0,
    }


_SERVER_READY = re.compile(r"^stack: (?:Spark Connect server ready on \S+|stage server ready) in (\d+) s")

TASKS_RUN_ON = {
    "connect": "Spark Connect, clients of one server",
    "spark_submit": "a spark-submit each",
    "stage_server": f"the stage server of {STAGE_SERVER_COMMIT[:7]}",
}


def bench_dag(work: Path, day: date, tasks_on: str = "connect") -> dict:
    """The demo day through the real daily DAG, as ``make run`` runs it (``infra/stack.sh run-day
    --demo-data``: ``airflow dags test``, mail to the stack's SMTP sink), its tasks (``tasks_on``)
    clients of the Spark Connect server, each a spark-submit, or on the stage server of
    ``STAGE_SERVER_COMMIT`` (that commit's DAG, stack and code). A server is started and warmed up
    before the DAG, its time reported apart. Per task: wall seconds and the fixed cost (task start
    to its first Spark job, from Spark's event log)."""
    if tasks_on not in TASKS_RUN_ON:
        raise ValueError(f"tasks_on: {tasks_on!r}, not one of {', '.join(TASKS_RUN_ON)}")
    home = work / "dag-home"
    shutil.rmtree(home, ignore_errors=True)
    events = home / "spark-events"
    events.mkdir(parents=True)
    env = {
        **os.environ,
        "BROKERLENS_HOME": str(home),
        "BROKERLENS_SMTP__PORT": str(_free_port()),
        "PYTHONUNBUFFERED": "1",  # step lines as they happen: their arrival times are measured
        "BROKERLENS_SPARK__CONF": json.dumps({"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false"}),
    }
    if tasks_on == "stage_server":
        with stage_server_checkout(work) as tree:
            env["PYTHONPATH"] = str(tree / "spark")  # ahead of this checkout's editable install
            env.pop("BROKERLENS_STAGE_SERVER", None)  # that stack's own server, in this home
            run = _run_day(tree, day, env, events)
    else:
        env["BROKERLENS_SPARK__CONNECT_PORT"] = str(_free_port())
        run = _run_day(REPO, day, env, events, ("--spark-submit",) if tasks_on == "spark_submit" else ())
    shutil.rmtree(home, ignore_errors=True)
    return {"day": day.isoformat(), "tasks_run_on": TASKS_RUN_ON[tasks_on], **run}


def _run_day(repo: Path, day: date, env: dict, events: Path, args: tuple[str, ...] = ()) -> dict:
    """``repo``'s ``infra/stack.sh run-day ... --demo-data [args]``, timed from its output's step
    lines as they arrive."""
    started = dag_started = time.time()
    tasks: dict[str, dict] = {}
    output: list[str] = []
    server_seconds = None
    with subprocess.Popen(
        [str(repo / "infra" / "stack.sh"), "run-day", day.isoformat(), "--demo-data", *args],
        env=env,
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        for line in proc.stdout:
            now, line = time.time(), line.rstrip()
            output.append(line)
            if line.startswith("stack: airflow dags test"):
                dag_started = now
            elif ready := _SERVER_READY.match(line):
                server_seconds = int(ready[1])
            elif end := _STEP_END.match(line):
                tasks.setdefault(end[1], {"start": now}).update(end=now, state=end[2])
            elif start := _STEP_START.match(line):
                tasks[start[1]] = {"start": now}
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"run-day exited {proc.returncode}: " + " | ".join(output[-5:]))
    apps = spark_applications(events)
    stages = {
        task: {
            "state": t.get("state"),
            "seconds": round(t.get("end", t["start"]) - t["start"], 1),
            **task_fixed_cost(t["start"], t.get("end", started + wall), apps),
        }
        for task, t in tasks.items()
    }
    return {
        # The server's start, warm-up included: once per server, not per day.
        **({"server_start_seconds": server_seconds} if server_seconds is not None else {}),
        "wall_seconds": round(wall, 1),  # demo data, Airflow's database, the server's start, the DAG run
        "dag_seconds": round(started + wall - dag_started, 1),  # `airflow dags test` alone
        "tasks": stages,
    }


def bench_dag_against_stage_server(work: Path, day: date, rounds: int) -> dict:
    """Today's DAG on Spark Connect and the stage server's (``STAGE_SERVER_COMMIT``), ``rounds``
    runs each, alternated Connect, stage server, stage server, Connect, ... so that neither has
    all the first runs of the machine's state; the medians of ``dag_seconds`` and their ratio."""
    order = alternated("connect", rounds)
    runs = [{"tasks_on": tasks_on, **bench_dag(work, day, tasks_on)} for tasks_on in order]
    dag_seconds = medians(runs, "dag_seconds", "tasks_on", ("connect", "stage_server"))
    return {
        "stage_server_commit": STAGE_SERVER_COMMIT,
        "order": order,
        "runs": runs,
        "median_dag_seconds": dag_seconds,
        "connect/stage_server": round(dag_seconds["connect"] / dag_seconds["stage_server"], 2),
    }
