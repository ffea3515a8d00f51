"""How a brokerlens stage becomes an Airflow task; the DAG files in ``dags/`` only wire these.

- :class:`StageOperator` runs ``brokerlens <stage> [--layer L]`` for ``{{ ds }}`` in the task's
  own process, as a client of the Spark Connect server of the ``spark_connect_default``
  connection (``brokerlens connect-server``, which ``infra/stack.sh`` starts): the stage's code,
  settings, logs and progress are the task's, the JVM and its warm caches the server's. Its Spark
  jobs carry a tag of the task's, by which a killed task's jobs are interrupted; tasks of
  different days are sessions of their own and run at once.
- :class:`StageSubmitOperator` runs the same command with spark-submit instead
  (``brokerlens/submit.py``), a driver per task: the master comes from the ``spark_default``
  connection, so moving to a cluster changes the connection, not the code. The stage's summary
  (rows in and out, quarantined, alerts sent) is on the command's stdout, which the operator
  copies to the task log.
- :func:`stage_assets`: the Delta tables a step writes, as Airflow assets, so that other DAGs
  can be scheduled on them (``schedule=[Asset.ref(name="brokerlens.hole_alerts")]``).
- :func:`notify_failure`: the ``on_failure_callback``, one mail through the SMTP connection.
- Connections live in Airflow (secrets backend, metastore or environment): a stage that needs
  one (``alert``: SMTP) gets it as an ``AIRFLOW_CONN_*`` variable of its own process.

Importing this module reads the table schemas and nothing else: no database, Spark or network.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from html import escape
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from brokerlens.platform.schemas import table_schemas
from brokerlens.settings import get_settings

log = logging.getLogger(__name__)

SUBMIT_APP = Path(__file__).with_name("submit.py")
# brokerlens/submit.py exit code for StageFailed: the data will not change on a retry.
STAGE_FAILED_EXIT = 1

SPARK_CONN_ID = "spark_default"
SPARK_CONNECT_CONN_ID = "spark_connect_default"

# Which steps (stage, or stage_layer for a stage run one layer at a time) write a table follows
# from its layer in schemas/tables/*.yaml; the exceptions are named here (validate keeps its
# results; alert records what it sent and marks the day's hole_alerts as notified).
_LAYER_STAGES = {
    "bronze": ("land",),
    "silver": ("build", "build_silver"),
    "gold": ("build", "build_gold"),
    "state": ("build", "build_gold"),
}
_TABLE_STAGES = {
    "validation_results": ("validate", "validate_bronze", "validate_silver"),
    "alert_notifications": ("alert",),
    "hole_alerts": ("build", "build_gold", "alert"),
}
REPORT_ASSET = Asset(name="brokerlens.daily_report", uri="x-brokerlens://reports/daily_report")


def table_asset(table: str) -> Asset:
    """The asset of a brokerlens table: named by the table, located by the lake (not a path,
    which differs between a laptop and production)."""
    return Asset(
        name=f"brokerlens.{table}",
        uri=f"x-brokerlens://lake/{table}",
        extra={"layer": table_schemas()[table].layer},
    )


def stage_tables(stage: str) -> list[str]:
    return sorted(name for name, schema in table_schemas().items() if stage in _TABLE_STAGES.get(name, _LAYER_STAGES.get(schema.layer, ())))


def stage_assets(stage: str) -> list[Asset]:
    assets = [table_asset(t) for t in stage_tables(stage)]
    return assets + [REPORT_ASSET] if stage == "report" else assets


def start_date() -> datetime:
    """First day the daily DAG processes (``BROKERLENS_START_DATE``, YYYY-MM-DD)."""
    day = datetime.strptime(os.environ.get("BROKERLENS_START_DATE", "2026-11-01"), "%Y-%m-%d")
    return day.replace(tzinfo=timezone.utc)


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def spark_conf(given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings every stage needs whatever the cluster: brokerlens's own driver JVM
    options (``java_options``: the quiet log4j setup in client mode, UTC, the compiler's), and the
    settings' ``spark.driver_java_options``; then ``given``
    (an operator's ``conf``) over them, but for the driver's JVM options, which are added after
    ours rather than replacing them (a later ``-D`` of the same name wins in the JVM; without
    ours the driver would lose UTC and the log setup). The rest comes from the connection and
    spark-defaults.conf."""
    from brokerlens.platform.spark import java_options

    given = dict(given or {})
    java_opts = " ".join(o for o in (java_options(), get_settings().spark.driver_java_options, given.pop(DRIVER_JAVA_OPTIONS, "")) if o.strip())
    return {DRIVER_JAVA_OPTIONS: java_opts, **given}


