"""`brokerlens build`: silver, then the gold tables, for one day (``layer``: only one of the two,
so that the silver tables can be validated before gold is built from them)."""

from __future__ import annotations

from datetime import date
from functools import partial

from pyspark.sql import SparkSession

from brokerlens.pipeline import resolve
from brokerlens.platform.progress import progress
from brokerlens.platform.spark import in_parallel
from brokerlens.platform.stage import StageResult
from brokerlens.settings import Settings

# Gold steps read the silver tables of the day; the steps of one layer write tables of their own
# and read none of each other's. (layer, step, target)
BUILD_STEPS: tuple[tuple[str, str, str], ...] = (
    ("silver", "silver", "brokerlens.silver.build:build_silver"),
    ("gold", "dispatch", "brokerlens.gold.dispatch.build:build_dispatch"),
    ("gold", "holes", "brokerlens.gold.holes.build:build_holes"),
    ("gold", "producers", "brokerlens.gold.producers.build:build_producers"),
)
LAYERS = ("silver", "gold")


def build_day(spark: SparkSession, day: date, settings: Settings, layer: str | None = None) -> StageResult:
    if layer is not None and layer not in LAYERS:
        raise ValueError(f"build layer must be one of {', '.join(LAYERS)}, not {layer!r}")
    result = StageResult(f"build {layer}" if layer else "build", day)
    layers = LAYERS if layer is None else (layer,)
    with progress(f"build {day}", total=sum(in_layer in layers for in_layer, _, _ in BUILD_STEPS), unit="steps") as shown:
        for step_layer in layers:
            # A layer's steps read the layers below and write tables of their own: they run at once.
            steps = [(name, target) for in_layer, name, target in BUILD_STEPS if in_layer == step_layer]
            calls = [partial(resolve(target), spark, day, settings) for _, target in steps]
            for (name, _), step in zip(steps, in_parallel(spark, calls)):
                shown.note(name)
                result.writes += step.writes
                result.lines += step.lines
                result.metrics.update(step.metrics)
                shown.advance()
    return result
