"""One SparkSession per test session (per worker under ``make test``'s two workers); a fresh
BROKERLENS_HOME for every test; the longest files first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Tests must not pick up a developer's settings file.
os.environ.pop("BROKERLENS_CONFIG", None)


def pytest_collection_modifyitems(items):
    """Longest test files first, by the ``slow`` marker's ``minutes`` (1 if not given): ``make
    test`` spreads whole files over 2 workers (``-n 2 --dist loadfile``), and a long file that
    started last would set the suite's end. Stable: the rest keeps its order."""

    def minutes(item) -> float:
        marker = item.get_closest_marker("slow")
        return marker.kwargs.get("minutes", 1) if marker else 0

    longest: dict[Path, float] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0), minutes(item))
    items.sort(key=lambda item: -longest[item.path])


@pytest.fixture(scope="session")
def spark():
    from brokerlens.platform.settings import Settings
    from brokerlens.platform.spark import get_spark

    session = get_spark(Settings(spark={"shuffle_partitions": 4, "driver_memory": "3g"}))
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def brokerlens_home(tmp_path, monkeypatch):
    """Every test gets its own landing, lake, reports and outbox under tmp_path."""
    from brokerlens.platform.settings import reload_settings

    home = tmp_path / "var"
    monkeypatch.setenv("BROKERLENS_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    reload_settings()
    yield home
    reload_settings()


@pytest.fixture
def settings(brokerlens_home):
    from brokerlens.platform.settings import get_settings

    return get_settings()


@pytest.fixture
def brokerlens_command():
    """argv for the installed `brokerlens` command, for tests that run it as a user would."""
    return lambda *args: [str(Path(sys.executable).with_name("brokerlens")), *args]
