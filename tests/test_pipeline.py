"""The stage registry: a stage works on the settings it is given and on nothing else. No stage
reads settings of its own: only the edges (a command, an Airflow task) read
the environment's, and hand them down."""

from __future__ import annotations

import ast
from datetime import date
from pathlib import Path

import pytest

from brokerlens import pipeline
from brokerlens.settings import Settings

PACKAGE = Path(__file__).resolve().parents[1] / "spark" / "brokerlens"
# Where the environment's settings are read (get_settings / reload_settings): the edges.
EDGES = {"cli.py", "airflow_support.py", "settings.py"}


def test_a_stage_works_on_the_settings_it_is_given(tmp_path, brokerlens_home):
    given = Settings(home=tmp_path / "elsewhere")
    day = date(2026, 11, 21)
    result = pipeline.run_stage("demo-data", day, given, scale=0.01)
    folder = given.landing / day.isoformat()
    written = [p for p in folder.rglob("*") if p.is_file()]
    assert (folder / "_demo_manifest.json").is_file()
    assert len(written) >= result.metrics["files"] > 0  # its good files, and the bad ones it plants
    assert not brokerlens_home.exists()  # the environment's home (BROKERLENS_HOME) is untouched


def test_only_the_edges_read_the_environments_settings():
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        if names & {"get_settings", "reload_settings"}:
            readers.add(str(path.relative_to(PACKAGE)))
    assert readers <= EDGES, sorted(readers - EDGES)


def test_each_step_owns_its_settings_section():
    """platform/ holds only the platform's settings; every other section is declared by the step
    that reads it, and the edges' Settings is all of them, under the keys operators' files use."""
    from brokerlens.platform.settings import PlatformSettings

    platform = {"home", "landing_dir", "lake_dir", "quarantine_dir", "reports_dir", "outbox_dir", "commit_retries", "spark"}
    assert set(PlatformSettings.model_fields) == platform
    owners = {}
    for cls in Settings.__mro__[1:]:
        if issubclass(cls, PlatformSettings) and cls is not PlatformSettings:
            own = set(cls.__annotations__)
            assert not own & set(owners), f"{cls.__name__} declares {own & set(owners)} again"
            owners |= {name: cls.__module__ for name in own}
    assert owners == {
        "admin_url": "brokerlens.sources.settings",
        "admin_token": "brokerlens.sources.settings",
        "collect": "brokerlens.sources.settings",
        "land": "brokerlens.land.settings",
        "dispatch": "brokerlens.gold.dispatch.settings",
        "producers": "brokerlens.gold.producers.settings",
        "alerts": "brokerlens.gold.holes.settings",
        "smtp": "brokerlens.deliver.settings",
        "report": "brokerlens.deliver.settings",
    }
    assert set(Settings.model_fields) == platform | set(owners)


def test_a_stage_on_spark_is_given_its_session_and_the_others_none(tmp_path):
    """The caller gives a stage of ON_SPARK its session; one that starts no JVM gets none."""
    given = Settings(home=tmp_path)
    day = date(2026, 11, 21)
    assert pipeline.ON_SPARK == {"land", "validate", "build", "alert", "report"} == set(pipeline.STAGES) - {"demo-data", "collect"}
    with pytest.raises(ValueError, match="land runs on Spark: give it the session"):
        pipeline.run_stage("land", day, given)
    with pytest.raises(ValueError, match="demo-data does not run on Spark"):
        pipeline.run_stage("demo-data", day, given, object(), scale=0.01)
    assert not given.landing.exists()


def test_the_settings_are_read_without_spark():
    """The edges read the settings before anything runs on Spark (a command that starts no JVM,
    Airflow parsing the DAG file): no step's settings section pulls pyspark in."""
    import subprocess
    import sys

    probe = "import sys, brokerlens.settings; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark')[:3])"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"importing brokerlens.settings imported {proc.stdout.strip()}"
