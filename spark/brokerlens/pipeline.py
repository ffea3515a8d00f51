"""Stages by name: one entry point for the command line, Airflow tasks and tests.

Each stage is a function ``(day, settings, **options) -> StageResult`` in its own module; a stage
that runs on Spark (:data:`ON_SPARK`) is ``(spark, day, settings, **options)``: its caller gives it
the session.
"""

from __future__ import annotations

import importlib
import logging
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

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


# The warm-up's generated day: small, but every stage's every path (quarantine, alerts, report).
WARM_UP_DAY, WARM_UP_SCALE = date(2026, 1, 1), 0.01


def warm_up(spark: SparkSession, settings: Settings) -> float:
    """The daily stages on a generated day in a scratch folder, every path of it there (never
    the real lake); seconds taken. A JVM's first run of a stage compiles and loads what later
    runs reuse: on a new Spark Connect server the first day would take half again as long as
    the next. The folder is this machine's, so the server must be on it too."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="brokerlens-warm-up-") as scratch:
        folders = dict.fromkeys(("landing_dir", "lake_dir", "quarantine_dir", "reports_dir", "outbox_dir"))
        scratch_settings = settings.model_copy(update={"home": Path(scratch), **folders})
        run_stage("demo-data", WARM_UP_DAY, scratch_settings, scale=WARM_UP_SCALE)
        for stage, layer in DAILY_STEPS:
            options: dict[str, object] = {"layer": layer} if layer else {}
            if stage == "alert":
                options["dry_run"] = True  # no mail about a made-up day
            run_stage(stage, WARM_UP_DAY, scratch_settings, spark, **options)
    return time.monotonic() - started