def with_session_jars(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` plus brokerlens' own JAR and the Delta Lake JARs (fetched or built once, then from
    the local cache); Delta's not when the deployment already supplies them
    (``spark.jars.packages`` naming Delta, e.g. on a cluster whose spark-defaults.conf has them)."""
    from brokerlens.platform.jars import delta_jars, jvm_jar

    ours = [] if "io.delta:" in conf.get("spark.jars.packages", "") else delta_jars()
    jars = [j for j in conf.get("spark.jars", "").split(",") if j] + [str(p) for p in [*ours, jvm_jar()]]
    return {**conf, "spark.jars": ",".join(jars)}


def _tee(lines: Iterable[str], tail: deque[str]) -> Iterator[str]:
    for line in lines:
        tail.append(line.rstrip("\n"))
        yield line


def _step_defaults(stage: str, layer: str | None, kwargs: dict[str, Any]) -> str:
    """A step's name (``<stage>_<layer>`` when it runs one layer), and in ``kwargs`` its task id
    and the tables it writes as outlets, unless given; either operator's."""
    step = f"{stage}_{layer}" if layer else stage
    kwargs.setdefault("task_id", step)
    kwargs.setdefault("outlets", stage_assets(step))
    return step


class StageOperator(BaseOperator):
    """``brokerlens <stage> [--layer <layer>]`` for ``{{ ds }}`` in this task's process, on the
    Spark Connect server of the ``conn_id`` connection (a ``spark_connect`` connection: host,
    port, and a token for a server behind an authenticating proxy); the task is named
    ``<stage>_<layer>`` when it runs one layer.

    A stage that fails on its data (``StageFailed``, e.g. a critical expectation) fails the task
    at once with the stage's own summary as the error; any other failure (a lost server, a
    network error) is retried with back-off. A killed task interrupts its Spark jobs.
    """

    template_fields = ("day",)

    def __init__(self, *, stage: str, layer: str | None = None, connections: Iterable[str] = (), conn_id: str = SPARK_CONNECT_CONN_ID, **kwargs: Any) -> None:
        _step_defaults(stage, layer, kwargs)
        super().__init__(**kwargs)
        self.stage, self.layer, self.connections, self.conn_id = stage, layer, tuple(connections), conn_id
        self.day = "{{ ds }}"
        self._spark: Any = None
        self._tag = ""

    def execute(self, context: Any) -> None:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from brokerlens.pipeline import run_stage
        from brokerlens.platform.spark import connect
        from brokerlens.platform.stage import StageFailed

        # The stage finds its connections (alert: SMTP) where a command would, in the environment.
        os.environ.update(connection_environ(self.connections))
        settings = get_settings()
        mask_secrets()
        day = datetime.strptime(self.day, "%Y-%m-%d").date()
        self._spark = connect(SparkConnectHook(self.conn_id).get_connection_url(), settings)
        self._tag = f"brokerlens-{self.task_id}-{self.day}-{uuid.uuid4().hex[:8]}"
        self._spark.addTag(self._tag)
        self.log.info("brokerlens %s %s on Spark Connect (%s), jobs tagged %s", self.task_id, self.day, self.conn_id, self._tag)
        try:
            result = run_stage(self.stage, day, settings, self._spark, **({"layer": self.layer} if self.layer else {}))
        except StageFailed as exc:
            raise AirflowFailException(f"{self.stage} failed (not retried):\n{exc}") from None
        finally:
            self._spark.removeTag(self._tag)
        for line in result.render().splitlines():
            self.log.info("%s", line)

    def on_kill(self) -> None:
        """Interrupt the stage's running Spark jobs, then end the session: a stage's other
        threads would otherwise go on to start new ones while the task is being stopped."""
        if self._spark is not None:
            self._spark.interruptTag(self._tag)
            self._spark.stop()


class StageSubmitOperator(SparkSubmitOperator):
    """``brokerlens <stage> [--layer <layer>] --date {{ ds }}`` through spark-submit; the task
    is named ``<stage>_<layer>`` when it runs one layer.

    A stage that fails on its data (exit code 1, e.g. a critical expectation) fails the task at
    once with the stage's own summary as the error; any other failure (a lost JVM, a busy
    cluster) is retried with back-off.
    """

    def __init__(self, *, stage: str, layer: str | None = None, connections: Iterable[str] = (), **kwargs: Any) -> None:
        step = _step_defaults(stage, layer, kwargs)
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        super().__init__(
            application=str(SUBMIT_APP),
            application_args=[stage, *(["--layer", layer] if layer else []), "--date", "{{ ds }}"],
            name=f"brokerlens-{step}-{{{{ ds }}}}",
            **kwargs,
        )
        self.stage = stage
        self.connections = tuple(connections)

    def execute(self, context: Any) -> None:
        tail: deque[str] = deque(maxlen=60)
        if self.connections:
            self.env_vars = {**(self.env_vars or {}), **self._connection_env()}
        # At run time, not when the DAG is parsed: the first run may fetch the JARs, and the
        # settings (spark.driver_java_options) are the task's, not the DAG processor's. A conf
        # given to the operator goes over ours (spark_conf).
        self.conf = with_session_jars(spark_conf(self.conf))
        self._hook = self._get_hook()
        process_log = self._hook._process_spark_submit_log
        # Keep the end of the command's output: the CLI's error summary goes into the failure mail.
        self._hook._process_spark_submit_log = lambda itr: process_log(_tee(itr, tail))  # type: ignore[method-assign]
        try:
            super().execute(context)
            return
        except AirflowException:
            process = self._hook._submit_sp
            returncode = process.returncode if process is not None else None
        # Raised outside the handler: the reason is the stage's own error line, not spark-submit's
        # command line and a second traceback (the hook's exception says only "Error code is: N").
        self._fail(returncode, _error_summary(tail))

    def _fail(self, returncode: int | None, summary: str) -> None:
        if returncode == STAGE_FAILED_EXIT:
            raise AirflowFailException(f"{self.stage} failed (not retried):\n{summary}")
        code = f" (exit code {returncode})" if returncode is not None else ""
        raise AirflowException(f"{self.stage} failed{code}:\n{summary}")

    def _connection_env(self) -> dict[str, str]:
        """The stage's connections (e.g. SMTP for ``alert``) for the spark-submit process, as
        ``AIRFLOW_CONN_*`` variables of that process only (brokerlens.deliver.mail reads them there).
        Only for a driver on this machine: on YARN or Kubernetes, or in cluster deploy mode,
        variables travel on the command line, so there the stage uses its own settings."""
        spark = SparkSubmitHook(conn_id=self._conn_id)._connection
        remote = spark["deploy_mode"] == "cluster" or spark["master"].startswith(("yarn", "k8s"))
        if remote:
            log.warning("%s: not passing connections %s to a remote driver", self.stage, self.connections)
            return {}
        return connection_environ(self.connections)


def mask_secrets() -> None:
    """brokerlens' secrets (its settings', its connections') masked by Airflow's own masker in
    whatever the task logs, brokerlens' lines and Airflow's (an exception's text): a stage run in
    the task's process has no brokerlens command around it to filter its output."""
    from airflow.sdk.log import mask_secret

    from brokerlens.platform.redact import known_secrets

    for secret in known_secrets():
        mask_secret(secret)


def _error_summary(tail: Iterable[str]) -> str:
    """From the CLI's ``error:`` line on (its readable summary), else the last lines of output."""
    lines = list(tail)
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    return "\n".join(lines[starts[-1] :] if starts else lines[-20:])


def default_args() -> dict[str, Any]:
    return {
        "owner": "brokerlens",
        "retries": env_int("BROKERLENS_DAG_RETRIES", 2),
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
        "execution_timeout": timedelta(hours=4),
        "on_failure_callback": notify_failure,
    }


def failure_recipients() -> list[str]:
    """``BROKERLENS_FAILURE_EMAIL`` (comma-separated), else the alerts' default group."""
    explicit = os.environ.get("BROKERLENS_FAILURE_EMAIL")
    if explicit:
        return [a.strip() for a in explicit.split(",") if a.strip()]
    return list(get_settings().alerts.default_group.to)


def failure_message(context: dict[str, Any]) -> tuple[str, str, str]:
    """(subject, plain text, html) of the failure notification."""
    ti = context["ti"]
    day = context.get("ds") or "-"
    error = str(context.get("exception") or "unknown error")
    subject = f"[brokerlens] {ti.dag_id} {day}: {ti.task_id} failed"
    facts = [
        ("DAG", ti.dag_id),
        ("step", ti.task_id),
        ("day", day),
        ("run", ti.run_id),
        ("try", str(ti.try_number)),
        ("log", getattr(ti, "log_url", "")),
    ]
    downstream = sorted(context["task"].get_flat_relative_ids(upstream=False))
    note = f"Not run: {', '.join(downstream)}." if downstream else ""
    text = "\n".join([f"{k}: {v}" for k, v in facts] + ["", error, "", note]).strip() + "\n"
    rows = "".join(f"<tr><th align=left>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    html = f"<html><body><table>{rows}</table><pre>{escape(error)}</pre><p>{escape(note)}</p></body></html>"
    return subject, text, html


def connection_environ(conn_ids: Iterable[str]) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` variables for these connections, from wherever Airflow keeps them
    (secrets backend, metastore, environment); missing connections are left out."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    environ = {}
    for conn_id in conn_ids:
        try:
            environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = BaseHook.get_connection(conn_id).as_json()
        except AirflowNotFoundException:
            log.info("no Airflow connection %s: brokerlens settings apply", conn_id)
    return environ


def notify_failure(context: dict[str, Any]) -> None:
    """Mail which step failed, for which day, why, and what did not run, through the SMTP
    connection (brokerlens.deliver.mail: the same lookup and transport as the alert mails)."""
    from brokerlens.deliver import mail

    settings = get_settings()
    target = mail.smtp_target(settings, {**os.environ, **connection_environ([settings.smtp.smtp_conn_id])})
    subject, text, html = failure_message(context)
    message = mail.build_message(subject, target.mail_from, failure_recipients(), text, html)
    with mail.smtp_session(target) as client:
        mail.send(client, target, message)
    log.info("failure notification sent to %s via %s: %s", message["To"], target, subject)


def smtp_conn_id() -> str:
    return get_settings().smtp.smtp_conn_id


def collect_schedule() -> str | None:
    """Every ``BROKERLENS_COLLECT_EVERY_MINUTES`` (default 5) when a cluster admin URL is
    configured (``BROKERLENS_ADMIN_URL``); otherwise the collection DAG never runs by itself."""
    if not os.environ.get("BROKERLENS_ADMIN_URL"):
        return None
    return f"*/{env_int('BROKERLENS_COLLECT_EVERY_MINUTES', 5)} * * * *"


def collect_snapshot() -> None:
    """One ``brokerlens collect`` (HTTP only, no Spark), its summary in the task log."""
    from brokerlens.pipeline import run_stage

    log.info("%s", run_stage("collect", None, get_settings()).render())


def prometheus_url() -> str | None:
    """``BROKERLENS_PROMETHEUS_URL``: when set, the daily DAG first pulls the day's Pulsar series
    from that Prometheus server (``brokerlens collect --prometheus-url``)."""
    return os.environ.get("BROKERLENS_PROMETHEUS_URL") or None


def collect_prometheus_day(ds: str) -> None:
    """``brokerlens collect --prometheus-url URL --date ds`` (HTTP only, no Spark); the step is
    ``BROKERLENS_PROMETHEUS_STEP_SECONDS`` (default 60, the scrape interval)."""
    from brokerlens.pipeline import run_stage

    step = env_int("BROKERLENS_PROMETHEUS_STEP_SECONDS", 60)
    day = datetime.strptime(ds, "%Y-%m-%d").date()
    log.info("%s", run_stage("collect", day, get_settings(), prometheus_url=prometheus_url(), step_seconds=step).render())
