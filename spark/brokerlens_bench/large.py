"""The large cluster's day: windows of its first minutes through the daily steps, and the
whole day projected from their difference."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from .harness import Bench, daily_step, ratio, warm_floor

log = logging.getLogger("brokerlens.bench")


# The size of a large deployment: 50,000 partitions on 16 and 64 cores (and the generated size on this machine).
PROJECTED = ((50_000, 16), (50_000, 64))
LARGE_PARTITIONS = 2000
# Two windows, the day projected from their difference; the larger one of 2 hours, since two short
# windows differ by less than their noise (5 and 10 minutes once projected 0.28 h for the day, 5
# minutes and 2 hours 1.06 h: docs/benchmarks.md).
LARGE_MINUTES = (5, 120)


def large_day_in_own_process(work: Path, partitions: int, windows: tuple[int, ...], day: date) -> dict:
    """``bench_large_day`` in a process of its own (Python and JVM), as a day's `brokerlens run`
    is, not in the JVM that ran the bench's other sections before it: what they leave live in
    it (Spark's status store, the generated classes it caches, Delta's table states) was 296 to
    352 MB after the landing and demo-day sections against 44 MB in a new one, and in the 2 GB
    heap left the 2 hours' build silver 54 s instead of 33 s, or out of memory ("GC overhead
    limit exceeded") (docs/benchmarks.md). The process runs the smallest window once
    before the measured ones: measured first in a new JVM, its compilation would count as data
    and lower the projection's part per minute."""
    out = work / "large-day.json"
    out.unlink(missing_ok=True)
    command = ["-m", "brokerlens_bench.large_process", "--partitions", str(partitions), "--minutes", ",".join(map(str, windows))]
    command += ["--day", day.isoformat(), "--work", str(work), "--out", str(out)]
    # Its log goes to this process's (the steps' progress); its figures come back in a file.
    proc = subprocess.run([sys.executable, *command], env={**os.environ, "BROKERLENS_HOME": str(work / "large-day-process")})
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(command)} exited {proc.returncode} (its log is above)")
    return json.loads(out.read_text())


def bench_large_day(bench: Bench, work: Path, partitions: int, windows: tuple[int, ...], day: date) -> dict:
    """A large cluster's day (``large_cluster``, ``large_files``): for each window of the day's first
    minutes, its landing files, then the daily steps in this process as ``bench_demo_day`` runs
    them, each measured with the rows of the layer it reads; the whole day projected from the
    windows (``project_day``)."""
    from brokerlens.settings import Settings

    from .large_cluster import MINUTES

    out = []
    for minutes in windows:
        home = work / f"large-home-{minutes}"
        shutil.rmtree(home, ignore_errors=True)
        out.append(large_window(bench, Settings(home=home), partitions, minutes, day))
        shutil.rmtree(home, ignore_errors=True)
    return {
        "partitions": partitions,
        "windows": out,
        "projection": project_day(out, partitions, bench.cores, MINUTES),
        # Driver memory against rows: the bronze rows and the peaks of each window, in order.
        "memory_by_rows": [
            {
                "bronze_rows": w["stages"]["land"]["rows_out"],
                "jvm_rss_mb": w["peak_jvm_rss_mb"],
                "jvm_heap_peak_mb": w["peak_jvm_heap_peak_mb"],
                "python_driver_rss_mb": w["peak_python_driver_rss_mb"],
            }
            for w in out
        ],
    }


