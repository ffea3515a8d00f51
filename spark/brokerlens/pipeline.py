"""Stages by name: one entry point for the command line, Airflow tasks and tests.

Each stage is a function ``(day, settings, **options) -> StageResult`` in its own module.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from datetime import date

from brokerlens.platform.stage import StageResult
from brokerlens.settings import Settings

log = logging.getLogger(__name__)

STAGES: dict[str, str] = {
    "demo-data": "brokerlens.sources.demo:generate_day",
    "collect": "brokerlens.sources.collect:collect",
    "land": "brokerlens.land:land_day",
    "validate": "brokerlens.quality.validate:validate_day",
    "build": "brokerlens.build:build_day",
    "alert": "brokerlens.deliver.alerting:alert_day",
    "report": "brokerlens.deliver.report.page:report_day",
}
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


def run_stage(name: str, day: date | None, settings: Settings, **options) -> StageResult:
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    started = time.monotonic()
    log.info("%s %s: starting", name, day or "")
    result = resolve(STAGES[name])(day, settings, **options)
    result.metrics.setdefault("seconds", round(time.monotonic() - started, 1))
    log.info("%s %s: done in %ss", name, day or "", result.metrics["seconds"])
    return result
