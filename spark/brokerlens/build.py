"""`brokerlens build`: silver, then the gold tables, for one day."""

from __future__ import annotations

from datetime import date

from .pipeline import resolve
from .progress import progress
from .settings import Settings
from .stage import StageResult

# Order matters: gold steps read the silver tables of the day.
BUILD_STEPS: tuple[tuple[str, str], ...] = (
    ("silver", "brokerlens.silver:build_silver"),
    ("dispatch", "brokerlens.dispatch:build_dispatch"),
    ("holes", "brokerlens.holes:build_holes"),
    ("producers", "brokerlens.producers:build_producers"),
)


def build_day(day: date, settings: Settings) -> StageResult:
    result = StageResult("build", day)
    with progress(f"build {day}", total=len(BUILD_STEPS), unit="steps") as shown:
        for name, target in BUILD_STEPS:
            shown.note(name)
            step = resolve(target)(day, settings)
            result.writes += step.writes
            result.lines += step.lines
            result.metrics.update(step.metrics)
            shown.advance()
    return result
