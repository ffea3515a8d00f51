"""The results as the Markdown of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from .interceptor import markdown_lines as interceptor_lines
from .run import failed_sections


def markdown(results: dict) -> str:
    """The figures' tables for a results file (no dispatch table when no size ran: ``--sizes ''``)."""
    lines = (
        []
        if not results["sizes"]
        else [
            "| records | plain pass s | dispatch_periods s | DuckDB s | vs plain | vs DuckDB | no write: plain, dispatch s | dispatch rows/s/core | JVM RSS MB | JVM old gen MB | Python workers MB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    )
    for size in results["sizes"]:
        st = size["stages"]
        d = st["dispatch_periods"]
        lines.append(
            f"| {size['input_rows']:,} | {st['plain_pass']['seconds']} | {d['seconds']} | {st['duckdb']['seconds']} | "
            f"{size['ratios']['dispatch_periods/plain_pass']}× | {size['ratios']['dispatch_periods/duckdb']}× | "
            f"{st['plain_pass[no write]']['seconds']}, {st['dispatch_periods[no write]']['seconds']} | "
            f"{d['rows_per_second_per_core']:,} | {d['jvm_rss_mb']:.0f} | {d['jvm_old_gen_peak_mb']:.0f} | {d['python_workers_rss_mb']:.0f} |"
        )
    if results["sizes"]:
        rounds = len(results["sizes"][0]["stages"]["plain_pass"]["runs_seconds"])
        lines += [
            "",
            f"The plain pass, dispatch_periods and DuckDB: the median of {rounds} runs each, alternated "
            "(every run's seconds in the results file's `runs_seconds`); the pair without the write ran once.",
        ]
    if isinstance(results.get("days"), dict) and "days" in results["days"]:
        days = results["days"]
        lines += [
            "",
            f"Consecutive days through the table layer ({days['days'][0]['rows']:,} records a day): "
            + ", ".join(f"{d['day']} {d['seconds']} s" for d in days["days"])
            + f" (last / first {days['last_over_first']}×).",
        ]
    for entry in results.get("landing", []) if isinstance(results.get("landing"), list) else []:
        lines.append(
            f"Landing at demo scale {entry['scale']:g} ({entry['landing_files_mb']} MB of landing files): {entry['seconds']} s, "
            f"{entry['rows']:,} bronze rows; the median of {len(entry['runs_seconds'])} runs alternated with its floor's "
            f"({entry['floor']['seconds']} s), after a first run of each (land's, the first in its JVM: {entry['first_run_seconds']} s)."
        )
    demo = results.get("demo_day")
    if isinstance(demo, dict) and "stages" in demo:
        lines.append(
            f"Demo day (scale {demo['scale']:g}) through every stage in one process: "
            + ", ".join(f"{stage} {entry['seconds']} s" for stage, entry in demo["stages"].items())
            + f" (total {demo['total_seconds']} s)."
        )
    for section in ("dag", "dag_spark_submit"):
        dag = results.get(section)
        if isinstance(dag, dict) and "tasks" in dag:
            server = f"; its server started, warm-up included, in {dag['server_start_seconds']} s before it" if "server_start_seconds" in dag else ""
            lines.append(
                f"Demo day through the daily DAG (`airflow dags test`, the tasks on {dag.get('tasks_run_on', 'a spark-submit each')}): "
                f"{dag['dag_seconds']} s ({dag['wall_seconds']} s with the demo data and Airflow's database{server}). "
                "Per task, wall s (fixed cost: start to first Spark job, of which before its SparkContext): "
                + ", ".join(
                    f"{task} {t['seconds']}" + (f" ({t['fixed_seconds']}, {t['to_spark_context_seconds']})" if "fixed_seconds" in t else "")
                    for task, t in dag["tasks"].items()
                )
                + "."
            )
    versus = results.get("dag_vs_stage_server")
    if isinstance(versus, dict) and "runs" in versus:
        lines.append(
            f"The same DAG alternated with that of the last commit whose tasks ran on brokerlens' stage server ({versus['stage_server_commit'][:7]}: "
            "its DAG, stack and code, from a git worktree), in this order: "
            + ", ".join(f"{'Spark Connect' if r['tasks_on'] == 'connect' else 'stage server'} {r['dag_seconds']} s" for r in versus["runs"])
            + f"; medians {versus['median_dag_seconds']['connect']} s (Spark Connect) and {versus['median_dag_seconds']['stage_server']} s "
            f"(stage server), {versus['connect/stage_server']}×."
        )
    versus = results.get("dispatch_vs_stage_server")
    if isinstance(versus, dict) and "runs" in versus:
        then = versus["stage_server_commit"][:7]
        side = {"today": "today", "stage_server": then}
        lines.append(
            f"dispatch_periods at {versus['input_rows']:,} records alternated with {then}'s (its own bench's sizes section, "
            "from a git worktree; each run its own process, one run of each stage), dispatch_periods s in this order: "
            + ", ".join(f"{side[r['side']]} {r['dispatch_periods_seconds']}" for r in versus["runs"])
            + "; medians "
            + ", ".join(
                f"{side[s]} {m['dispatch_periods_seconds']} s ({m['dispatch_periods/plain_pass']}× plain, {m['dispatch_periods/duckdb']}× DuckDB)"
                for s, m in versus["medians"].items()
            )
            + f"; today / {then} {versus['today/stage_server']}×."
        )
    large = results.get("large_day")
    if isinstance(large, dict) and "windows" in large:
        lines += ["", *large_day_markdown(large)]
    section = results.get("interceptor")
    if isinstance(section, dict) and "runs" in section:
        lines += ["", *interceptor_lines(section)]
    for name, error in failed_sections(results).items():
        lines.append(f"The {name} section failed: {error}.")
    if results.get("targets"):
        lines += ["", "| target | measured |", "|---|---:|"]
        lines += [f"| {name} | {value} |" for name, value in results["targets"].items()]
    return "\n".join(lines)


def large_day_markdown(large: dict) -> list[str]:
    """The large day's stages at its largest window, a line per window, the projection."""
    window = max(large["windows"], key=lambda w: w["minutes"])
    lines = [
        f"Large day, {large['partitions']:,} partitions x 3 subscriptions, the first {window['minutes']} minutes ({window['landing_mb']} MB of landing files):",
        "",
        "| stage | rows in | rows out | s | rows/s/core | MB/s/core | JVM RSS MB | heap MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for step, s in window["stages"].items():
        lines.append(
            f"| {step} | {s['rows_in']:,} | {s['rows_out']:,} | {s['seconds']} | {s['rows_per_second_per_core']:,} | "
            f"{s.get('mb_per_second_per_core', '')} | {s['jvm_rss_mb']:.0f} | {s['jvm_heap_peak_mb']:.0f} |"
        )
    lines.append("")
    for w in large["windows"]:
        lines.append(
            f"First {w['minutes']} minutes: {w['landing_mb']} MB generated in {w['generate_seconds']} s, "
            f"{w['stages']['land']['rows_out']:,} bronze rows, {w['total_seconds']} s through the daily steps, "
            f"peak JVM RSS {w['peak_jvm_rss_mb']:.0f} MB, heap {w['peak_jvm_heap_peak_mb']:.0f} MB."
        )
    lines.append(
        f"Projected from {large['projection']['basis']} ({large['projection']['fixed_seconds']} s fixed, "
        f"{large['projection']['seconds_per_minute_of_data']} s per minute of data, divided among the cores): "
        + ", ".join(f"{d['partitions']:,} partitions on {d['cores']} cores {d['hours']} h ({d['landing_gb']} GB)" for d in large["projection"]["days"])
        + "."
    )
    return lines


# docs/benchmarks.md is prose around the figures of the committed results file: `--page` rewrites
# what lies between these two lines, and a test checks it against infra/bench/latest.json.
FIGURES_START = "<!-- figures: written by `python -m brokerlens_bench --page` from the results file; do not edit -->"
FIGURES_END = "<!-- end of figures -->"


def figures(results: dict) -> str:
    """The page's generated part: the machine, the command and its duration, the tables."""
    env = results["environment"]
    return (
        f"{env['cores']} cores, {env['cpu']}, {env['memory_gb']} GB, Spark {env['pyspark']} `{env['spark_master']}` "
        f"with a {env['spark_driver_memory']} driver, DuckDB {env['duckdb']}; produced by `{results['command']}` "
        f"({round(results['total_seconds'] / 60)} minutes):\n\n{markdown(results)}"
    )


def write_page(page: Path, results: dict) -> None:
    text = page.read_text(encoding="utf-8")
    head, start, rest = text.partition(FIGURES_START + "\n")
    _, end, tail = rest.partition(FIGURES_END)
    if not start or not end:
        raise ValueError(f"{page} has no figures section ({FIGURES_START} ... {FIGURES_END})")
    page.write_text(f"{head}{start}\n{figures(results)}\n\n{end}{tail}", encoding="utf-8")
