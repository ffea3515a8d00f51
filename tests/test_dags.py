"""Every DAG loads without errors, quickly and without side effects, and is wired as designed.

All of it loads Airflow (a DagBag in a new process, or the operators' module), so none of it is
in make test-fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date, datetime, timedelta

import pytest
import yaml

from airflow_harness import JIT_ENV, REPO, airflow_env

pytestmark = pytest.mark.slow

# Loads the DagBag in a fresh process (Airflow reads its configuration once per process) and
# prints what the tests check, as JSON.
DESCRIBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.encoders import coerce_to_core_timetable
from airflow.timetables.base import TimeRestriction

bag = DagBag(dag_folder=sys.argv[1])
out = {"import_errors": {k: str(v) for k, v in bag.import_errors.items()},
       "parse_seconds": {s.file: s.duration.total_seconds() for s in bag.dagbag_stats}, "dags": {}}
for dag_id, dag in bag.dags.items():
    runs, last = [], None
    timetable = coerce_to_core_timetable(dag.timetable)
    if timetable.periodic:
        for _ in range(3):
            info = timetable.next_dagrun_info(
                last_automated_data_interval=last,
                restriction=TimeRestriction(dag.start_date, None, dag.catchup))
            runs.append([info.logical_date.isoformat(), info.data_interval.start.isoformat(),
                         info.data_interval.end.isoformat(), info.run_after.isoformat()])
            last = info.data_interval
    tasks = {}
    for t in dag.tasks:
        tasks[t.task_id] = {
            "classes": [c.__name__ for c in type(t).__mro__],
            "upstream": sorted(t.upstream_task_ids),
            "retries": t.retries,
            "retry_delay": t.retry_delay.total_seconds(),
            "backoff": t.retry_exponential_backoff,
            "max_retry_delay": t.max_retry_delay.total_seconds() if t.max_retry_delay else None,
            "depends_on_past": t.depends_on_past,
            "outlets": [{"name": a.name, "uri": a.uri, "extra": a.extra} for a in t.outlets],
            "conn_id": getattr(t, "_conn_id", None) or getattr(t, "conn_id", None),
            "stage": getattr(t, "stage", None),
            "layer": getattr(t, "layer", None),
            "day": getattr(t, "day", None),
            "connections": list(getattr(t, "connections", [])),
            "application": getattr(t, "application", None),
            "application_args": getattr(t, "application_args", None),
            "conf": getattr(t, "conf", None),
            "on_failure": [f"{c.__module__}.{c.__qualname__}" for c in (t.on_failure_callback or [])],
        }
    out["dags"][dag_id] = {
        "timetable": type(dag.timetable).__name__, "summary": timetable.summary,
        "catchup": dag.catchup, "start_date": dag.start_date.isoformat(),
        "max_active_runs": dag.max_active_runs, "paused_at_creation": dag.is_paused_upon_creation,
        "runs": runs, "tasks": tasks, "doc": bool(dag.doc_md),
    }
from brokerlens.airflow_support import spark_conf  # what a task adds when it runs
out["spark_conf"] = spark_conf()
print(json.dumps(out))
"""


def describe_dags(tmp_path, **env_extra: str) -> dict:
    env = airflow_env(tmp_path / "airflow", tmp_path / "brokerlens-home", 8025, **env_extra)
    (tmp_path / "airflow").mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", DESCRIBE, str(REPO / "dags")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Parsing wrote nothing of brokerlens's: no home, no Spark warehouse or metastore.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["airflow"]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dags(tmp_path_factory):
    return describe_dags(tmp_path_factory.mktemp("dagbag"))


def tables_by_layer() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in (REPO / "schemas" / "tables").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        out.setdefault(doc["layer"], set()).add(doc["name"])
    return out


