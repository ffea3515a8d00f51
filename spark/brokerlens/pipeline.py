"""Stages by name: one entry point for the command line, Airflow tasks and tests.

Each stage is a function ``(day, settings, **options) -> StageResult`` in its own module; a stage
that runs on Spark (:data:`ON_SPARK`) is ``(spark, day, settings, **options)``: its caller gives it
the session.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from datetime import date

from pyspark.sql import SparkSession

from brokerlens.platform.stage import StageResult
from brokerlens.settings import Settings

log = logging.getLogger(__name__)

STAGES: dict[str, str] = {
    "demo-data": "brokerlens.sources.demo:generate_day",
    "collect": "brokerlens.sources.collect:collect",
    "land": "brokerlens.land.bronze:land_day",
    "validate": "brokerlens.quality.validate:validate_day",
    "build": "brokerlens.build:build_day",
    "alert": "brokerlens.deliver.alerting:alert_day",
    "report": "brokerlens.deliver.report.page:report_day",
}
ON_SPARK = frozenset({"land", "validate", "build", "alert", "report"})
# What `brokerlens run` and the daily DAG do, in order: (stage, layer). Each layer is validated
# before the next one is built from it.
DAILY_STEPS: tuple[tuple[str, str | None], ...] = (
    ("land", None),
    ("validate", "bronze"),
    ("build", "silver"),
    ("validate", "silver"),
    ("build", "gold"),
    ("alert", None),
    ("report", None),
)


def resolve(target: str) -> Callable[..., StageResult]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def run_stage(name: str, day: date | None, settings: Settings, spark: SparkSession | None = None, **options) -> StageResult:
    """Stage ``name`` for ``day``; ``spark``: the session a stage of :data:`ON_SPARK` runs on (the
    others start no JVM)."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    if (spark is not None) != (name in ON_SPARK):
        raise ValueError(f"stage {name} {'runs on Spark: give it the session' if spark is None else 'does not run on Spark: give it no session'}")
    started = time.monotonic()
    log.info("%s %s: starting", name, day or "")
    stage = resolve(STAGES[name])
    result = stage(spark, day, settings, **options) if spark is not None else stage(day, settings, **options)
    result.metrics.setdefault("seconds", round(time.monotonic() - started, 1))
    log.info("%s %s: done in %ss", name, day or "", result.metrics["seconds"])
    return result
