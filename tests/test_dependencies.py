"""pyproject.toml lists what the code imports, in the right place: the package's own imports in
``dependencies``, the DAGs' in the ``airflow`` extra, the tests' and the bench's in ``dev``; nothing
imported is missing and nothing listed goes unused."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spark" / "brokerlens"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Listed and used, though never imported: a connection type, and the commands of the habits.
NOT_IMPORTED = {
    "airflow": {"apache-airflow", "apache-airflow-providers-smtp"},  # the smtp connection of the alert mail
    "dev": {"build", "ruff", "mypy", "pre-commit"},
}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _listed(extra: str | None) -> set[str]:
    return {_name(r) for r in (PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"])}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return {m for m in found if m.split(".")[0] not in sys.stdlib_module_names}


@cache
def _modules(dist: str) -> frozenset[str]:
    """Every module (and package) a distribution installs, by dotted name."""
    names = set()
    for f in metadata.distribution(dist).files or []:
        parts = f.with_suffix("").parts if f.suffix in (".py", ".so") else ()
        if parts and "." not in parts[0]:
            parts = parts[:-1] if parts[-1] == "__init__" else (*parts[:-1], parts[-1].split(".")[0])
            names |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return frozenset(names)


@cache
def _top_level() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _owner(module: str) -> str | None:
    """The distribution installing the longest prefix of ``module``: ``airflow.sdk`` belongs to the
    task SDK, ``airflow.providers.apache.spark...`` to the Spark provider, not to apache-airflow."""
    parts = module.split(".")
    best, depth = None, 0
    for dist in set(_top_level().get(parts[0], [])):
        n = max((n for n in range(1, len(parts) + 1) if ".".join(parts[:n]) in _modules(dist)), default=0)
        if n > depth:
            best, depth = _name(dist), n
    return best


def _used(paths) -> dict[str, set[str]]:
    """Distribution -> the files that import it; None for a module no installed distribution has."""
    used: dict[str, set[str]] = {}
    for path in paths:
        for module in _imports(path):
            if module.split(".")[0] not in LOCAL:
                used.setdefault(_owner(module) or f"? {module}", set()).add(str(path.relative_to(ROOT)))
    return used


# The repository's own modules: the package, the bench, the tests' helpers.
LOCAL = {p.stem for p in [*(ROOT / "spark").iterdir(), *(ROOT / "tests").iterdir(), *(ROOT / "infra" / "pulsar").iterdir()]}
AIRFLOW_SIDE = [PACKAGE / "airflow_support.py", *sorted((ROOT / "dags").glob("*.py"))]
PACKAGE_SIDE = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in AIRFLOW_SIDE]
DEV_SIDE = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "spark" / "brokerlens_bench").glob("*.py"))]


def test_the_package_lists_exactly_what_it_imports():
    used = _used(PACKAGE_SIDE)
    assert set(used) == _listed(None), (
        f"imported, not in dependencies: { {d: f for d, f in used.items() if d not in _listed(None)} }; listed, never imported: {_listed(None) - set(used)}"
    )


def test_the_airflow_extra_lists_what_the_dags_import():
    used = set(_used(AIRFLOW_SIDE)) - _listed(None)
    listed = _listed("airflow")
    assert used <= listed, f"imported by the DAGs' side, not listed: {used - listed}"
    assert listed - used == NOT_IMPORTED["airflow"]


def test_the_dev_extra_lists_what_tests_and_bench_import():
    used = set(_used(DEV_SIDE)) - _listed(None) - _listed("airflow")
    listed = _listed("dev")
    assert used <= listed, f"imported by tests or the bench, not listed: {used - listed}"
    assert listed - used == NOT_IMPORTED["dev"]


def test_the_lock_pins_every_listed_distribution():
    lock = (ROOT / "requirements" / "lock.txt").read_text()
    pinned = {_name(m) for m in re.findall(r"^([A-Za-z0-9._-]+)==", lock, flags=re.M)}
    listed = _listed(None) | _listed("airflow") | _listed("dev")
    assert listed <= pinned, f"not in requirements/lock.txt (make lock): {listed - pinned}"
