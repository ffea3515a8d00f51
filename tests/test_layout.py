"""The package tree shows the data flow (docs/architecture.md): each step imports only from itself,
an earlier step or the platform, no two modules import each other (directly or round a circle),
and no Python file of the repository is too long to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spark" / "brokerlens"
DOCS = ROOT / "docs" / "architecture.md"
# The flow, in order. Top-level modules (cli, pipeline, build, submit, airflow_support) wire the
# steps together and come last.
FLOW = ("platform", "sources", "land", "quality", "silver", "gold", "deliver")
TOP = len(FLOW)
MAX_LINES = 400


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _step(module: str) -> int:
    parts = module.split(".")
    return FLOW.index(parts[1]) if len(parts) > 1 and parts[1] in FLOW else TOP


def _imports(path: Path) -> set[str]:
    """Every brokerlens module ``path`` imports, at module level or inside functions."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import name` may name a module of pkg.
            found |= {target} | {f"{target}.{a.name}" for a in node.names}
    return {m for m in found if m == "brokerlens" or m.startswith("brokerlens.")}


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_the_flow_steps():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} == set(FLOW)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_flow(path):
    step = _step(_module(path))
    later = sorted(m for m in _imports(path) if _step(m) > step)
    assert not later, f"{_module(path)} ({FLOW[step] if step < TOP else 'top level'}) imports a later step: {later}"


def test_the_bench_is_outside_the_package():
    assert not (PACKAGE / "bench.py").exists()
    assert not any("brokerlens_bench" in p.read_text() for p in SOURCES)


# What reaches into Spark's JVM through py4j (none of it exists on a Spark Connect session).
JVM_BRIDGE = {"_jvm", "_jsc", "_jsparkSession", "_jdf", "sparkContext", "rdd"}
JVM_MODULE = PACKAGE / "platform" / "jvm.py"


@pytest.mark.parametrize("path", [*SOURCES, *sorted((PACKAGE.parent / "brokerlens_bench").rglob("*.py"))], ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_only_the_jvm_module_reaches_into_the_jvm(path):
    if path == JVM_MODULE:
        return
    tree = ast.parse(path.read_text(), str(path))
    used = sorted({f"{node.attr} (line {node.lineno})" for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in JVM_BRIDGE})
    imported = sorted({a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names if a.name.startswith("py4j")})
    imported += sorted({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("py4j")})
    assert not used and not imported, f"{path.name} uses the JVM bridge ({used + imported}): put it in brokerlens/platform/jvm.py"


def _modules_imported(path: Path, modules: set[str]) -> set[str]:
    """The modules of the package ``path`` imports: ``from pkg import name`` imports the module
    ``pkg.name`` when there is one, else ``pkg`` itself."""
    names = _imports(path) & modules
    return {n for n in names if not any(m.startswith(n + ".") for m in names)} - {_module(path)}


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of imports in ``graph`` (module -> modules it imports), or [] when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if found := visit(target):
                return found
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if found := visit(module):
            return found
    return []


def test_the_import_graph_has_no_circle():
    modules = {_module(p) for p in SOURCES}
    graph = {_module(p): _modules_imported(p, modules) for p in SOURCES}
    assert _circle(graph) == []
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_python_file_is_over_400_lines():
    """The package, the bench, the tests, the DAGs and infra's scripts alike."""
    files = [p for p in ROOT.rglob("*.py") if not {".venv", "build", "var"} & set(p.relative_to(ROOT).parts)]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert PACKAGE / "cli.py" in files and Path(__file__) in files
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_architecture_doc_names_every_package_and_module():
    """Each module of a step is named (``gold/brokers.py``); a step's subpackage may be named as a
    whole (``gold/dispatch/``)."""
    text = DOCS.read_text()
    missing = []
    for path in SOURCES:
        rel = path.relative_to(PACKAGE)
        named = [f"`{rel}`"] if len(rel.parts) <= 2 else [f"`{Path(*rel.parts[:2])}/`"]
        if path.name == "__init__.py" and len(rel.parts) == 2:
            named = [f"`{rel.parent}/`"]
        if rel.name != "__init__.py" or len(rel.parts) == 2:
            if not any(n in text for n in named):
                missing.append(named[0])
    assert not missing, f"docs/architecture.md does not describe: {sorted(set(missing))}"
