"""`brokerlens validate` through the CLI: a passing run, a failed critical expectation that exits
non-zero with a readable summary, and the history of both runs."""

from __future__ import annotations

import pytest

import json
from datetime import date

from landing_helpers import install_fixtures
from typer.testing import CliRunner

from brokerlens.cli import app
from brokerlens.land import dispatch
from brokerlens.land.bronze import land_kind
from brokerlens.platform.tables import read_table, write_table
from brokerlens.quality.validate import _columns_read, load_suites

DAY = date(2026, 11, 21)


def suite(path, expectations):
    path.write_text(json.dumps({"name": "bronze_dispatch", "expectations": expectations}))


@pytest.mark.slow
def test_validate_passes_then_fails_on_a_critical_expectation(spark, settings, tmp_path, monkeypatch):
    install_fixtures(settings, "2026-11-21")
    good, _, parsed, _ = land_kind(spark, dispatch, DAY, settings)
    write_table(good, "bronze_dispatch", mode="replace", partitions=[{"day": DAY}], settings=settings)
    parsed.unpersist()
    msgs = [r["msgs"] for r in read_table("bronze_dispatch", settings=settings, spark=spark).collect()]
    folder = tmp_path / "expectations"
    folder.mkdir()
    monkeypatch.setenv("BROKERLENS_EXPECTATIONS_DIR", str(folder))
    level = {
        "type": "expect_column_values_to_be_in_set",
        "kwargs": {"column": "level", "value_set": ["broker", "topic", "subscription"]},
        "meta": {"severity": "critical"},
    }
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

    history = read_table("validation_results", settings=settings, spark=spark).collect()
    assert len({r["run_at"] for r in history}) >= 1 and len(history) == 4
    assert sorted((r["severity"], r["success"]) for r in history if r["column_name"] == "msgs") == [("critical", False), ("warning", False)]
    assert len(list((settings.reports / "validation" / "2026-11-21").glob("*.json"))) >= 1


def test_every_bronze_and_silver_table_has_a_suite_that_expects_rows():
    from brokerlens.platform.schemas import table_schemas

    wanted = {n for n, s in table_schemas().items() if n.startswith("bronze_") or s.layer == "silver"}
    suites = load_suites()
    assert wanted <= set(suites)
    for table in wanted:
        [rows] = [e for e in suites[table]["expectations"] if e["type"] == "expect_table_row_count_to_be_between"]
        assert rows["kwargs"] == {"min_value": 1} and rows["meta"]["critical_when_landed"], table


def test_a_suite_reads_only_the_columns_its_expectations_name():
    topic_stats = load_suites()["bronze_topic_stats"]
    read = _columns_read(topic_stats)
    assert read is not None and {"collected_at", "topic", "subscription_type"} <= set(read)
    assert not {"subscription_json", "publishers_json"} & set(read)
    rows = {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}
    unique = {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": ["topic", "subscription"]}}
    assert _columns_read({"expectations": [rows]}) == []
    assert _columns_read({"expectations": [rows, unique]}) == ["topic", "subscription"]
    # An expectation that names no column may read any of them: the suite gets them all.
    whole = {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": ["day"]}}
    assert _columns_read({"expectations": [unique, whole]}) is None


@pytest.mark.slow
def test_bronze_layer_row_counts_warn_on_an_empty_day_and_fail_when_files_landed(spark, settings):
    import shutil

    from brokerlens.platform.schemas import table_schemas

    install_fixtures(settings, "2026-11-21")
    shutil.rmtree(settings.landing / "2026-11-21" / "metrics")  # nothing landed for bronze_metrics
    good, _, parsed, _ = land_kind(spark, dispatch, DAY, settings)
    write_table(good, "bronze_dispatch", mode="replace", partitions=[{"day": DAY}], settings=settings)
    parsed.unpersist()
    landed = read_table("bronze_dispatch", settings=settings, spark=spark).where(f"day = '{DAY}'").count()
    assert landed > 0

    out = CliRunner().invoke(app, ["validate", "--layer", "bronze", "--date", "2026-11-21"])
    # The other kinds had files but their tables were never landed: critical; metrics had none:
    # a warning, logged.
    assert out.exit_code == 1
    for table, kind in [
        ("bronze_internal_stats", "internal-stats"),
        ("bronze_policies", "policies"),
        ("bronze_producer_stats", "producer-stats"),
        ("bronze_topic_stats", "topic-stats"),
    ]:
        assert f"{table} has no rows for 2026-11-21 although {kind} files landed for it" in out.output
    assert "4 critical expectation(s) failed" in out.output
    assert "WARNING brokerlens.quality.validate: warning: bronze_metrics has no rows for 2026-11-21 (nothing landed for it)" in out.stderr

    # Only the bronze suites ran, and each result row has the table's row count for the day.
    results = read_table("validation_results", settings=settings, spark=spark).collect()
    bronze = {n for n, s in table_schemas().items() if n.startswith("bronze_")}
    assert {r["table_name"] for r in results} == bronze
    counts = {r["table_name"]: r["rows"] for r in results}
    assert counts == {t: landed if t == "bronze_dispatch" else 0 for t in bronze}
    row_count = {r["table_name"]: (r["severity"], r["success"]) for r in results if r["expectation"] == "expect_table_row_count_to_be_between"}
    # Critical wherever files landed (dispatch among them, which has rows), a warning for metrics.
    assert row_count == {
        t: ("critical", True) if t == "bronze_dispatch" else ("warning", False) if t == "bronze_metrics" else ("critical", False) for t in bronze
    }
