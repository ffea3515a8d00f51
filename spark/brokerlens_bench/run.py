"""A whole bench run: every section, the results file and the targets side by side."""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import psutil

from brokerlens.platform.jvm import context_conf, default_parallelism
from brokerlens.platform.times import iso

from .dag import bench_dag, bench_dag_against_stage_server
from .generate import DEFAULT_SIZES, PERIODS_PER_DAY
from .harness import Bench, bench_days, bench_demo_day, bench_landing, bench_sizes
from .interceptor import SECONDS, WARMUP_SECONDS, bench_interceptor
from .large import LARGE_MINUTES, large_day_in_own_process
from .stage_server_commit import DISPATCH_RATIOS, bench_dispatch_against_stage_server

log = logging.getLogger("brokerlens.bench")


def _guarded(what: str, fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:  # recorded in the results file and logged with its traceback
        log.exception("bench %s failed", what)
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"}


def environment(spark, cores: int) -> dict:
    import duckdb
    import pyspark

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    conf = context_conf(spark)
    return {
        "cores": cores,
        "cpu": cpu,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "spark_master": conf.get("spark.master"),
        "spark_driver_memory": conf.get("spark.driver.memory", "1g"),
        "spark_shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def run(
    out: Path,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    days_partitions: int | None = None,
    land_scales: tuple[float, ...] = (1.0,),
    work: Path | None = None,
    day: date = date(2026, 11, 20),
    periods: int = PERIODS_PER_DAY,
    command: str = "brokerlens_bench.run",
    variant_sizes: tuple[int, ...] = (),
    rounds: int = 1,
    demo_day_scale: float | None = 1.0,
    dag: bool = False,
    dag_rounds: int = 0,
    dispatch_rounds: int = 0,
    large_partitions: int | None = None,
    large_minutes: tuple[int, ...] = LARGE_MINUTES,
    interceptor_rounds: int = 0,
    interceptor_seconds: float = SECONDS,
    interceptor_warmup: float = WARMUP_SECONDS,
    spark=None,
) -> dict:
    """The whole benchmark; writes the results to ``out`` (JSON) and returns them. The interceptor
    section runs when ``interceptor_rounds`` > 0 (the command line's default: 3), the DAG against
    the stage server's when ``dag`` and ``dag_rounds`` > 0 (default: 2), dispatch_periods at the
    largest of ``sizes`` against the stage server's when ``dispatch_rounds`` > 0 (default: 2)."""
    from brokerlens.platform.spark import get_spark
    from brokerlens.settings import get_settings

    spark = spark or get_spark(get_settings())
    work = work or out.parent / "work"
    work.mkdir(parents=True, exist_ok=True)
    cores = default_parallelism(spark)
    started = datetime.now(timezone.utc).replace(microsecond=0)
    bench = Bench(spark, cores)

    def save(*_) -> None:  # after every section: a run cut short still leaves its figures
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")

    try:
        results: dict = {
            "command": command,
            "started_at": iso(started),
            "environment": environment(spark, cores),
            "notes": {
                "rows": "dispatch_intervals records of the day (one per scope and one-second period with "
                "delivery; idle periods have no record); dispatch_periods has one row per record",
                "rows_per_second_per_core": "rows / seconds / cores (Spark local[*] and DuckDB threads on the same cores)",
                "memory": "peak RSS sampled every 0.1 s: the driver JVM (runs the tasks in local mode), this "
                "Python process (DuckDB runs in it), Spark's Python workers summed, and the JVM's heap in use; the JVM's old generation peak from its MXBean",
                "large_day": "the first minutes of a generated day (brokerlens_bench.large_files) through the daily steps, "
                "in a process of its own after the smallest window once to warm it up (large_day_in_own_process); "
                "per stage rows_in are the rows of the layer it reads (landing records, bronze, silver or gold "
                "rows), rows_out what it wrote. Projection (project_day): the seconds per minute of data (the "
                "difference of the two largest windows) grow linearly with minutes x partitions and shrink "
                "linearly with cores; the rest (warm-up, planning, Delta commits) stays fixed. It leaves out "
                "the shuffle, skew and memory effects of many more rows per task",
                "interceptor": "a live Pulsar standalone without and with brokerlens' interceptor, alternated round by round "
                "(brokerlens_bench.interceptor); dispatched_per_second from the subscription's msgOutCounter over the "
                "measured window; overhead_percent = 100 x (1 - with / without) of the medians",
            },
            "complete": False,
            "sizes": [],
        }
        bench_sizes(
            bench,
            work,
            sizes,
            day,
            periods,
            done=lambda entry: save(results["sizes"].append(entry)),
            rounds=rounds,
            variant_sizes=variant_sizes,
        )
        # The consecutive days and the landing use other stages: a failure there is recorded
        # in the results (and logged) rather than losing the measurements above.
        if days_partitions:
            results["days"] = _guarded("days", lambda: bench_days(bench, work, days_partitions, day + timedelta(days=1), periods=periods))
            save()
        if land_scales:
            results["landing"] = _guarded("landing", lambda: bench_landing(bench, work, land_scales, day, rounds))
            save()
        if demo_day_scale:
            results["demo_day"] = _guarded("demo_day", lambda: bench_demo_day(bench, work, demo_day_scale, day))
            save()
        if large_partitions:
            results["large_day"] = _guarded("large_day", lambda: large_day_in_own_process(work, large_partitions, large_minutes, day))
            save()
        if dag:
            results["dag"] = _guarded("dag", lambda: bench_dag(work, day))
            save()
            results["dag_spark_submit"] = _guarded("dag_spark_submit", lambda: bench_dag(work, day, "spark_submit"))
            save()
            if dag_rounds:
                results["dag_vs_stage_server"] = _guarded("dag_vs_stage_server", lambda: bench_dag_against_stage_server(work, day, dag_rounds))
                save()
        if dispatch_rounds:
            results["dispatch_vs_stage_server"] = _guarded(
                "dispatch_vs_stage_server", lambda: bench_dispatch_against_stage_server(work, max(sizes or DEFAULT_SIZES), dispatch_rounds)
            )
            save()
        if interceptor_rounds:
            results["interceptor"] = _guarded("interceptor", lambda: bench_interceptor(work, interceptor_rounds, interceptor_seconds, interceptor_warmup))
        results["targets"] = targets(results)
    finally:
        bench.close()
    results["complete"] = True
    results["finished_at"] = iso(datetime.now(timezone.utc).replace(microsecond=0))
    results["total_seconds"] = round((datetime.now(timezone.utc) - started).total_seconds(), 1)
    save()
    shutil.rmtree(work, ignore_errors=True)
    return results


def failed_sections(results: dict) -> dict[str, str]:
    """The guarded sections that raised, with their error (the run is then incomplete as a benchmark)."""
    return {
        name: section["error"]
        for name in ("days", "landing", "demo_day", "large_day", "dag", "dag_spark_submit", "dag_vs_stage_server", "dispatch_vs_stage_server", "interceptor")
        if isinstance(section := results.get(name), dict) and "error" in section
    }


def targets(results: dict) -> dict:
    """The figures the targets are stated against, side by side: land / its floor per demo scale, dispatch_periods / the
    plain pass and / DuckDB at the largest size, the DAG's wall time, the large day's projection, the interceptor's
    throughput overhead."""
    out: dict = {}
    for entry in results.get("landing") if isinstance(results.get("landing"), list) else []:
        out[f"land/floor at demo scale {entry['scale']:g} ({entry['landing_files_mb']} MB)"] = entry["land/floor"]
    if results["sizes"]:
        largest = max(results["sizes"], key=lambda size: size["input_rows"])
        for name in DISPATCH_RATIOS:
            out[f"{name} at {largest['input_rows']:,} records"] = largest["ratios"][name]
    for section, name in (
        ("dag", "demo day through the DAG (Spark Connect clients), s"),
        ("dag_spark_submit", "demo day through the DAG (a spark-submit per task), s"),
    ):
        dag = results.get(section)
        if isinstance(dag, dict) and "tasks" in dag:
            out[name] = dag["dag_seconds"]
    versus = results.get("dag_vs_stage_server")
    if isinstance(versus, dict) and "runs" in versus:
        rounds = len(versus["runs"]) // 2
        name = f"demo day through the DAG, Spark Connect / the stage server of {versus['stage_server_commit'][:7]} (medians of {rounds} alternated runs; at most 1)"
        out[name] = versus["connect/stage_server"]
    versus = results.get("dispatch_vs_stage_server")
    if isinstance(versus, dict) and "runs" in versus:
        then, rounds, rows = versus["stage_server_commit"][:7], len(versus["runs"]) // 2, versus["input_rows"]
        name = f"dispatch_periods at {rows:,} records, today / {then} (medians of {rounds} alternated runs, each its own process; at most 1)"
        out[name] = versus["today/stage_server"]
        today, before = versus["medians"]["today"], versus["medians"]["stage_server"]
        for ratio in DISPATCH_RATIOS:
            out[f"{ratio} at {rows:,} records in the same runs, today and {then}"] = f"{today[ratio]}, {before[ratio]}"
    large = results.get("large_day")
    if isinstance(large, dict) and "windows" in large:
        for d in large["projection"]["days"]:
            out[f"large day: projected hours for {d['partitions']:,} partitions on {d['cores']} cores"] = d["hours"]
        minutes = ", ".join(str(w["minutes"]) for w in large["windows"])
        for w in large["windows"]:
            name = f"large day, {w['minutes']} min ({w['landing_mb']} MB): land MB/s per core, and its floor's"
            out[name] = f"{w['stages']['land']['mb_per_second_per_core']}, {w['floor']['mb_per_second_per_core']}"
            out[f"large day, {w['minutes']} min: land/floor"] = w["land/floor"]
        out[f"large day: peak JVM RSS MB per window ({minutes} min)"] = ", ".join(f"{m['jvm_rss_mb']:.0f}" for m in large["memory_by_rows"])
    section = results.get("interceptor")
    if isinstance(section, dict) and "runs" in section:
        out[f"interceptor: dispatch throughput lost, % (at most {section['target_percent']:g})"] = section["overhead_percent"]
    return out
