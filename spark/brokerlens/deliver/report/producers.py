"""Report section "Producer lint findings": producer configurations checked against the
relations (batchingMaxMessages, maxPendingMessages, memoryLimit, blockIfQueueFull) and how the
producers behaved over the day (batch fill, saturated pending queue, send failures)."""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.times import first

from .blocks import Number, Section, Table, day_rows, fmt, limited, pct, short_topic


def producer_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "producers",
        "Producer lint findings",
        "Producer configurations checked against the relations (batch size against the "
        "pending queue, pending messages across partitions, memory limit, batch bytes, partition "
        "switch frequency, blockIfQueueFull), and how the producers behaved over the day.",
    )
    lint = day_rows(spark, "producer_lint", day, settings, keep=True)
    health = day_rows(spark, "producer_health", day, settings, keep=True)
    s = first(
        lint.agg(
            F.sum(F.when(F.col("severity") == "error", 1).otherwise(0)).alias("errors"),
            F.sum(F.when(F.col("severity") == "warning", 1).otherwise(0)).alias("warnings"),
            F.countDistinct("cluster", "topic", "producer_name").alias("producers_flagged"),
        )
    )
    h = first(
        health.agg(
            F.count(F.lit(1)).alias("producers"),
            F.sum("send_failed").alias("send_failed"),
            F.sum(F.when(F.col("batch_fill_ratio") < 0.5, 1).otherwise(0)).alias("underfilled"),
        )
    )
    if not h["producers"] and not s["producers_flagged"]:
        section.empty = f"No producer data for {day}: producer_health and producer_lint have no rows for this day."
        headline.append(Number("producers with lint findings", "no data"))
        return section
    errors, warnings = s["errors"] or 0, s["warnings"] or 0
    section.numbers = [
        Number("producers seen", fmt(h["producers"])),
        Number("producers with findings", fmt(s["producers_flagged"]), "bad" if s["producers_flagged"] else "good"),
        Number("errors", fmt(errors), "bad" if errors else ""),
        Number("warnings", fmt(warnings)),
        Number("batches under half full", fmt(h["underfilled"] or 0)),
        Number("send failures", fmt(h["send_failed"] or 0), "bad" if h["send_failed"] else ""),
    ]
    headline.append(section.numbers[1])
    rows, more = limited(
        lint.orderBy(F.when(F.col("severity") == "error", 0).otherwise(1), "topic", "producer_name", "rule"),
        settings.report.max_rows,
    )
    section.tables.append(
        Table(
            ["producer", "topic", "severity", "rule", "setting", "configured", "suggested", "why"],
            [
                [r["producer_name"], short_topic(r["topic"]), r["severity"], r["rule"], r["setting"], r["configured"], r["suggested"], r["message"]]
                for r in rows
            ],
            prose={7},
            caption="Errors first. A producer whose configuration passes every rule has no row.",
            more=more,
        )
        if rows
        else Table(["result"], [["Every producer configuration passed the rules."]])
    )
    watch = health.where(
        (F.col("lint_findings") > 0) | (F.col("send_failed") > 0) | (F.col("batch_fill_ratio") < 0.5) | (F.col("pending_saturation_share") > 0)
    ).orderBy(F.desc_nulls_last("send_failed"), F.asc_nulls_last("batch_fill_ratio"), "topic", "producer_name")
    rows, more = limited(watch, settings.report.max_rows)
    if rows:
        section.tables.append(
            Table(
                [
                    "producer",
                    "topic",
                    "partitions",
                    "msgs sent",
                    "msgs / batch",
                    "batchingMaxMessages",
                    "batch fill",
                    "pending saturated",
                    "send failed",
                    "failures by kind",
                    "p99 max ms",
                    "partition skew",
                ],
                [
                    [
                        r["producer_name"],
                        short_topic(r["topic"]),
                        fmt(r["partitions"]),
                        fmt(r["msgs_sent"]),
                        fmt(r["msgs_per_batch"], 1),
                        fmt(r["batching_max_messages"]),
                        pct(r["batch_fill_ratio"]),
                        pct(r["pending_saturation_share"]),
                        fmt(r["send_failed"]),
                        _failure_kinds(r),
                        fmt(r["send_latency_ms_p99_max"], 1),
                        fmt(r["partition_skew"], 2),
                    ]
                    for r in rows
                ],
                numeric={2, 3, 4, 5, 6, 7, 8, 10, 11},
                prose={9},
                caption="Producers with send failures, under-filled batches, a saturated pending queue or lint findings.",
                more=more,
            )
        )
    return section


def _failure_kinds(r) -> str:
    kinds = [
        f"{name} {r[col]:,}"
        for name, col in (
            ("ProducerQueueIsFullError", "send_failed_queue_full"),
            ("MemoryBufferIsFullError", "send_failed_memory_full"),
            ("TimeoutException", "send_failed_timeout"),
            ("other", "send_failed_other"),
        )
        if r[col]
    ]
    return ", ".join(kinds) or "—"
