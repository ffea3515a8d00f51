"""docs/tables.md is generated from schemas/ and kept up to date; `brokerlens tables` shows the same."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from brokerlens import cli
from brokerlens.platform.reference import docs_path, tables_markdown
from brokerlens.platform.schemas import table_schemas


def test_tables_reference_is_up_to_date():
    path = docs_path()
    assert path.is_file(), "docs/tables.md is missing: run `brokerlens docs`"
    assert path.read_text(encoding="utf-8") == tables_markdown(), "docs/tables.md is out of date with schemas/tables/: run `brokerlens docs` and commit it"


def test_reference_documents_every_table_and_column():
    text = docs_path().read_text(encoding="utf-8")
    headings = re.findall(r"^### `(\w+)`$", text, flags=re.M)
    assert sorted(headings) == sorted(table_schemas())
    for name, schema in table_schemas().items():
        block = text.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \| (yes|no) \| (.*) \|$", block, flags=re.M)
        assert [(r[0], r[1], r[2] == "yes") for r in rows] == [(c.name, c.type, c.nullable) for c in schema.columns]
        assert all(r[3].strip() for r in rows), f"{name}: a column has no description"


def test_docs_check_command():
    out = CliRunner().invoke(cli.app, ["docs", "--check"])
    assert out.exit_code == 0, out.output
    assert "up to date" in out.stdout


def test_tables_command_shows_one_table_with_descriptions():
    out = CliRunner().invoke(cli.app, ["tables", "quarantine"])
    assert out.exit_code == 0, out.output
    schema = table_schemas()["quarantine"]
    assert out.stdout.splitlines()[0].startswith("quarantine  [bronze, not written yet]")
    for c in schema.columns:
        assert re.search(rf"^\s+{c.name}\s+{re.escape(c.type)}\s+{re.escape(c.description)}$", out.stdout, re.M)
    assert "dispatch_periods" not in out.stdout
    out = CliRunner().invoke(cli.app, ["tables", "no_such_table"])
    assert out.exit_code != 0


ROOT = docs_path().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces as -."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not the repository's to check
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    return broken


def test_readme_is_short_and_its_links_resolve():
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 175
    assert LINK.findall(readme.read_text(encoding="utf-8")), "the README links to the docs"
    assert _broken_links(readme) == []


def test_the_docs_links_resolve(tmp_path):
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert _broken_links(page) == [], page.name
    page = tmp_path / "page.md"
    page.write_text("# A heading\n[here](#a-heading) [gone](#nowhere) [file](missing.md) [web](https://pulsar.apache.org)\n")
    assert _broken_links(page) == ["#nowhere", "missing.md"]
