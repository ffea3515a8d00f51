"""Shared helpers for the landing, validate and silver tests: fixture landing files in place."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "landing"


def install_fixtures(settings, *days: str) -> Path:
    for day in days:
        shutil.copytree(FIXTURES / day, settings.landing / day, dirs_exist_ok=True)
    return settings.landing


def rows(df, *order):
    """Rows as dicts, sorted in Python by the given columns (maps cannot be sorted by Spark)."""
    order = order or tuple(df.columns[:6])
    got = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(got, key=lambda r: tuple((r[c] is not None, str(r[c])) for c in order))