def test_every_dag_loads_fast_without_errors_or_side_effects(dags):
    assert dags["import_errors"] == {}
    assert set(dags["dags"]) == {"brokerlens_daily", "brokerlens_daily_spark_submit", "brokerlens_collect"}
    files = {p.rsplit("/", 1)[-1]: s for p, s in dags["parse_seconds"].items()}
    assert set(files) == {"brokerlens_daily.py", "brokerlens_collect.py"}
    # Thin DAG files: the DAG processor parses them every 30 s.
    assert all(seconds < 5 for seconds in files.values()), files


def test_daily_dag_graph_and_schedule(dags):
    daily = dags["dags"]["brokerlens_daily"]
    tasks = daily["tasks"]
    # Each layer is validated before the next is built from it.
    order = ["land", "validate_bronze", "build_silver", "validate_silver", "build_gold", "alert", "report"]
    assert set(tasks) == set(order)
    for before, after in zip(order, order[1:]):
        assert tasks[after]["upstream"] == [before]
    assert tasks["land"]["upstream"] == []
    assert daily["timetable"] == "CronDataIntervalTimetable" and daily["summary"] == "0 0 * * *"
    assert daily["catchup"] is True
    assert daily["doc"]
    # Catch-up: one run per day from the start date, each for the day that just ended.
    start = datetime.fromisoformat(daily["start_date"])
    assert start.utcoffset() == timedelta(0) and start.time() == datetime.min.time()
    for i, (logical, begin, end, run_after) in enumerate(daily["runs"]):
        day = start + timedelta(days=i)
        assert datetime.fromisoformat(logical) == day == datetime.fromisoformat(begin)
        assert datetime.fromisoformat(end) == datetime.fromisoformat(run_after) == day + timedelta(days=1)
    # Yesterday's policies (silver), closing debt (gold) and alert states feed today's: the build
    # steps and alert go day by day.
    assert [t for t in order if tasks[t]["depends_on_past"]] == ["build_silver", "build_gold", "alert"]


def _retries_and_failure_mail(task: dict) -> None:
    assert task["retries"] == 2
    assert task["backoff"] == 2.0 and task["retry_delay"] == 120 and task["max_retry_delay"] == 1800
    assert task["on_failure"] == ["brokerlens.airflow_support.notify_failure"]


def test_each_step_is_a_spark_connect_client_with_retries_and_failure_mail(dags):
    tasks = dags["dags"]["brokerlens_daily"]["tasks"]
    for step, task in tasks.items():
        assert task["classes"][0] == "StageOperator" and "SparkSubmitOperator" not in task["classes"]
        assert task["conn_id"] == "spark_connect_default"
        stage, _, layer = step.partition("_")
        assert (task["stage"], task["layer"] or "", task["day"]) == (stage, layer, "{{ ds }}")
        _retries_and_failure_mail(task)
    # Only alert mails: it alone gets the SMTP connection.
    assert {s: t["connections"] for s, t in tasks.items() if t["connections"]} == {"alert": ["smtp_default"]}


def _schedule_and_graph(dag: dict) -> tuple:
    """A DAG's schedule, catch-up and runs, and its steps' order, dependence on the previous day
    and tables: all but how a step runs and whether the DAG starts paused."""
    schedule = {k: v for k, v in dag.items() if k not in ("tasks", "paused_at_creation")}
    return schedule, {step: (t["upstream"], t["depends_on_past"], t["outlets"]) for step, t in dag["tasks"].items()}


