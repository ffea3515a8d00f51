"""The producers build step: ``producer_lint``, ``producer_health`` and, when publish-rate limits
are configured, ``publish_rate_conformance`` for one day of producer snapshots."""

from __future__ import annotations

import logging
from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.gold.producers.settings import ProducersStepSettings
from brokerlens.platform.frames import empty_frame
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.spark import persisted
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, write_table

from .config import configurations, with_config_hash
from .health import broker_view, health
from .lint import lint
from .publish_rate import publish_conformance

log = logging.getLogger(__name__)


def build_producers(spark: SparkSession, day: date, settings: ProducersStepSettings) -> StageResult:
    result = StageResult("producers", day)
    config = settings.producers

    def write(df: DataFrame, table: str) -> None:
        columns = table_schema(table).column_names  # working columns stay behind
        result.writes.append(write_table(df.select(*columns), table, mode="replace", partitions=[{"day": day}], settings=settings))

    day_snapshots = read_table("producer_snapshots", spark=spark, settings=settings).where(F.col("day") == F.lit(day)).transform(with_config_hash)
    with persisted(day_snapshots) as snapshots, persisted(lint(configurations(snapshots))) as findings:
        write(findings, "producer_lint")
        if snapshots.isEmpty():
            # Many clusters land no producer stats: health, which reads the day's topic stats for the
            # brokers' view of each producer, is not planned for no rows (the step on the large day's
            # first 5 minutes, warm, 5 runs each: 1.2-1.9 s against 2.4-2.9 s).
            write(empty_frame("producer_health", spark), "producer_health")
        else:
            brokers = broker_view(read_table("bronze_topic_stats", spark=spark, settings=settings).where(F.col("day") == F.lit(day)))
            write(health(snapshots, findings, brokers, config), "producer_health")
        conformance_rows = publish_conformance(snapshots, config)
        if conformance_rows is not None:
            write(conformance_rows, "publish_rate_conformance")
        by_rule = {r["rule"]: r["n"] for r in findings.groupBy("rule").agg(F.count(F.lit(1)).alias("n")).collect()}
    result.metrics["producer_lint_rows"] = sum(by_rule.values())
    log.info("producer lint %s: %d findings %s", day, sum(by_rule.values()), by_rule)
    if by_rule:
        result.lines.append("producer lint: " + ", ".join(f"{rule} {n}" for rule, n in sorted(by_rule.items())))
    return result
