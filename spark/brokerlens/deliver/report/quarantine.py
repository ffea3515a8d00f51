"""Report section "Quarantined records": landing records that could not be used, counted by
stage, kind and reason, with the first ones by file and line."""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings

from .blocks import Number, Section, Table, day_rows, fmt, limited


def quarantine_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "quarantine",
        "Quarantined records",
        "Landing records that could not be used, by stage, landing kind and reason. Nothing is "
        "dropped silently: each record is in the quarantine table with its file, line and reason.",
    )
    q = day_rows(spark, "quarantine", day, settings, keep=True, columns=("stage", "kind", "reason", "source_file", "line", "detail"))
    counts = q.groupBy("stage", "kind", "reason").count().orderBy(F.desc("count"), "stage", "kind", "reason")
    total = q.count()
    rows, more = limited(counts, settings.report.max_rows)
    headline.append(Number("records quarantined", fmt(total), "bad" if total else "good"))
    if not rows:
        section.empty = f"Nothing was quarantined on {day}."
        return section
    section.numbers = [Number("records quarantined", fmt(total), "bad")]
    section.tables.append(
        Table(["stage", "kind", "reason", "records"], [[r["stage"], r["kind"], r["reason"], fmt(r["count"])] for r in rows], numeric={3}, more=more)
    )
    examples, more = limited(q.orderBy("source_file", "line"), min(10, settings.report.max_rows))
    section.tables.append(
        Table(
            ["file", "line", "reason", "detail"],
            [[e["source_file"], fmt(e["line"]), e["reason"], e["detail"] or "—"] for e in examples],
            numeric={1},
            prose={3},
            caption="First records by file and line (the raw text is in the quarantine table).",
            more=more,
        )
    )
    return section