def test_the_spark_submit_dag_is_the_same_dag_with_each_step_a_spark_submit_of_the_cli(dags):
    daily, submit = dags["dags"]["brokerlens_daily"], dags["dags"]["brokerlens_daily_spark_submit"]
    # Both write the same tables: the second never starts unpaused.
    assert submit["paused_at_creation"] is True
    assert _schedule_and_graph(submit) == _schedule_and_graph(daily)
    tasks = submit["tasks"]
    for step, task in tasks.items():
        assert "SparkSubmitOperator" in task["classes"]
        assert task["conn_id"] == "spark_default"
        assert task["application"] == str(REPO / "spark" / "brokerlens" / "submit.py")
        stage, _, layer = step.partition("_")
        assert task["application_args"] == [stage, *(["--layer", layer] if layer else []), "--date", "{{ ds }}"]
        _retries_and_failure_mail(task)
        # Spark's conf is made when the task runs (with the task's settings), not when the DAG is parsed.
        assert not task["conf"], task["conf"]
    # The driver's JVM options: brokerlens' own, then the settings' (conftest.py's JIT_ENV).
    from brokerlens.platform.spark import java_options

    driver_options = dags["spark_conf"]["spark.driver.extraJavaOptions"]
    assert "-Duser.timezone=UTC" in java_options() and driver_options == f"{java_options()} {os.environ[JIT_ENV]}".strip(), driver_options
    assert {s: t["connections"] for s, t in tasks.items() if t["connections"]} == {"alert": ["smtp_default"]}


def test_each_step_declares_the_tables_it_writes_as_assets(dags):
    tasks = dags["dags"]["brokerlens_daily"]["tasks"]
    layers = tables_by_layer()
    outlets = {stage: {a["name"] for a in t["outlets"]} for stage, t in tasks.items()}
    named = lambda tables: {f"brokerlens.{t}" for t in tables}  # noqa: E731
    assert outlets["land"] == named(layers["bronze"])
    assert outlets["validate_bronze"] == outlets["validate_silver"] == named({"validation_results"})
    assert outlets["build_silver"] == named(layers["silver"])
    gold = layers["gold"] | layers["state"]
    assert outlets["build_gold"] == named(gold - {"alert_notifications", "validation_results"})
    # alert records what it sent and marks the day's alerts as notified.
    assert outlets["alert"] == named({"alert_notifications", "hole_alerts"})
    assert outlets["report"] == {"brokerlens.daily_report"}
    every_table = set().union(*layers.values())
    assert set().union(*outlets.values()) == named(every_table) | {"brokerlens.daily_report"}
    # Named by the table, located by the lake (the same in every environment).
    for task in tasks.values():
        for asset in task["outlets"]:
            table = asset["name"].removeprefix("brokerlens.")
            if table in every_table:
                assert asset["uri"] == f"x-brokerlens://lake/{table}"
                assert asset["extra"] == {"layer": next(k for k, v in layers.items() if table in v)}
            else:
                assert asset["uri"] == "x-brokerlens://reports/daily_report"


def test_start_date_and_catchup_are_configurable(tmp_path):
    daily = describe_dags(tmp_path, BROKERLENS_START_DATE="2026-10-05", BROKERLENS_CATCHUP="false", BROKERLENS_DAG_RETRIES="0")["dags"]["brokerlens_daily"]
    assert daily["start_date"] == "2026-10-05T00:00:00+00:00"
    assert daily["catchup"] is False
    assert {t["retries"] for t in daily["tasks"].values()} == {0}
    # Without catch-up the first run is for yesterday, not for the start date.
    first_day = datetime.fromisoformat(daily["runs"][0][0]).date()
    assert first_day >= date.today() - timedelta(days=2)


def test_collection_dag_runs_only_with_a_cluster_url(dags, tmp_path):
    off = dags["dags"]["brokerlens_collect"]
    assert off["timetable"] == "NullTimetable" and off["paused_at_creation"] is True
    assert list(off["tasks"]) == ["collect"]
    on = describe_dags(tmp_path, BROKERLENS_ADMIN_URL="http://broker-1:8080")["dags"]["brokerlens_collect"]
    assert on["summary"] == "*/5 * * * *" and on["paused_at_creation"] is False
    assert on["catchup"] is False and on["max_active_runs"] == 1
    # Every 5 minutes, the next one right after the previous.
    starts = [datetime.fromisoformat(r[3]) for r in on["runs"]]
    assert [b - a for a, b in zip(starts, starts[1:])] == [timedelta(minutes=5)] * 2


