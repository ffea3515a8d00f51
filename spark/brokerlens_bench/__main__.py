"""``python -m brokerlens_bench``: ``make bench``'s command line."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import brokerlens_bench

from .generate import DEFAULT_SIZES
from .interceptor import ROUNDS, SECONDS, WARMUP_SECONDS
from .large import LARGE_MINUTES, LARGE_PARTITIONS
from .markdown import markdown, write_page
from .run import failed_sections, run

# --only: what each section's option is set to when the section is not selected.
SECTIONS = ("sizes", "days", "landing", "demo_day", "large_day", "dag", "dispatch_vs_stage_server", "interceptor")
SKIPPED = {
    "sizes": {"sizes": "", "variant_sizes": ""},
    "days": {"days_partitions": 0},
    "landing": {"land_scales": ""},
    "demo_day": {"demo_day_scale": 0},
    "large_day": {"large_partitions": 0},
    "dag": {"dag": False},
    "dispatch_vs_stage_server": {"dispatch_rounds": 0},
    "interceptor": {"interceptor_rounds": 0},
}
EPILOG = """examples:
  python -m brokerlens_bench                                   every section (make bench)
  python -m brokerlens_bench --only interceptor                the interceptor's overhead alone (under 10 minutes)
  python -m brokerlens_bench --only interceptor --interceptor-rounds 1 --interceptor-seconds 3 --interceptor-warmup 2
                                                               the same as a smoke (2 brokers, about 2 minutes)"""


def main(argv: list[str] | None = None) -> int:
    from brokerlens.platform import logs

    parser = argparse.ArgumentParser(
        prog="python -m brokerlens_bench",
        description=brokerlens_bench.__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=None, help="results file (default $BROKERLENS_HOME/bench/results.json)")
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="topic partitions per size, comma-separated (scopes = 4 x partitions + brokers)"
    )
    parser.add_argument("--days-partitions", type=int, default=DEFAULT_SIZES[1], help="size of the 3 consecutive days built through the table layer (0: skip)")
    parser.add_argument("--land-scales", default="1,10", help="demo-data scales for the landing stage, with its floor ('' to skip)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of the plain pass, dispatch_periods and DuckDB per size, and of land and its floor per demo scale, alternated; the median is reported",
    )
    parser.add_argument(
        "--variant-sizes", default=str(DEFAULT_SIZES[1]), help="sizes (partitions) at which the dispatch_periods setting variants also run ('' to skip)"
    )
    parser.add_argument("--demo-day-scale", type=float, default=1.0, help="demo-data scale of the day run through every stage (0: skip)")
    parser.add_argument(
        "--no-dag",
        dest="dag",
        action="store_false",
        help="skip the demo day through the daily DAG (infra/stack.sh run-day, its tasks Spark Connect clients and with a spark-submit per task)",
    )
    parser.add_argument(
        "--dag-rounds",
        type=int,
        default=2,
        help="runs each of the DAG on Spark Connect and on the stage server of its last commit (from a git worktree), alternated (0: skip)",
    )
    parser.add_argument(
        "--dispatch-rounds",
        type=int,
        default=2,
        help="runs each of dispatch_periods at the largest of --sizes, this checkout's and the stage server's last commit's "
        "(from a git worktree), each its own process, alternated (0: skip)",
    )
    parser.add_argument(
        "--large-partitions", type=int, default=LARGE_PARTITIONS, help="topic partitions of the large day (x 3 subscriptions, 10 brokers; 0: skip)"
    )
    parser.add_argument(
        "--large-minutes",
        default=",".join(map(str, LARGE_MINUTES)),
        help="windows of the large day from 00:00, minutes, comma-separated; each is landed and built",
    )
    parser.add_argument(
        "--interceptor-rounds",
        type=int,
        default=ROUNDS,
        help="rounds of the interceptor section, each a Pulsar 4.0.7 standalone without then one with brokerlens' interceptor (0: skip)",
    )
    parser.add_argument("--interceptor-seconds", type=float, default=SECONDS, help="measured seconds of traffic per broker in the interceptor section")
    parser.add_argument("--interceptor-warmup", type=float, default=WARMUP_SECONDS, help="seconds of traffic before the measured window")
    parser.add_argument(
        "--only",
        default=None,
        help=f"run only these sections, comma-separated ({', '.join(SECTIONS)}); their options still apply, the others are skipped",
    )
    parser.add_argument("--latest", type=Path, default=None, help="also copy the results here (e.g. infra/bench/latest.json)")
    parser.add_argument("--page", type=Path, default=None, help="rewrite the figures of this page from the results (docs/benchmarks.md)")
    args = parser.parse_args(argv)
    if args.only is not None:
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        if unknown := only - set(SECTIONS):
            parser.error(f"--only: unknown sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        for section in set(SECTIONS) - only:
            for name, value in SKIPPED[section].items():
                setattr(args, name, value)
    logs.configure(0)
    from brokerlens.settings import get_settings

    out = args.out or get_settings().home.resolve() / "bench" / "results.json"
    results = run(
        out,
        sizes=tuple(int(s) for s in args.sizes.split(",") if s),
        days_partitions=args.days_partitions or None,
        variant_sizes=tuple(int(s) for s in args.variant_sizes.split(",") if s),
        rounds=args.rounds,
        land_scales=tuple(float(s) for s in args.land_scales.split(",") if s),
        demo_day_scale=args.demo_day_scale or None,
        dag=args.dag,
        dag_rounds=args.dag_rounds,
        dispatch_rounds=args.dispatch_rounds,
        large_partitions=args.large_partitions or None,
        large_minutes=tuple(int(m) for m in args.large_minutes.split(",") if m),
        interceptor_rounds=args.interceptor_rounds,
        interceptor_seconds=args.interceptor_seconds,
        interceptor_warmup=args.interceptor_warmup,
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
