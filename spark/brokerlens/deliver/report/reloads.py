"""Report section "Topic reloads": each reload seen between two snapshots (reload_events), the
acknowledgements brokerlens predicted it would lose beside those it lost."""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.times import first

from .blocks import Number, Section, Table, day_rows, fmt, limited, short_topic


def reload_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "reloads",
        "Topic reloads",
        "Reloads (unload, broker restart or crash, ownership change) seen between two snapshots of a "
        "subscription. The predicted loss is from the snapshot before the reload: a graceful close "
        "keeps the first cap + 1 ranges, a crash what the cursor ledger holds; the observed loss is "
        "the acknowledged entries missing after it (else the backlog jump).",
    )
    events = day_rows(spark, "reload_events", day, settings, keep=True)
    lost = events.where("lost_acknowledgements")
    total, lost_count = events.count(), lost.count()
    headline.append(Number("reloads that lost acknowledgements", fmt(lost_count), "bad" if lost_count else "good"))
    if not total:
        section.empty = f"No topic reload was seen on {day}."
        return section
    section.numbers = [
        Number("reloads", fmt(total)),
        Number("reloads that lost acknowledgements", fmt(lost_count), "bad" if lost_count else "good"),
        Number("acknowledgements lost", fmt(first(lost.agg(F.sum("observed_lost").alias("lost")))["lost"] or 0), "bad" if lost_count else ""),
    ]
    ordered = events.orderBy(F.desc("observed_lost"), "after_at", "topic", "subscription")
    rows, more = limited(ordered, settings.report.max_rows)
    section.tables.append(
        Table(
            ["topic", "subscription", "between", "seen by", "ranges", "cap", "mode", "predicted (unload / crash)", "lost", "explained by"],
            [
                [
                    short_topic(r["topic"]),
                    r["subscription"],
                    f"{r['before_at']:%H:%M:%S} – {r['after_at']:%H:%M:%S}",
                    ", ".join(r["signals"]),
                    fmt(r["ranges_before"]),
                    fmt(r["cap"]),
                    r["persist_mode"] or "—",
                    f"{fmt(r['predicted_unload_exposure'])} / {fmt(r['predicted_crash_exposure'])}",
                    fmt(r["observed_lost"]),
                    r["explained_by"] or "neither",
                ]
                for r in rows
            ],
            numeric={4, 5, 8},
            more=more,
        )
    )
    return section
