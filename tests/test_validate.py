"""`brokerlens validate` through the CLI: a passing run, a failed critical expectation that exits
non-zero with a readable summary, and the history of both runs."""

from __future__ import annotations

import json
from datetime import date

from typer.testing import CliRunner

from brokerlens.cli import app
from brokerlens.land import dispatch, land_kind
from brokerlens.tables import read_table, write_table
from brokerlens.validate import load_suites
from landing_helpers import install_fixtures

DAY = date(2026, 11, 21)


def suite(path, expectations):
    path.write_text(json.dumps({"name": "bronze_dispatch", "expectations": expectations}))


def test_validate_passes_then_fails_on_a_critical_expectation(spark, settings, tmp_path, monkeypatch):
    install_fixtures(settings, "2026-11-21")
    good, _, parsed = land_kind(dispatch, DAY, settings)
    write_table(good, "bronze_dispatch", mode="replace", partitions=[{"day": DAY}])
    parsed.unpersist()
    msgs = [r["msgs"] for r in read_table("bronze_dispatch").collect()]
    folder = tmp_path / "expectations"
    folder.mkdir()
    monkeypatch.setenv("BROKERLENS_EXPECTATIONS_DIR", str(folder))
    level = {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "level", "value_set": ["broker", "topic", "subscription"]}, "meta": {"severity": "critical"}}
    # A warning that fails does not fail the command.
    small = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "msgs", "max_value": 20}, "meta": {"severity": "warning"}}
    suite(folder / "bronze_dispatch.json", [level, small])
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", "--date", "2026-11-21"])
    assert ok.exit_code == 0, ok.output
    over = sum(m > 20 for m in msgs)
    assert f"warning: bronze_dispatch: expect_column_values_to_be_between(msgs) failed on {over} of {len(msgs)} rows" in ok.output

    suite(folder / "bronze_dispatch.json", [level, small | {"meta": {"severity": "critical"}}])
    failed = runner.invoke(app, ["validate", "--date", "2026-11-21"])
    assert failed.exit_code == 1
    assert "1 critical expectation(s) failed" in failed.output
    assert f"expect_column_values_to_be_between(msgs) failed on {over} of {len(msgs)} rows" in failed.output

    history = read_table("validation_results").collect()
    assert len({r["run_at"] for r in history}) >= 1 and len(history) == 4
    assert sorted((r["severity"], r["success"]) for r in history if r["column_name"] == "msgs") == [
        ("critical", False), ("warning", False)
    ]
    assert len(list((settings.reports / "validation" / "2026-11-21").glob("*.json"))) >= 1


def test_every_bronze_and_silver_table_has_a_suite():
    from brokerlens.schemas import table_schemas

    wanted = {n for n, s in table_schemas().items() if n.startswith("bronze_") or s.layer == "silver"}
    assert wanted <= set(load_suites())
