"""The benchmark harness at a tiny scale: generated input, results file, and the DuckDB reference
agreeing with dispatch_periods (and with a plain sequential Lindley loop)."""

from __future__ import annotations

import contextlib
import json
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import brokerlens_bench as bench
from brokerlens.platform.schemas import table_schema

DAY = date(2026, 11, 20)
PERIODS = 900  # the first 15 minutes of the day: seconds, not minutes, per test


def test_generated_day_has_silver_shape_and_realistic_series():
    intervals, limits = bench.generate_day(DAY, 2, periods=PERIODS)
    assert intervals.column_names == table_schema("dispatch_intervals").column_names
    assert limits.column_names == table_schema("rate_limits").column_names
    topo = bench.Topology(2)
    per_level = {r["level"]: r["count"] for r in intervals.group_by("level").aggregate([("level", "count")]).rename_columns(["level", "count"]).to_pylist()}
    # 6 subscriptions, 2 partitions, 1 broker; idle seconds have no record.
    assert topo.scopes == 9
    assert 0.7 * 6 * PERIODS < per_level["subscription"] < 6 * PERIODS
    assert per_level["topic"] <= 2 * PERIODS and per_level["broker"] <= PERIODS
    assert pc.min(intervals["msgs"]).as_py() > 0
    # A partition's topic-level delivery is the sum of its subscriptions' in every period.
    subs = intervals.filter(pc.equal(intervals["level"], "subscription"))
    summed = subs.group_by(["topic", "interval_start"]).aggregate([("msgs", "sum"), ("bytes", "sum")])
    topics = intervals.filter(pc.equal(intervals["level"], "topic")).select(["topic", "interval_start", "msgs", "bytes"])
    joined = topics.join(summed, ["topic", "interval_start"])
    assert joined.num_rows == topics.num_rows
    assert joined["msgs"].to_pylist() == joined["msgs_sum"].to_pylist()
    assert joined["bytes"].to_pylist() == joined["bytes_sum"].to_pylist()
    # Some subscription periods go over their quota (bursts), most stay under it.
    sub_limits = limits.filter(pc.equal(limits["level"], "subscription")).to_pylist()

    def quota(topic, at):
        return next(r["msg_limit"] for r in sub_limits if r["topic"] == topic and r["valid_from"] <= at < r["valid_to"])

    rows = subs.select(["topic", "interval_start", "msgs"]).to_pylist()
    over = sum(1 for r in rows if r["msgs"] > quota(r["topic"], r["interval_start"]))
    assert 0 < over < 0.5 * len(rows)
    # Deterministic: the same day and size give the same data.
    assert bench.generate_day(DAY, 2, periods=PERIODS)[0].equals(intervals)


def _sequential(delivered: list[int], quota: list[int | None], opening: int = 0) -> list[tuple[int, int, int]]:
    """Pulsar's limiter period by period: (debt_in, over, debt_out) for each period."""
    debt, out = opening, []
    for d, q in zip(delivered, quota):
        if q is None:
            debt = 0
            out.append((0, 0, 0))
            continue
        allowed = max(0, q - debt)
        out.append((debt, max(0, d - allowed), max(0, debt + d - q)))
        debt = max(0, debt + d - q)
    return out


