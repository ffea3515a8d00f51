"""Timing and memory per stage, and the sections that measure the dispatch stages at each
size, consecutive days, landing and the demo day through every daily stage."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from brokerlens.platform.jvm import heap_used

from .generate import PERIODS_PER_DAY, Topology, write_input
from .memory import MemorySampler, old_gen_peak_mb, reset_heap_peak
from .stages import (
    dispatch_frame,
    duckdb_dispatch,
    opening_debt_file,
    plain_pass,
    plan_summary,
    spark_dispatch,
)

log = logging.getLogger("brokerlens.bench")


class Bench:
    """Runs stages, timing each and recording its peak memory."""

    def __init__(self, spark, cores: int):
        self.spark = spark
        self.cores = cores
        self.sampler = MemorySampler(heap_used=heap_used(spark))

    def measure(self, fn: Callable[[], int], rows: int | None = None) -> dict:
        """Run ``fn`` (returns the rows it produced); ``rows`` overrides the rate's row count."""
        reset_heap_peak(self.spark)
        self.sampler.reset()
        load = os.getloadavg()[0]
        started = time.perf_counter()
        produced = fn()
        seconds = max(0.01, round(time.perf_counter() - started, 2))  # the file is self-consistent
        rows = rows if rows is not None else produced
        memory = {**self.sampler.snapshot(), **old_gen_peak_mb(self.spark)}
        # The old generation alone at its peak is heap in use too, if the samples missed it.
        memory["jvm_heap_peak_mb"] = max(memory["jvm_heap_peak_mb"], memory["jvm_old_gen_peak_mb"])
        return {
            "rows": rows,
            "seconds": seconds,
            "rows_per_second_per_core": round(rows / seconds / self.cores),
            **memory,
            "load_avg_1m_before": round(load, 2),
        }

    def close(self) -> None:
        self.sampler.close()


def ratio(a: dict, b: dict) -> float:
    return round(a["seconds"] / b["seconds"], 2)


# Candidate settings for dispatch_periods, measured on the same input (suggestions for the
# settings' defaults). The scan's shuffle (DispatchScanExtension.scala) starts from
# spark.sql.shuffle.partitions (brokerlens' default 8), which adaptive execution may coalesce:
# one partition per core is the candidate.
VARIANTS: dict[str, dict[str, str]] = {
    "dispatch_periods[shuffle_partitions=2]": {"spark.sql.shuffle.partitions": "2"},
}


