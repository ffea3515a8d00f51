"""Every example query in docs/queries.md runs, as written, on a demo day, and answers its question.

The demo day is yesterday (UTC) because the examples say `date_sub(current_date(), 1)`. Each
answer is checked against the same question asked of the tables with the DataFrame API.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from brokerlens.deliver.query import run_sql
from brokerlens.pipeline import DAILY_STEPS, run_stage
from brokerlens.platform.tables import read_table

QUERIES = Path(__file__).resolve().parents[1] / "docs" / "queries.md"


def doc_queries() -> list[tuple[str, str]]:
    """(heading, SQL) of every ```sql block, in page order."""
    out, heading = [], None
    for m in re.finditer(r"^## (?P<h>.+?)$|^```sql\n(?P<sql>.*?)^```$", QUERIES.read_text(), re.M | re.S):
        if m.group("h"):
            heading = m.group("h").strip()
        else:
            out.append((heading, m.group("sql").strip()))
    return out


def last_snapshots(spark, day, settings):
    w = Window.partitionBy("cluster", "topic", "subscription").orderBy(F.desc("snapshot_at"))
    return read_table("cursor_ranges", settings=settings, spark=spark).where(F.col("day") == day).withColumn("n", F.row_number().over(w)).where("n = 1")


def keys(rows, *names):
    return sorted(tuple(r[n] for n in names) for r in rows)


@pytest.mark.slow
@pytest.mark.heavy
def test_every_example_query_runs_on_a_demo_day(spark, settings):
    day = datetime.now(timezone.utc).date() - timedelta(days=1)
    run_stage("demo-data", day, settings, scale=0.01, seed=7)
    for stage, layer in DAILY_STEPS[:5]:  # land to build gold, each layer validated
        run_stage(stage, day, settings, spark, **({"layer": layer} if layer else {}))

    queries = doc_queries()
    assert len(queries) >= 10 and len({h for h, _ in queries}) == len(queries) - 1
    answers: dict[str, list] = {}
    for heading, sql in queries:
        columns, rows = run_sql(spark, sql, settings=settings)  # as written, trailing semicolon included
        assert columns, heading
        answers.setdefault(heading, rows)
    on_day = lambda name: read_table(name, settings=settings, spark=spark).where(F.col("day") == day)  # noqa: E731

    worst = answers["Worst over-delivery yesterday"]
    over = on_day("dispatch_daily").where("periods_over > 0")
    assert worst, "the demo day has over-delivery"
    assert len(worst) == min(10, over.count())
    assert worst[0]["excess_msgs"] == over.agg(F.max("excess_msgs")).first()[0]
    assert [r["excess_msgs"] for r in worst] == sorted((r["excess_msgs"] for r in worst), reverse=True)

    hours = answers["When in the day the worst subscription went over"]
    assert hours
    topic, subscription = hours[0]["topic"], hours[0]["subscription"]
    daily = on_day("dispatch_daily").where((F.col("level") == "subscription") & (F.col("topic") == topic) & (F.col("subscription") == subscription)).first()
    assert sum(r["over_msgs"] for r in hours) == daily["excess_msgs"]
    assert max(r["max_debt_msgs"] for r in hours) == daily["max_debt_msgs"]
    assert sum(r["periods_starved"] for r in hours) == daily["periods_starved"]

    debts = answers["Scopes still in debt at the end of yesterday"]
    assert len(debts) == on_day("debt_state").where("debt_msgs > 0 OR debt_bytes > 0").count()

    last = last_snapshots(spark, day, settings)
    soon = answers["Subscriptions that will reach the cap within a day"]
    expected = last.where((F.col("ranges") < F.col("cap")) & (F.col("hours_to_cap") <= 24)).collect()
    assert soon and keys(soon, "topic", "subscription") == keys(expected, "topic", "subscription")
    assert all(r["ranges"] < r["cap"] and r["hours_to_cap"] <= 24 for r in soon)

    over_cap = answers["Subscriptions over the cap, and what a topic reload would redeliver"]
    expected = last.where(F.col("ranges") > F.col("cap")).collect()
    assert over_cap and keys(over_cap, "topic", "subscription") == keys(expected, "topic", "subscription")
    assert all(r["over_cap"] == r["ranges"] - r["cap"] for r in over_cap)

    alerts = answers["Open hole-risk alerts and who was told"]
    assert {(r["topic"], r["subscription"]) for r in over_cap} <= {(r["topic"], r["subscription"]) for r in alerts}
    assert all(r["state"] != "resolved" for r in alerts)
    assert {r["severity"] for r in alerts if (r["topic"], r["subscription"]) in keys(over_cap, "topic", "subscription")} == {"critical"}

    never_fill = answers["Producers whose batches never fill"]
    health = on_day("producer_health").where("batch_fill_ratio < 0.5")
    assert never_fill and {r["producer_name"] for r in never_fill} == {r["producer_name"] for r in health.collect()}
    assert all(r["msgs_per_batch"] < 0.5 * r["batching_max_messages"] + 0.05 for r in never_fill)

    lint = answers["Every producer lint finding, with the setting to change"]
    assert lint and len(lint) == on_day("producer_lint").count()

    limits = answers["Where a subscription's dispatch limit came from"]
    assert limits and all(r["msg_source"] in {"topic-policy", "namespace-policy", "broker-config", "default"} for r in limits)

    checks = answers["Did yesterday's data pass its checks?"]
    results = on_day("validation_results")
    latest = results.withColumn("last", F.max("run_at").over(Window.partitionBy("table_name"))).where(F.col("run_at") == F.col("last"))
    assert {r["table_name"] for r in checks} >= {"bronze_dispatch", "dispatch_intervals"}  # both runs
    assert checks and sum(r["expectations"] for r in checks) == latest.count()
    assert sum(r["failed"] for r in checks) == latest.where("NOT success").count()
    assert {r["table_name"] for r in checks} == {r["table_name"] for r in latest.select("table_name").collect()}

    quarantined = answers["What was quarantined yesterday, and why"]
    assert quarantined and sum(r["records"] for r in quarantined) == on_day("quarantine").count()
    # The second block of that section lists the records of one reason.
    negative = run_sql(spark, queries[-1][1], settings=settings)[1]
    assert len(negative) == on_day("quarantine").where("reason = 'negative-counter'").count()
