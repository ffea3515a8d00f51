"""Report section "Data-quality results": each table's latest Great Expectations run of the day
from validation_results, failed expectations first (critical before warning)."""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.times import first

from .blocks import Number, Section, Table, day_rows, fmt, hhmm, limited


def quality_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "quality",
        "Data-quality results",
        "Great Expectations suites run by `brokerlens validate` on the day's partitions (each table's "
        "latest run of the day; every run is kept in validation_results). A failed critical expectation "
        "stops the pipeline; a failed warning is reported.",
    )
    from pyspark.sql import Window

    results = day_rows(spark, "validation_results", day, settings, keep=True)
    # Per table: the daily DAG validates bronze and silver in two runs.
    latest = (
        results.withColumn("_last_run", F.max("run_at").over(Window.partitionBy("table_name"))).where(F.col("run_at") == F.col("_last_run")).drop("_last_run")
    )
    if latest.isEmpty():
        section.empty = f"No data-quality results for {day}: `brokerlens validate` has not run for this day."
        headline.append(Number("failed expectations", "no data"))
        return section
    s = first(
        latest.agg(
            F.count(F.lit(1)).alias("expectations"),
            F.countDistinct("table_name").alias("tables"),
            F.sum(F.when(~F.col("success") & (F.col("severity") == "critical"), 1).otherwise(0)).alias("critical"),
            F.sum(F.when(~F.col("success") & (F.col("severity") != "critical"), 1).otherwise(0)).alias("warning"),
            F.max("run_at").alias("run_at"),
        )
    )
    failed = s["critical"] + s["warning"]
    section.numbers = [
        Number("expectations checked", fmt(s["expectations"])),
        Number("tables validated", fmt(s["tables"])),
        Number("critical failed", fmt(s["critical"]), "bad" if s["critical"] else "good"),
        Number("warnings failed", fmt(s["warning"]), "bad" if s["warning"] else ""),
        Number("run at (UTC)", hhmm(s["run_at"])),
    ]
    headline.append(Number("failed expectations", fmt(failed), "bad" if failed else "good"))
    rows, more = limited(
        latest.where(~F.col("success")).orderBy(F.when(F.col("severity") == "critical", 0).otherwise(1), "table_name", "expectation", "column_name"),
        settings.report.max_rows,
    )
    section.tables.append(
        Table(
            ["table", "expectation", "column", "severity", "rows", "unexpected", "detail"],
            [
                [r["table_name"], r["expectation"], r["column_name"] or "—", r["severity"], fmt(r["rows"]), fmt(r["unexpected_count"]), r["detail"] or "—"]
                for r in rows
            ],
            numeric={4, 5},
            prose={6},
            caption="Failed expectations, critical first.",
            more=more,
        )
        if rows
        else Table(["result"], [[f"All {s['expectations']:,} expectations on {s['tables']:,} tables held."]])
    )
    per_table = (
        latest.groupBy("table_name")
        .agg(
            F.count(F.lit(1)).alias("expectations"),
            F.sum(F.when(F.col("success"), 0).otherwise(1)).alias("failed"),
            F.max("rows").alias("rows"),
        )
        .orderBy(F.desc("failed"), "table_name")
    )
    tables, more = limited(per_table, settings.report.max_rows)
    section.tables.append(
        Table(
            ["table", "expectations", "failed", "rows"],
            [[t["table_name"], fmt(t["expectations"]), fmt(t["failed"]), fmt(t["rows"])] for t in tables],
            numeric={1, 2, 3},
            caption="Per table.",
            more=more,
        )
    )
    return section
