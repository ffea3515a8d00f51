"""The last commit whose daily DAG ran its tasks on brokerlens' own stage server, checked out
beside this one, so that one bench run compares the two: its DAG (``dag.py``) and its
``dispatch_periods`` (``DispatchScan.java`` compiled by ``javac`` at run time, against Spark's
internals), each run alternated with today's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[2]

# `brokerlens serve` was replaced by Spark Connect in 0ada88f; the figures issue 34 asks not to
# get worse were measured on this commit.
STAGE_SERVER_COMMIT = "fd86abf8ec35a296df96c7923d8cc46b3b233335"


@contextmanager
def stage_server_checkout(work: Path) -> Iterator[Path]:
    """``STAGE_SERVER_COMMIT`` in a git worktree of this checkout, with this checkout's virtualenv
    (the commit's own ``infra/stack.sh`` puts ``<tree>/.venv/bin`` first on its PATH)."""
    tree = work / "stage-server-tree"
    git = ["git", "-C", str(REPO)]
    if subprocess.run([*git, "cat-file", "-e", f"{STAGE_SERVER_COMMIT}^{{commit}}"], capture_output=True).returncode != 0:
        raise RuntimeError(f"this checkout has no commit {STAGE_SERVER_COMMIT[:7]} (a shallow clone? `git fetch --unshallow`)")
    subprocess.run([*git, "worktree", "add", "--force", "--detach", str(tree), STAGE_SERVER_COMMIT], check=True, capture_output=True)
    try:
        (tree / ".venv").symlink_to(REPO / ".venv")
        yield tree
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=True, capture_output=True)


def alternated(today: str, rounds: int) -> list[str]:
    """``rounds`` runs each of ``today`` and ``"stage_server"``, in the order today, stage server,
    stage server, today, ...: neither side has every first run of the machine's state."""
    return [(today, "stage_server")[(i + 1) // 2 % 2] for i in range(2 * rounds)]


def medians(runs: list[dict], key: str, by: str, sides: tuple[str, str]) -> dict[str, float]:
    """The median of ``key`` over the runs of each side (``run[by]``)."""
    return {side: round(median(r[key] for r in runs if r[by] == side), 2) for side in sides}


DISPATCH_STAGES = ("plain_pass", "dispatch_periods", "duckdb")
DISPATCH_RATIOS = ("dispatch_periods/plain_pass", "dispatch_periods/duckdb")


def dispatch_sizes_run(tree: Path, work: Path, partitions: int) -> dict:
    """``tree``'s own ``python -m brokerlens_bench --only sizes`` at one size, one run of each
    stage (as ``STAGE_SERVER_COMMIT``'s bench ran them), in a process of its own: its seconds and
    ratios."""
    out = work / "sizes-run.json"
    command = ["-m", "brokerlens_bench", "--only", "sizes", "--sizes", str(partitions), "--variant-sizes", "", "--out", str(out)]
    if tree == REPO:  # options the stage server's bench has not: one run of each stage, as it ran them
        command += ["--rounds", "1", "--dispatch-rounds", "0"]
    env = {**os.environ, "PYTHONPATH": str(tree / "spark"), "BROKERLENS_HOME": str(work / "sizes-home")}
    proc = subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(command)} in {tree} exited {proc.returncode}: " + " | ".join(proc.stderr.splitlines()[-5:]))
    [size] = json.loads(out.read_text())["sizes"]
    return {
        "input_rows": size["input_rows"],
        **{f"{stage}_seconds": size["stages"][stage]["seconds"] for stage in DISPATCH_STAGES},
        **{name: size["ratios"][name] for name in DISPATCH_RATIOS},
    }


def bench_dispatch_against_stage_server(work: Path, partitions: int, rounds: int, sizes_run: Callable[[Path, Path, int], dict] = dispatch_sizes_run) -> dict:
    """``dispatch_periods`` with the plain pass and DuckDB beside it, this checkout's and
    ``STAGE_SERVER_COMMIT``'s, each ``rounds`` times in its own process, alternated: the medians
    of each side's seconds and ratios, and today's dispatch seconds over the stage server's."""
    runs = []
    for side in alternated("today", rounds):
        if side == "today":
            runs.append({"side": side, **sizes_run(REPO, work, partitions)})
        else:
            with stage_server_checkout(work) as tree:
                runs.append({"side": side, **sizes_run(tree, work, partitions)})
    sides = ("today", "stage_server")
    keys = [f"{stage}_seconds" for stage in DISPATCH_STAGES] + list(DISPATCH_RATIOS)
    by_key = {key: medians(runs, key, "side", sides) for key in keys}
    return {
        "stage_server_commit": STAGE_SERVER_COMMIT,
        "partitions": partitions,
        "input_rows": runs[0]["input_rows"],
        "runs": runs,
        "medians": {side: {key: by_key[key][side] for key in keys} for side in sides},
        "today/stage_server": round(by_key["dispatch_periods_seconds"]["today"] / by_key["dispatch_periods_seconds"]["stage_server"], 2),
    }
