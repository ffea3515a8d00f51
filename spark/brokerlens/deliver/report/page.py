"""The report page: builds the sections (at once), renders report.html.j2 with the Delta versions of
the tables read, and writes ``<reports>/<day>/brokerlens-<day>.html`` (the `report` stage)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timezone
from functools import partial
from typing import Any

from pyspark.sql import SparkSession

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.progress import progress
from brokerlens.platform.redact import redact
from brokerlens.platform.schemas import table_schemas
from brokerlens.platform.spark import in_parallel
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import table_version

from .alerts import alert_section
from .blocks import Number, Section
from .cursors import cursor_section
from .dispatch import dispatch_section
from .links import report_path
from .producers import producer_section
from .quality import quality_section
from .quarantine import quarantine_section
from .reloads import reload_section

SECTIONS = (
    dispatch_section,
    cursor_section,
    reload_section,
    alert_section,
    producer_section,
    quarantine_section,
    quality_section,
)
# The tables the report reads, listed with their Delta versions at the foot of the page.
SOURCE_TABLES = (
    "dispatch_daily",
    "dispatch_periods",
    "cursor_ranges",
    "reload_events",
    "hole_alerts",
    "alert_notifications",
    "producer_lint",
    "producer_health",
    "quarantine",
    "validation_results",
)


def render_html(day: date, sections: list[Section], headline: list[Number], sources: list[tuple[str, str]]) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("brokerlens.deliver.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2").render(
        day=day.isoformat(),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        headline=headline,
        sections=sections,
        sources=sources,
    )


def _source_versions(spark: SparkSession, settings: DeliverStepSettings) -> list[tuple[str, str]]:
    out = []
    for name in SOURCE_TABLES:
        if name in table_schemas():
            version = table_version(name, settings, spark)
            out.append((name, "not written yet" if version is None else f"version {version}"))
    return out


def report_day(spark: SparkSession, day: date, settings: DeliverStepSettings) -> StageResult:
    """Write the day's HTML report; the result says where it is."""
    result = StageResult("report", day)
    # The sections are independent: built in threads at once, a section's Spark jobs and its
    # charts overlap the others' (on a small day most of a query's time is the driver's). Each
    # has its own headline numbers, put together in the sections' order.
    # The tables' versions (a DESCRIBE HISTORY each, mostly waiting on Delta's log) are read
    # in the same threads, first, beside the first sections.
    headlines: list[list[Number]] = [[] for _ in SECTIONS]
    calls = [partial(build, spark, day, settings, numbers) for build, numbers in zip(SECTIONS, headlines)]
    sections = []
    with progress(f"report {day}", total=len(SECTIONS), unit="sections") as step:
        results: Iterator[Any] = in_parallel(spark, [partial(_source_versions, spark, settings), *calls])
        sources = next(results)
        for section in results:
            step.note(f"{section.id} ({len(section.charts)} charts)")
            step.advance()
            sections.append(section)
    headline = [n for numbers in headlines for n in numbers]
    html = render_html(day, sections, headline, sources)
    path = report_path(day, settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: the file a mail links to is never half written.
    draft = path.with_suffix(".html.partial")
    draft.write_text(redact(html), encoding="utf-8")
    draft.replace(path)
    result.metrics.update(
        sections=len(sections),
        charts=sum(len(s.charts) for s in sections),
        empty_sections=sum(s.empty is not None for s in sections),
        bytes=len(html.encode("utf-8")),
    )
    result.lines.append(f"report: {path}")
    result.lines += [f"{n.label}: {n.value}" for n in headline]
    return result
