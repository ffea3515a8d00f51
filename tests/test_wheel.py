"""The package alone: a wheel built by ``python -m build``, installed with the locked dependencies
in a fresh venv, runs ``brokerlens demo-data``, ``land`` and ``build`` from a folder outside the
checkout, reading its schemas and expectations from the installed package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the checkout's .venv: build, and uv with its cache
DAY = "2026-11-20"


def _run(*argv, cwd: Path, env: dict | None = None, timeout: int = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _install(venv: Path, wheel: Path, cwd: Path) -> None:
    """The wheel and its dependencies at the lock's versions. uv links them from its cache: offline
    first (no index round trips when the bootstrap has cached them all), else from the index."""
    argv = [BIN / "uv", "pip", "install", "-q", "--python", venv / "bin" / "python",
            "-c", ROOT / "requirements" / "lock.txt", wheel]  # fmt: skip
    offline = subprocess.run([*argv[:3], "--offline", *argv[3:]], cwd=cwd, capture_output=True, timeout=900)
    if offline.returncode != 0:
        _run(*argv, cwd=cwd)


@pytest.mark.slow
@pytest.mark.heavy
def test_the_wheel_runs_a_day_without_the_checkout(tmp_path):
    path = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
    _run(BIN / "python", "-m", "build", "--installer", "uv", "--outdir", tmp_path / "dist", ROOT,
         cwd=tmp_path, env={**os.environ, "PATH": path})  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("brokerlens-*.whl")
    venv = tmp_path / "venv"
    _run(BIN / "uv", "venv", "-q", "--python", sys.executable, venv, cwd=tmp_path)
    _install(venv, wheel, tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    # Nothing of the checkout: no PYTHONPATH, no schema or expectation folders, a home of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERLENS_", "PYTHON", "SPARK_", "VIRTUAL_ENV"))}
    env |= {"BROKERLENS_HOME": str(work / "home"), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    where = _run(venv / "bin" / "python", "-c", "import brokerlens.platform.schemas as s; print(s.schemas_dir())", cwd=work, env=env)
    assert Path(where.strip()).is_relative_to(venv) and not Path(where.strip()).is_symlink()

    brokerlens = venv / "bin" / "brokerlens"
    _run(brokerlens, "demo-data", "--date", DAY, "--scale", "0.05", cwd=work, env=env)
    manifest = json.loads((work / "home" / "landing" / DAY / "_demo_manifest.json").read_text())
    landed = _run(brokerlens, "land", "--date", DAY, cwd=work, env=env)
    _run(brokerlens, "build", "--date", DAY, cwd=work, env=env)

    lake = work / "home" / "lake"
    # Every bronze, silver and gold table committed a version for the day.
    for table in ("bronze_dispatch", "quarantine", "dispatch_intervals", "cursor_snapshots", "dispatch_periods", "cursor_ranges", "producer_health"):
        assert list((lake / table / "_delta_log").glob("*.json")), f"{table} has no Delta commit"
    # Deliberately bad records of the day were quarantined by land (each kind and reason counted).
    quarantined = sum(int(n) for n in re.findall(r"^\s*quarantined [\w-]+: [\w-]+ (\d+)$", landed, flags=re.M))
    assert 0 < quarantined <= len(manifest["bad_records"]), landed
