"""`brokerlens build`: silver, then the gold tables, for one day (``layer``: only one of the two,
so that the silver tables can be validated before gold is built from them)."""

from __future__ import annotations

from datetime import date

from brokerlens.pipeline import resolve
from brokerlens.platform.progress import progress
from brokerlens.platform.settings import Settings
from brokerlens.platform.stage import StageResult

# Order matters: gold steps read the silver tables of the day. (layer, step, target)
BUILD_STEPS: tuple[tuple[str, str, str], ...] = (
    ("silver", "silver", "brokerlens.silver.build:build_silver"),
    ("gold", "dispatch", "brokerlens.gold.dispatch.build:build_dispatch"),
    ("gold", "holes", "brokerlens.gold.holes.build:build_holes"),
    ("gold", "producers", "brokerlens.gold.producers.build:build_producers"),
)
LAYERS = ("silver", "gold")


def build_day(day: date, settings: Settings, layer: str | None = None) -> StageResult:
    if layer is not None and layer not in LAYERS:
        raise ValueError(f"build layer must be one of {', '.join(LAYERS)}, not {layer!r}")
    result = StageResult(f"build {layer}" if layer else "build", day)
    steps = [(name, target) for step_layer, name, target in BUILD_STEPS if layer in (None, step_layer)]
    with progress(f"build {day}", total=len(steps), unit="steps") as shown:
        for name, target in steps:
            shown.note(name)
            step = resolve(target)(day, settings)
            result.writes += step.writes
            result.lines += step.lines
            result.metrics.update(step.metrics)
            shown.advance()
    return result