def with_conf(spark, conf: dict[str, str], fn: Callable[[], int]) -> int:
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        return fn()
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def median_runs(bench: Bench, calls: dict[str, Callable[[], int]], rounds: int) -> dict[str, dict]:
    """Each call measured ``rounds`` times, round by round in turn, so that a slower spell of the
    machine falls on all of them; each call's entry is its median run's, with every run's
    seconds. One run of each on a 2-core machine put dispatch_periods at 1.09 to 1.53 times
    DuckDB in runs a day apart."""
    runs: dict[str, list[dict]] = {name: [] for name in calls}
    for _ in range(max(1, rounds)):
        for name, call in calls.items():
            runs[name].append(bench.measure(call))
    return {name: {**sorted(done, key=lambda r: r["seconds"])[len(done) // 2], "runs_seconds": [r["seconds"] for r in done]} for name, done in runs.items()}


def bench_sizes(
    bench: Bench,
    work: Path,
    sizes: tuple[int, ...],
    day: date,
    periods: int = PERIODS_PER_DAY,
    done: Callable[[dict], None] = lambda entry: None,
    variant_sizes: tuple[int, ...] = (),
    rounds: int = 1,
) -> list[dict]:
    """Each size in turn; ``done`` gets each size's entry as soon as it is measured. The plain
    pass, dispatch_periods and DuckDB run ``rounds`` times each, alternated (:func:`median_runs`).
    The ``VARIANTS`` of dispatch_periods run at ``variant_sizes``."""
    spark, out = bench.spark, []
    opening = opening_debt_file(work, day)
    warm = None
    for partitions in sizes:
        topo = Topology(partitions)
        started = time.perf_counter()
        inputs = write_input(work / f"input-p{partitions}", day, partitions, periods=periods)
        generated = time.perf_counter() - started
        input_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
        log.info("size %s partitions: %s scopes, %s records (%.1fs to generate)", partitions, topo.scopes, input_rows, generated)
        if warm is None:  # JIT and first-job costs, so that the smallest size is not penalised
            plain_pass(spark, inputs, work / "warmup", int(spark.conf.get("spark.sql.shuffle.partitions")))
            spark_dispatch(spark, inputs, opening, work / "warmup")
            warm = True
        shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
        compared: dict[str, Callable[[], int]] = {
            "plain_pass": lambda: plain_pass(spark, inputs, work / "out-plain", shuffle),
            "dispatch_periods": lambda: spark_dispatch(spark, inputs, opening, work / "out-dispatch"),
            "duckdb": lambda: duckdb_dispatch(inputs, opening, work / "out-duckdb.parquet", bench.cores),
        }
        stages = median_runs(bench, compared, rounds)
        # The same two without writing: how much of each is computing, how much writing
        # (dispatch_periods writes 45 columns, the plain pass the input's 15).
        stages["plain_pass[no write]"] = bench.measure(lambda: plain_pass(spark, inputs, None, shuffle), rows=input_rows)
        stages["dispatch_periods[no write]"] = bench.measure(lambda: spark_dispatch(spark, inputs, opening, None), rows=input_rows)
        if partitions in variant_sizes:
            for name, conf in VARIANTS.items():
                stages[name] = bench.measure(lambda: with_conf(spark, conf, lambda: spark_dispatch(spark, inputs, opening, work / "out-variant")))
        plan = plan_summary(dispatch_frame(spark, inputs, opening))
        entry = {
            "partitions": partitions,
            "scopes": topo.scopes,
            "input_rows": input_rows,
            "dense_periods": topo.scopes * periods,
            "generate_seconds": round(generated, 2),
            "stages": stages,
            "ratios": {
                "dispatch_periods/plain_pass": ratio(stages["dispatch_periods"], stages["plain_pass"]),
                "dispatch_periods/duckdb": ratio(stages["dispatch_periods"], stages["duckdb"]),
                "dispatch_periods[no write]/plain_pass[no write]": ratio(stages["dispatch_periods[no write]"], stages["plain_pass[no write]"]),
                **{f"{name}/dispatch_periods": ratio(stages[name], stages["dispatch_periods"]) for name in VARIANTS if name in stages},
            },
            "variant_conf": {name: VARIANTS[name] for name in VARIANTS if name in stages},
            "dispatch_plan": plan,
        }
        log.info("size %s: %s", partitions, json.dumps({k: v["seconds"] for k, v in stages.items()}))
        out.append(entry)
        done(entry)
        shutil.rmtree(inputs["intervals"][0].rsplit("/", 1)[0], ignore_errors=True)
    return out


def bench_days(bench: Bench, work: Path, partitions: int, first: date, days: int = 3, periods: int = PERIODS_PER_DAY) -> dict:
    """Build consecutive days through the real table layer: day N+1 reads day N's closing debt
    from ``debt_state``; its time must not grow with the days already in the lake."""
    from brokerlens.gold.dispatch.build import build_dispatch
    from brokerlens.platform.tables import write_table
    from brokerlens.settings import Settings

    spark = bench.spark
    home = work / "days-home"
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(home=home)
    out = []
    for n in range(days):
        day = first + timedelta(days=n)
        inputs = write_input(work / f"days-input-{n}", day, partitions, periods=periods)
        for table, files in (("dispatch_intervals", inputs["intervals"]), ("rate_limits", inputs["limits"])):
            write_table(spark.read.parquet(*files), table, "replace", [{"day": day}], settings=settings)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in inputs["intervals"])
        writes: list = []
        result = bench.measure(lambda: len(writes.extend(build_dispatch(spark, day, settings).writes) or writes), rows=rows)
        out.append({"day": day.isoformat(), **result, "write_seconds": {w.table: w.seconds for w in writes}})
        log.info("day %s built in %ss", day, result["seconds"])
        shutil.rmtree(work / f"days-input-{n}", ignore_errors=True)
    return {
        "partitions": partitions,
        "stage": "build_dispatch (dispatch_periods, debt_state, dispatch_daily through brokerlens.platform.tables)",
        "days": out,
        "last_over_first": round(out[-1]["seconds"] / out[0]["seconds"], 2),
    }


def floor_schemas(spark, landing_day: Path) -> dict:
    """Per landing kind, its files and the explicit schema its floor reads them with: the schema
    Spark's JSON reader infers from those files (every field, not only those land uses), inferred
    here, outside any measurement; ``None`` for /metrics, which the text reader reads."""
    from brokerlens.land.bronze import PARSERS

    kinds = {}
    for parser in PARSERS:
        paths = [str(p) for p in sorted((landing_day / parser.KIND).glob("*")) if p.name.endswith(parser.SUFFIXES)]
        if paths:
            schema = None if parser.KIND == "metrics" else spark.read.json(paths, multiLine=parser.WHOLE_FILE).schema
            kinds[parser.KIND] = (paths, schema, parser.WHOLE_FILE)
    return kinds


def landing_floor(spark, kinds: dict, out: Path) -> int:
    """The floor for ``land`` (issue 30's definition): the same landing files read by Spark's
    JSON reader with an explicit schema (``floor_schemas``; multi-line for the stats files, the
    text reader for Prometheus metrics) and the rows written to Delta, one table per kind, with
    no checks, envelopes or quarantine."""
    rows = 0
    for kind, (paths, schema, whole_file) in kinds.items():
        frame = spark.read.text(paths) if schema is None else spark.read.schema(schema).json(paths, multiLine=whole_file)
        target = str(out / kind)
        frame.write.format("delta").mode("overwrite").save(target)
        rows += spark.read.format("delta").load(target).count()
    return rows


@contextmanager
def warm_floor(spark, landing_day: Path, out: Path) -> Iterator[Callable[[], int]]:
    """``landing_floor`` on ``landing_day`` as a call to measure, after one untimed run (measured,
    it then reads and writes, without the JVM's warm-up on JSON); its tables are removed after."""
    kinds = floor_schemas(spark, landing_day)

    def floor() -> int:
        return landing_floor(spark, kinds, out)

    floor()
    try:
        yield floor
    finally:
        shutil.rmtree(out, ignore_errors=True)


def bench_landing(bench: Bench, work: Path, scales: tuple[float, ...], day: date, rounds: int = 1) -> list[dict]:
    """demo-data landing files, then their floor (``landing_floor``) and ``land`` (landing →
    bronze) side by side, per demo scale: each once untimed, then ``rounds`` times each,
    alternated (:func:`median_runs`)."""
    from brokerlens.land.bronze import land_day
    from brokerlens.settings import Settings
    from brokerlens.sources.demo import generate_day as demo_day

    out = []
    for scale in scales:
        home = work / f"land-home-{scale:g}"
        shutil.rmtree(home, ignore_errors=True)
        settings = Settings(home=home)
        started = time.perf_counter()
        demo = demo_day(day, settings, scale=scale)
        generated = time.perf_counter() - started
        landing_day = settings.landing / day.isoformat()
        landed: dict = {}

        def land() -> int:
            result = land_day(bench.spark, day, settings)
            landed.update(result.metrics)
            return sum(w.rows for w in result.writes if w.rows > 0)

        # Both sides run once before they are measured, as bench_sizes' stages do. The floor's
        # run warms Spark's JSON reader and Delta's writer, not land's own readers and checks,
        # whose first run in the JVM compiles them: kept as first_run_seconds.
        first = bench.measure(land)
        with warm_floor(bench.spark, landing_day, work / "out-floor") as floor:
            runs = median_runs(bench, {"land": land, "floor": floor}, rounds)
        entry = {"scale": scale, "demo_seconds": round(generated, 2), **runs["land"], "first_run_seconds": first["seconds"]}
        entry["floor"] = runs["floor"]
        entry["land/floor"] = ratio(entry, runs["floor"])
        entry["landing_files_mb"] = round(sum(p.stat().st_size for p in landing_day.rglob("*") if p.is_file()) / 2**20, 1)
        entry["land_metrics"] = {k: v for k, v in landed.items() if isinstance(v, (int, float))}
        entry["demo_metrics"] = {k: v for k, v in demo.metrics.items() if isinstance(v, (int, float))}
        out.append(entry)
        log.info("landing at scale %s: %ss (first run %ss), floor %ss", scale, entry["seconds"], first["seconds"], runs["floor"]["seconds"])
        shutil.rmtree(home, ignore_errors=True)
    return out


def daily_step(bench: Bench, stage: str, layer: str | None, day: date, settings, rows: int | None = None):
    """One daily step in this process, measured (``rows``: as ``Bench.measure``; by default the
    rows it wrote): (its name, its StageResult, the figures). ``alert`` is a dry run: no SMTP
    server in the bench."""
    from brokerlens.pipeline import run_stage

    options = {"layer": layer} if layer else {}
    if stage == "alert":
        options["dry_run"] = True
    done: list = []

    def run() -> int:
        done.append(run_stage(stage, day, settings, bench.spark, **options))
        return sum(w.rows for w in done[0].writes)

    measured = bench.measure(run, rows=rows)
    return (f"{stage} {layer}" if layer else stage), done[0], measured


def bench_demo_day(bench: Bench, work: Path, scale: float, day: date) -> dict:
    """The daily stages in order on one demo day, in this process (no spark-submit start-up):
    seconds per stage and per committed table (the table layer's write path)."""
    from brokerlens.pipeline import DAILY_STEPS
    from brokerlens.settings import Settings
    from brokerlens.sources.demo import generate_day as demo_day

    home = work / "demo-day-home"
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(home=home)
    demo_day(day, settings, scale=scale)
    stages = {}
    for stage, layer in DAILY_STEPS:
        step, result, measured = daily_step(bench, stage, layer, day, settings)
        stages[step] = {"seconds": measured["seconds"], "write_seconds": {w.table: w.seconds for w in result.writes}}
        log.info("demo day %s: %ss", step, measured["seconds"])
    shutil.rmtree(home, ignore_errors=True)
    return {"scale": scale, "stages": stages, "total_seconds": round(sum(s["seconds"] for s in stages.values()), 2)}
