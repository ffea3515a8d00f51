"""``python -m brokerlens_bench``: ``make bench``'s command line."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import brokerlens_bench

from .generate import DEFAULT_SIZES
from .large import LARGE_MINUTES, LARGE_PARTITIONS
from .markdown import markdown, write_page
from .run import failed_sections, run


def main(argv: list[str] | None = None) -> int:
    from brokerlens.platform import logs

    parser = argparse.ArgumentParser(prog="python -m brokerlens_bench", description=brokerlens_bench.__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="results file (default $BROKERLENS_HOME/bench/results.json)")
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="topic partitions per size, comma-separated (scopes = 4 x partitions + brokers)"
    )
    parser.add_argument("--days-partitions", type=int, default=DEFAULT_SIZES[1], help="size of the 3 consecutive days built through the table layer (0: skip)")
    parser.add_argument("--land-scales", default="1,10", help="demo-data scales for the landing stage, with its floor ('' to skip)")
    parser.add_argument(
        "--variant-sizes", default=str(DEFAULT_SIZES[1]), help="sizes (partitions) at which the dispatch_periods setting variants also run ('' to skip)"
    )
    parser.add_argument("--demo-day-scale", type=float, default=1.0, help="demo-data scale of the day run through every stage (0: skip)")
    parser.add_argument(
        "--no-dag",
        dest="dag",
        action="store_false",
        help="skip the demo day through the daily DAG (infra/stack.sh run-day, on the stage server and with a spark-submit per task)",
    )
    parser.add_argument(
        "--large-partitions", type=int, default=LARGE_PARTITIONS, help="topic partitions of the large day (x 3 subscriptions, 10 brokers; 0: skip)"
    )
    parser.add_argument(
        "--large-minutes",
        default=",".join(map(str, LARGE_MINUTES)),
        help="windows of the large day from 00:00, minutes, comma-separated; each is landed and built",
    )
    parser.add_argument("--latest", type=Path, default=None, help="also copy the results here (e.g. infra/bench/latest.json)")
    parser.add_argument("--page", type=Path, default=None, help="rewrite the figures of this page from the results (docs/benchmarks.md)")
    args = parser.parse_args(argv)
    logs.configure(0)
    from brokerlens.platform.settings import get_settings

    out = args.out or get_settings().home.resolve() / "bench" / "results.json"
    results = run(
        out,
        sizes=tuple(int(s) for s in args.sizes.split(",") if s),
        days_partitions=args.days_partitions or None,
        variant_sizes=tuple(int(s) for s in args.variant_sizes.split(",") if s),
        land_scales=tuple(float(s) for s in args.land_scales.split(",") if s),
        demo_day_scale=args.demo_day_scale or None,
        dag=args.dag,
        large_partitions=args.large_partitions or None,
        large_minutes=tuple(int(m) for m in args.large_minutes.split(",") if m),
        command=" ".join(["python -m brokerlens_bench", *(argv if argv is not None else sys.argv[1:])]),
    )
    if args.latest:
        args.latest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, args.latest)
    if args.page:
        write_page(args.page, results)
    print(markdown(results))
    print(f"results: {out}")
    return 1 if failed_sections(results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