def test_daily_dag_pulls_prometheus_first_when_configured(dags, tmp_path):
    assert "collect_prometheus" not in dags["dags"]["brokerlens_daily"]["tasks"]
    daily = describe_dags(tmp_path, BROKERLENS_PROMETHEUS_URL="http://prometheus:9090")["dags"]["brokerlens_daily"]
    assert daily["tasks"]["land"]["upstream"] == ["collect_prometheus"]
    assert daily["tasks"]["collect_prometheus"]["upstream"] == []


def test_an_operators_conf_goes_over_ours_and_adds_to_the_drivers_jvm_options():
    """A task's Spark conf (spark_conf): the operator's conf wins, but its driver JVM options come
    after brokerlens' (the log setup, UTC, then the settings': conftest.py's JIT_ENV), not instead
    of them."""
    from brokerlens.airflow_support import spark_conf
    from brokerlens.platform.spark import java_options
    from brokerlens.settings import reload_settings

    reload_settings()  # this process's environment, whatever an earlier test cached
    ours = spark_conf()["spark.driver.extraJavaOptions"].split()
    conf = spark_conf({"spark.driver.extraJavaOptions": "-Xss4m -Duser.timezone=UTC", "spark.executor.memory": "2g"})
    assert ours == [*java_options().split(), *os.environ[JIT_ENV].split()], ours
    assert ours[0].startswith("-Dlog4j2.configurationFile=file:") and "-Duser.timezone=UTC" in ours
    assert conf["spark.driver.extraJavaOptions"].split() == [*ours, "-Xss4m", "-Duser.timezone=UTC"]
    assert conf["spark.executor.memory"] == "2g" and set(conf) == {"spark.driver.extraJavaOptions", "spark.executor.memory"}


def test_a_task_masks_brokerlens_secrets_in_its_log(monkeypatch):
    """A stage run in the task's process (StageOperator) hands its settings' and connections'
    secrets to Airflow's masker, which filters every line the task logs."""
    from airflow.sdk.log import _secrets_masker

    from brokerlens.airflow_support import mask_secrets
    from brokerlens.settings import Settings

    Settings(admin_token="tok-7031")
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", "smtp://ops:conn-pw-2290@relay:587")
    line = "GET /admin/v2 with tok-7031 then smtp conn-pw-2290"
    assert _secrets_masker().redact(line) == line  # neither is known to Airflow by itself
    mask_secrets()
    masked = _secrets_masker().redact(line)
    assert "tok-7031" not in masked and "conn-pw-2290" not in masked and masked.startswith("GET /admin/v2 with ")


def test_a_spark_submit_that_failed_on_its_data_is_not_retried():
    """StageSubmitOperator: the exit code of a stage that failed on its data (the CLI's for
    StageFailed, test_alerting) fails the task at once, with the stage's summary; any other exit
    is retried. (The daily DAG's failing step, end to end, runs on Spark Connect: test_daily_dag_e2e.)"""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from brokerlens.airflow_support import STAGE_FAILED_EXIT, StageSubmitOperator

    task = StageSubmitOperator(stage="validate", layer="bronze")
    with pytest.raises(AirflowFailException) as data:
        task._fail(STAGE_FAILED_EXIT, "bronze_policies: expect_column_values_to_be_in_set(kind) failed on 2 of 5 rows")
    assert str(data.value) == "validate failed (not retried):\nbronze_policies: expect_column_values_to_be_in_set(kind) failed on 2 of 5 rows"
    for code, said in ((3, " (exit code 3)"), (None, "")):
        with pytest.raises(AirflowException) as other:
            task._fail(code, "Py4JError: the JVM went away")
        assert not isinstance(other.value, AirflowFailException) and str(other.value) == f"validate failed{said}:\nPy4JError: the JVM went away"