@pytest.fixture
def tiny_input(tmp_path):
    inputs = bench.write_input(tmp_path / "in", DAY, 2, files=2, periods=PERIODS)
    sub = ("subscription", "persistent://bench/ns0/orders-0-partition-1", "sub-2")
    opening = pa.table(
        {
            "day": pa.array([DAY - timedelta(days=1)] * 2, pa.date32()),
            "level": ["subscription", "broker"],
            "cluster": [bench.CLUSTER] * 2,
            "broker": ["broker-0.bench:8080"] * 2,
            "topic": [sub[1], None],
            "subscription": [sub[2], None],
            "debt_msgs": pa.array([50_000, 2_000], pa.int64()),
            "debt_bytes": pa.array([10**9, 0], pa.int64()),
            "last_period_start": pa.array([None, None], pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(opening, tmp_path / "opening.parquet")
    return inputs, str(tmp_path / "opening.parquet"), sub


def test_duckdb_reference_matches_a_sequential_loop(tiny_input, tmp_path):
    inputs, opening, (level, topic, subscription) = tiny_input
    out = tmp_path / "duck.parquet"
    assert bench.duckdb_dispatch(inputs, opening, out, threads=2) == sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
    rows = duckdb.sql(
        f"SELECT epoch(period_start)::BIGINT AS t, counted_msgs, debt_in_msgs, over_msgs, debt_out_msgs, "
        f"bytes, debt_in_bytes, over_bytes, debt_out_bytes FROM '{out}' "
        f"WHERE level = '{level}' AND topic = '{topic}' AND subscription = '{subscription}' ORDER BY t"
    ).fetchall()
    lim = pq.read_table(inputs["limits"][0]).to_pylist()
    sub_limits = [r for r in lim if r["level"] == "subscription" and r["topic"] == topic]
    start = int(sub_limits[0]["valid_from"].timestamp())

    def limit_at(t: int, key: str):
        return next(r[key] for r in sub_limits if r["valid_from"].timestamp() <= t < r["valid_to"].timestamp())

    # The dense series: every period of the scope, zero where there is no record.
    by_t = {r[0]: r for r in rows}
    ts = range(start, start + PERIODS)
    for unit, delivered_at, limit_key, opening_debt, cols in (
        ("msgs", 1, "msg_limit", 50_000, (2, 3, 4)),
        ("bytes", 5, "byte_limit", 10**9, (6, 7, 8)),
    ):
        delivered = [by_t[t][delivered_at] if t in by_t else 0 for t in ts]
        expected = _sequential(delivered, [limit_at(t, limit_key) for t in ts], opening_debt)
        got = [tuple(by_t[t][c] for c in cols) for t in ts if t in by_t]
        assert got == [e for t, e in zip(ts, expected) if t in by_t], unit
    assert rows[0][2] > 40_000  # the opening debt is carried into the first periods
    assert any(r[3] > 0 for r in rows)  # the reference exercises over-delivery


@pytest.mark.slow
def test_duckdb_reference_agrees_with_dispatch_periods(spark, tiny_input, tmp_path):
    inputs, opening, _ = tiny_input
    bench.duckdb_dispatch(inputs, opening, tmp_path / "duck.parquet", threads=2)
    n = bench.spark_dispatch(spark, inputs, opening, tmp_path / "spark")
    assert n == sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
    # Same columns (the whole dispatch_periods table) and the same value in every one of them.
    columns = table_schema("dispatch_periods").column_names
    assert duckdb.sql(f"SELECT * FROM '{tmp_path}/duck.parquet' LIMIT 0").columns == columns
    keys = ["level", "cluster", "broker", "topic", "subscription", "period_start"]
    compared = [c for c in columns if c not in keys]
    on = " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in keys)
    diff = " OR ".join(f"a.{c} IS DISTINCT FROM b.{c}" for c in compared)
    sums = ", ".join(f"sum(a.{c}) = sum(b.{c})" for c in ("over_msgs", "debt_out_msgs", "over_bytes"))
    matched, differing, *same_sums = duckdb.sql(
        f"SELECT count(*), count(*) FILTER (WHERE {diff}), {sums} FROM read_parquet('{tmp_path}/spark/*.parquet') a JOIN '{tmp_path}/duck.parquet' b ON {on}"
    ).fetchone()
    assert (matched, differing) == (n, 0)
    assert all(same_sums)
    assert duckdb.sql(f"SELECT sum(over_msgs) > 0 FROM '{tmp_path}/duck.parquet'").fetchone()[0]


@pytest.mark.heavy  # every section of the bench at its smallest: about 13 minutes on 2 cores
def test_results_file_shape(spark, tmp_path):
    out = tmp_path / "bench" / "results.json"
    results = bench.run(
        out,
        sizes=(1,),
        days_partitions=1,
        land_scales=(),
        periods=300,
        variant_sizes=(1,),
        rounds=3,
        demo_day_scale=None,
        spark=spark,
    )  # the daily steps in this process: tests/test_bench_large.py
    assert json.loads(out.read_text()) == results
    assert results["complete"] is True
    assert results["environment"]["cores"] == spark.sparkContext.defaultParallelism
    sizes = results["sizes"]
    assert [s["partitions"] for s in sizes] == [1]
    for size in sizes:
        stages = size["stages"]
        assert set(stages) == {
            "plain_pass", "dispatch_periods", "duckdb", "plain_pass[no write]", "dispatch_periods[no write]",
            *bench.VARIANTS,
        }  # fmt: skip
        for name in ("plain_pass", "dispatch_periods", "duckdb"):  # the middle of 3 alternated runs
            runs = stages[name]["runs_seconds"]
            assert len(runs) == 3 and stages[name]["seconds"] == sorted(runs)[1]
        for stage in stages.values():
            assert stage["rows"] == size["input_rows"]
            assert stage["seconds"] > 0
            assert stage["rows_per_second_per_core"] == round(stage["rows"] / stage["seconds"] / results["environment"]["cores"])
            assert stage["jvm_rss_mb"] > 0 and stage["python_driver_rss_mb"] > 0
            assert stage["jvm_heap_peak_mb"] >= stage["jvm_old_gen_peak_mb"] > 0
        ratios = size["ratios"]
        assert ratios["dispatch_periods/duckdb"] == round(stages["dispatch_periods"]["seconds"] / stages["duckdb"]["seconds"], 2)
        for name in bench.VARIANTS:
            assert ratios[f"{name}/dispatch_periods"] == round(stages[name]["seconds"] / stages["dispatch_periods"]["seconds"], 2)
        assert size["dispatch_plan"]["python_udf_operators"] == 0
        assert size["dispatch_plan"]["shuffle_exchanges"] >= 1
    days = results["days"]
    assert [d["day"] for d in days["days"]] == ["2026-11-21", "2026-11-22", "2026-11-23"]
    assert days["last_over_first"] == round(days["days"][2]["seconds"] / days["days"][0]["seconds"], 2)
    assert not (tmp_path / "bench" / "work").exists()  # generated inputs are removed
    table = bench.markdown(results)
    head, _, rest = table.partition("\n\n")
    assert head.count("\n") == 1 + len(sizes)  # header, rule, one row per size
    assert "Consecutive days through the table layer" in rest
    assert "the median of 3 runs each, alternated" in rest
    # Issue 16's ratios side by side, in the results file and after the table.
    n = sizes[0]["input_rows"]
    assert results["targets"] == {
        f"dispatch_periods/plain_pass at {n:,} records": sizes[0]["ratios"]["dispatch_periods/plain_pass"],
        f"dispatch_periods/duckdb at {n:,} records": sizes[0]["ratios"]["dispatch_periods/duckdb"],
    }
    assert f"| dispatch_periods/duckdb at {n:,} records | {sizes[0]['ratios']['dispatch_periods/duckdb']} |" in rest
    # A section that raised is kept in the file, said in the summary, and fails `make bench`.
    assert bench.failed_sections(results) == {}
    broken = {**results, "dag": {"error": "RuntimeError: stack.sh exited 1"}}
    assert bench.failed_sections(broken) == {"dag": "RuntimeError: stack.sh exited 1"}
    assert "The dag section failed: RuntimeError: stack.sh exited 1." in bench.markdown(broken)


@pytest.mark.heavy  # a demo day landed four times beside its floor: about 90 s on 2 cores
def test_landing_section_measures_land_and_its_floor_alike(spark, tmp_path):
    """Each side runs once first, then three times alternated: land's own first run in the JVM
    (compiling its readers and checks) is kept apart, not set against a warm floor."""
    results = bench.run(tmp_path / "results.json", sizes=(), days_partitions=0, land_scales=(0.01,), demo_day_scale=None, rounds=3, spark=spark)
    (entry,) = results["landing"]
    for side in (entry, entry["floor"]):
        assert len(side["runs_seconds"]) == 3 and side["seconds"] == sorted(side["runs_seconds"])[1]
    assert entry["first_run_seconds"] > 0
    landed = entry["land_metrics"]
    kinds = ("topic-stats", "internal-stats", "dispatch", "producer-stats", "policies", "metrics")
    assert entry["rows"] == sum(landed[f"{kind}_rows"] for kind in kinds) + landed["quarantined"] > landed["quarantined"] > 0  # bronze and quarantine
    assert entry["floor"]["rows"] > entry["rows"]  # the floor keeps every record and every /metrics line
    assert entry["land/floor"] == round(entry["seconds"] / entry["floor"]["seconds"], 2)
    assert results["targets"] == {f"land/floor at demo scale 0.01 ({entry['landing_files_mb']} MB)": entry["land/floor"]}
    assert f"the median of 3 runs alternated with its floor's ({entry['floor']['seconds']} s)" in bench.markdown(results)
    assert not (tmp_path / "work" / "out-floor").exists() and not (tmp_path / "work" / "land-home-0.01").exists()


def test_benchmarks_page_shows_the_committed_figures(tmp_path):
    """docs/benchmarks.md's figures are those of the committed results file, with its command."""
    root = Path(__file__).resolve().parents[1]
    latest = json.loads((root / "infra" / "bench" / "latest.json").read_text())
    page = (root / "docs" / "benchmarks.md").read_text()
    assert latest["complete"] is True
    assert bench.failed_sections(latest) == {}
    assert bench.markdown(latest) in page
    assert latest["command"] in page
    # --page rewrites only the figures: the committed page is what it writes from the committed file.
    copy = tmp_path / "benchmarks.md"
    copy.write_text(page.replace(bench.markdown(latest), "stale figures"))
    bench.write_page(copy, latest)
    assert copy.read_text() == page


def test_dag_against_the_stage_server_alternates_and_compares_medians(monkeypatch, tmp_path):
    """Two rounds: Connect, stage server, stage server, Connect, so neither side has every first
    run; the medians of each side's DAG seconds and their ratio reach the targets and the page."""
    from brokerlens_bench import dag

    seconds = iter([120.0, 130.0, 110.0, 100.0])
    calls = []

    def fake_bench_dag(work, day, tasks_on):
        calls.append(tasks_on)
        return {"day": day.isoformat(), "tasks_run_on": dag.TASKS_RUN_ON[tasks_on], "dag_seconds": next(seconds), "tasks": {}}

    monkeypatch.setattr(dag, "bench_dag", fake_bench_dag)
    versus = dag.bench_dag_against_stage_server(tmp_path, DAY, rounds=2)
    assert calls == versus["order"] == ["connect", "stage_server", "stage_server", "connect"]
    assert versus["median_dag_seconds"] == {"connect": 110.0, "stage_server": 120.0}
    assert versus["connect/stage_server"] == 0.92
    results = {"sizes": [], "dag_vs_stage_server": versus}
    name = "demo day through the DAG, Spark Connect / the stage server of fd86abf (medians of 2 alternated runs; at most 1)"
    assert bench.targets(results) == {name: 0.92}
    assert (
        "in this order: Spark Connect 120.0 s, stage server 130.0 s, stage server 110.0 s, Spark Connect 100.0 s; "
        "medians 110.0 s (Spark Connect) and 120.0 s (stage server), 0.92×."
    ) in bench.markdown(results)


def test_dispatch_against_the_stage_server_alternates_each_in_its_own_tree(monkeypatch, tmp_path):
    """Two rounds: today, stage server, stage server, today, the stage server's from a worktree
    of its commit; the medians of each side's seconds and ratios, today's dispatch seconds over
    the stage server's, reach the targets and the page."""
    from brokerlens_bench import stage_server_commit as then

    figures = iter([(20.0, 46.8, 33.3), (20.0, 48.0, 32.0), (20.0, 52.0, 40.0), (18.5, 48.1, 34.5)])
    trees = []

    @contextlib.contextmanager
    def fake_checkout(work):
        yield work / "stage-server-tree"

    def fake_sizes_run(tree, work, partitions):
        plain, dispatch, duckdb = next(figures)
        trees.append(tree.name)
        assert partitions == 32
        return {
            "input_rows": 10_789_115,
            "plain_pass_seconds": plain,
            "dispatch_periods_seconds": dispatch,
            "duckdb_seconds": duckdb,
            "dispatch_periods/plain_pass": round(dispatch / plain, 2),
            "dispatch_periods/duckdb": round(dispatch / duckdb, 2),
        }

    monkeypatch.setattr(then, "stage_server_checkout", fake_checkout)
    versus = then.bench_dispatch_against_stage_server(tmp_path, 32, 2, sizes_run=fake_sizes_run)
    assert trees == [then.REPO.name, "stage-server-tree", "stage-server-tree", then.REPO.name]
    assert [r["side"] for r in versus["runs"]] == ["today", "stage_server", "stage_server", "today"]
    assert versus["medians"]["today"]["dispatch_periods_seconds"] == 47.45
    assert versus["medians"]["stage_server"]["dispatch_periods_seconds"] == 50.0
    # (2.34 + 2.6) / 2 and (1.41 + 1.39) / 2; (2.4 + 2.6) / 2 and (1.5 + 1.3) / 2
    assert versus["medians"]["today"]["dispatch_periods/plain_pass"] == 2.47
    assert versus["medians"]["today"]["dispatch_periods/duckdb"] == 1.4
    assert versus["medians"]["stage_server"]["dispatch_periods/plain_pass"] == 2.5
    assert versus["medians"]["stage_server"]["dispatch_periods/duckdb"] == 1.4
    assert versus["today/stage_server"] == 0.95
    targets = bench.targets({"sizes": [], "dispatch_vs_stage_server": versus})
    assert targets == {
        "dispatch_periods at 10,789,115 records, today / fd86abf (medians of 2 alternated runs, each its own process; at most 1)": 0.95,
        "dispatch_periods/plain_pass at 10,789,115 records in the same runs, today and fd86abf": "2.47, 2.5",
        "dispatch_periods/duckdb at 10,789,115 records in the same runs, today and fd86abf": "1.4, 1.4",
    }
    assert (
        "dispatch_periods s in this order: today 46.8, fd86abf 48.0, fd86abf 52.0, today 48.1; medians today 47.45 s (2.47× plain, 1.4× DuckDB), "
        "fd86abf 50.0 s (2.5× plain, 1.4× DuckDB); today / fd86abf 0.95×."
    ) in bench.markdown({"sizes": [], "dispatch_vs_stage_server": versus})


def test_spark_applications_from_a_real_event_log():
    """The DAG section's fixed costs come from Spark's own event log. The fixture is cut from the
    log Spark 4.1.4 wrote for a `land` run (spark.eventLog.enabled, uncompressed, its default
    rolling folder layout): the application's start, its first two jobs and its end."""
    events = Path(__file__).parent / "fixtures" / "spark_events"
    (app,) = bench.spark_applications(events)
    # ApplicationStart 1795477516045 ms, the JobStarts' Submission Times 1795477518854 and
    # 1795477519395 ms, ApplicationEnd 1795477580074 ms.
    assert app == {"start": 1795477516.045, "jobs": [1795477518.854, 1795477519.395], "end": 1795477580.074}


def test_task_fixed_cost_on_its_own_application_or_on_the_connect_server():
    app = {"start": 1795477516.045, "jobs": [1795477518.854, 1795477519.395], "end": 1795477580.074}
    # A spark-submit task started at ...514.0: its application came up 2.0 s in, its first job 4.9 s in.
    assert bench.task_fixed_cost(1795477514.0, 1795477581.0, [app]) == {"fixed_seconds": 4.9, "to_spark_context_seconds": 2.0}
    # A task on the Spark Connect server (its application up before it): only its own jobs count.
    assert bench.task_fixed_cost(1795477519.0, 1795477530.0, [app]) == {"fixed_seconds": 0.4, "to_spark_context_seconds": 0.0}
    # A task that ran no Spark job has no figure.
    assert bench.task_fixed_cost(1795477520.0, 1795477530.0, [app]) == {}
