"""
### brokerlens_collect

`brokerlens collect` every few minutes: topic stats, internal stats and policies from a live
cluster's admin REST API into landing, for the daily DAG to process. Runs only when
`BROKERLENS_ADMIN_URL` is set (token: `BROKERLENS_ADMIN_TOKEN`); the interval is
`BROKERLENS_COLLECT_EVERY_MINUTES` (default 5).
"""

from datetime import timedelta

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from brokerlens import airflow_support as bl

with DAG(
    dag_id="brokerlens_collect",
    schedule=bl.collect_schedule(),
    start_date=bl.start_date(),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=bl.collect_schedule() is None,
    default_args={"owner": "brokerlens", "retries": 1, "retry_delay": timedelta(seconds=30)},
    doc_md=__doc__,
    tags=["brokerlens"],
):
    PythonOperator(
        task_id="collect",
        python_callable=bl.collect_snapshot,
        # A snapshot older than the next one is worthless: never let runs pile up.
        execution_timeout=timedelta(minutes=4),
    )
