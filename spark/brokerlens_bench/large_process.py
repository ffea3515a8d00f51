"""The large day's own process (``large.large_day_in_own_process``): a module of its own, which
the package does not import, so that ``python -m`` runs it."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from datetime import date
from pathlib import Path

from .harness import Bench
from .large import bench_large_day, large_window

log = logging.getLogger("brokerlens.bench")


def main(argv: list[str] | None = None) -> None:
    """``python -m brokerlens_bench.large_process``: ``bench_large_day`` in this process after its
    smallest window once, its figures written to ``--out`` (``large_day_in_own_process`` runs it)."""
    from brokerlens.platform import logs
    from brokerlens.platform.jvm import default_parallelism
    from brokerlens.platform.spark import get_spark
    from brokerlens.settings import Settings, get_settings

    parser = argparse.ArgumentParser(prog="python -m brokerlens_bench.large_process", description=main.__doc__)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--minutes", required=True, help="windows, comma-separated")
    parser.add_argument("--day", type=date.fromisoformat, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logs.configure(0)
    spark = get_spark(get_settings())
    bench = Bench(spark, default_parallelism(spark))
    try:
        windows = tuple(int(m) for m in args.minutes.split(","))
        warm_up = args.work / "large-home-warm-up"
        log.info("large day: the first %s minutes once to warm the JVM up, not measured", min(windows))
        large_window(bench, Settings(home=warm_up), args.partitions, min(windows), args.day)
        shutil.rmtree(warm_up, ignore_errors=True)
        args.out.write_text(json.dumps(bench_large_day(bench, args.work, args.partitions, windows, args.day), indent=1) + "\n")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