def large_window(bench: Bench, settings, partitions: int, minutes: int, day: date) -> dict:
    """One window: generated, then each daily step with its rows in (the layer it reads:
    landing records, bronze, silver, gold), rows out (what it wrote, per table) and memory."""
    from brokerlens.pipeline import DAILY_STEPS

    from .large_files import write_large_day

    log.info("large day: %s partitions, first %s minutes: generating", partitions, minutes)
    started = time.perf_counter()
    landing = write_large_day(settings.landing, day, partitions, minutes)
    entry = {
        "minutes": minutes,
        "generate_seconds": round(time.perf_counter() - started, 2),
        "landing": landing,
        "landing_mb": round(sum(k["bytes"] for k in landing.values()) / 2**20, 1),
        "stages": {},
    }
    # Land's floor on the same files: what Spark's own JSON reader does per core here.
    with warm_floor(bench.spark, settings.landing / day.isoformat(), settings.home / "out-floor") as floor_run:
        floor = bench.measure(floor_run)
    floor["mb_per_second_per_core"] = round(entry["landing_mb"] / floor["seconds"] / bench.cores, 2)
    entry["floor"] = floor
    rows_in = sum(k["records"] for k in landing.values())
    for stage, layer in DAILY_STEPS:
        step, result, measured = daily_step(bench, stage, layer, day, settings, rows=rows_in)
        log.info("large day, first %s minutes: %s in %ss", minutes, step, measured["seconds"])
        tables = {w.table: w.rows for w in result.writes}
        rows_out = sum(max(rows, 0) for rows in tables.values())
        measured.update(rows_in=measured.pop("rows"), rows_out=rows_out, tables=tables)
        if stage == "land":
            measured["input_mb"] = entry["landing_mb"]
            measured["mb_per_second_per_core"] = round(entry["landing_mb"] / measured["seconds"] / bench.cores, 2)
            entry["land/floor"] = ratio(measured, floor)
            entry["quarantined"] = result.metrics.get("quarantined", 0)
            entry["metrics_samples_not_landed"] = result.metrics.get("metrics_samples_not_landed", 0)
        if stage in ("land", "build"):
            rows_in = rows_out
        entry["stages"][step] = measured
    entry["total_seconds"] = round(sum(s["seconds"] for s in entry["stages"].values()), 2)
    for key in ("jvm_rss_mb", "jvm_heap_peak_mb", "python_driver_rss_mb"):
        entry[f"peak_{key}"] = max(s[key] for s in entry["stages"].values())
    log.info("large day, first %s minutes: %s MB landed and built in %ss", minutes, entry["landing_mb"], entry["total_seconds"])
    return entry


def project_day(windows: list[dict], partitions: int, cores: int, day_minutes: int) -> dict:
    """The whole day from the measured windows (all steps' seconds together). From two windows,
    the seconds split into a part per minute of data (the difference of the two largest, at
    least 0), scaled to the day's minutes and partitions and divided among the cores, and a
    fixed part (process warm-up, planning, Delta commits) kept as it is. From one window, all of
    it is scaled: an upper bound, since the fixed part is scaled too."""
    ordered = sorted(windows, key=lambda w: w["minutes"])
    last = ordered[-1]

    def seconds(window: dict) -> float:
        return sum(s["seconds"] for s in window["stages"].values())

    if len(ordered) > 1:
        before = ordered[-2]
        per_minute = max(0.0, (seconds(last) - seconds(before)) / (last["minutes"] - before["minutes"]))
        basis = f"the difference of the first {before['minutes']} and {last['minutes']} minutes"
    else:
        per_minute = seconds(last) / last["minutes"]
        basis = f"the first {last['minutes']} minutes, fixed costs scaled too (an upper bound)"
    fixed = max(0.0, seconds(last) - per_minute * last["minutes"])
    mb_per_minute = last["landing_mb"] / last["minutes"]

    def day(p: int, c: int) -> dict:
        data = day_minutes * p / partitions
        return {
            "partitions": p,
            "cores": c,
            "landing_gb": round(mb_per_minute * data / 1024, 1),
            "hours": round((fixed + per_minute * data * cores / c) / 3600, 2),
        }

    return {
        "basis": basis,
        "fixed_seconds": round(fixed, 1),
        "seconds_per_minute_of_data": round(per_minute, 2),
        "days": [day(partitions, cores), *(day(p, c) for p, c in PROJECTED)],
    }
