"""
### brokerlens_daily

One run per day, for the day that just ended (`{{ ds }}`): **land → validate_bronze →
build_silver → validate_silver → build_gold → alert → report**, each `brokerlens <stage>
[--layer L]` for `{{ ds }}` in its task's own process, as a client of the Spark Connect server of
the `spark_connect_default` connection (`brokerlens connect-server`; `infra/stack.sh` starts
one). Each layer is validated before the next is built from it.

`brokerlens_daily_spark_submit` is the same DAG with each step a `StageSubmitOperator`: its own
spark-submit through the `spark_default` connection (local master by default; a cluster is a
connection change), no Connect server. It is paused at creation; both write the same tables, so
unpause one of the two.

- Catch-up and backfill: `BROKERLENS_START_DATE` (YYYY-MM-DD, default 2026-11-01) is the first
  day, `BROKERLENS_CATCHUP=false` turns catch-up off; to (re)run days:
  `airflow backfill create --dag-id brokerlens_daily --from-date A --to-date B --reprocess-behavior completed`
  (a re-run of a day replaces its partitions and sends no mail twice). The build steps and
  `alert` wait for the previous day's (policies in force, closing dispatch debt, alert state);
  the other steps of different days run in parallel (`BROKERLENS_MAX_ACTIVE_RUNS`, default 4),
  each day a session of its own on the one server.
- A step that fails on its data (a critical expectation) fails at once; other failures are
  retried with exponential back-off. A failed step stops the later ones and mails
  `BROKERLENS_FAILURE_EMAIL` through the `smtp_default` connection.
- Each step declares the tables it writes as assets (`brokerlens.<table>`).
- With `BROKERLENS_PROMETHEUS_URL` set, a first step `collect_prometheus` pulls the day's Pulsar
  series from that Prometheus server into landing (`brokerlens collect --prometheus-url`).
"""

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, CronDataIntervalTimetable

from brokerlens import airflow_support as bl


def daily_dag(dag_id: str, Stage: type, **dag_args) -> DAG:
    with DAG(
        dag_id=dag_id,
        # Data intervals: the run for day D starts after D ends and has logical date D ({{ ds }}).
        schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
        start_date=bl.start_date(),
        catchup=bl.env_flag("BROKERLENS_CATCHUP", True),
        max_active_runs=bl.env_int("BROKERLENS_MAX_ACTIVE_RUNS", 4),
        default_args=bl.default_args(),
        doc_md=__doc__,
        tags=["brokerlens"],
        **dag_args,
    ) as dag:
        land = Stage(stage="land")
        validate_bronze = Stage(stage="validate", layer="bronze")
        build_silver = Stage(stage="build", layer="silver", depends_on_past=True)
        validate_silver = Stage(stage="validate", layer="silver")
        build_gold = Stage(stage="build", layer="gold", depends_on_past=True)
        alert = Stage(stage="alert", depends_on_past=True, connections=[bl.smtp_conn_id()])
        report = Stage(stage="report")

        land >> validate_bronze >> build_silver >> validate_silver >> build_gold >> alert >> report
        if bl.prometheus_url():
            PythonOperator(task_id="collect_prometheus", python_callable=bl.collect_prometheus_day, op_args=["{{ ds }}"]) >> land
    return dag


daily = daily_dag("brokerlens_daily", bl.StageOperator)
# Never unpaused by default, even where DAGs start unpaused: it would run every day a second time.
daily_spark_submit = daily_dag("brokerlens_daily_spark_submit", bl.StageSubmitOperator, is_paused_upon_creation=True)
