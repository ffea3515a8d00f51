"""The command line: the contract that tests, Airflow and users share.

Imports of the stages are inside the commands so that ``--help`` is instant and a command
starts Spark only when it needs it.
"""

from __future__ import annotations

import sys
import traceback
from datetime import date, datetime
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

from brokerlens.platform import logs, redact

if TYPE_CHECKING:  # the command line starts before pyspark is imported, and many commands never import it
    from pyspark.sql import SparkSession

    from brokerlens.settings import Settings

app = typer.Typer(
    help="brokerlens: batch analytics over Apache Pulsar broker telemetry.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Exit codes: 1 a stage failed on its data; 2 the user's mistake (bad query, table, setting,
# path); 3 anything unexpected (worth a retry, with the stack trace in the log file).
USER_ERROR_EXIT = 2
UNEXPECTED_EXIT = 3
# Set by main(): a command started from a shell keeps Java's stderr and traces in the log file.
_log_to_file = False
_log_path = None
_verbose = False

DayOption = Annotated[datetime, typer.Option("--date", "-d", formats=["%Y-%m-%d"], help="Day to process (UTC), YYYY-MM-DD.")]


class ValidateLayer(str, Enum):
    bronze = "bronze"
    silver = "silver"


class BuildLayer(str, Enum):
    silver = "silver"
    gold = "gold"


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


@app.callback()
def _main(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More logging (stderr).")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
) -> None:
    global _log_path, _verbose
    _verbose = verbose > 0
    if _log_to_file and not verbose and _log_path is None:
        _log_path = logs.divert_stderr(" ".join(sys.argv[1:2]))
    logs.configure(-1 if quiet else verbose)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _day(value: datetime) -> date:
    return value.date()


def _spark(settings: Settings) -> SparkSession:
    """This command's session: it is given to the stages and tables that run on Spark."""
    from brokerlens.platform.spark import get_spark

    return get_spark(settings)


def _run_stage(name: str, day: date, **kwargs) -> None:
    from brokerlens.pipeline import ON_SPARK, run_stage
    from brokerlens.platform.stage import StageFailed
    from brokerlens.settings import get_settings

    settings = get_settings()
    try:
        result = run_stage(name, day, settings, _spark(settings) if name in ON_SPARK else None, **kwargs)
    except StageFailed as exc:
        _fail(f"{name} {day.isoformat()} failed:\n{exc}", code=1)
    typer.echo(result.render())


@app.command("demo-data")
def demo_data(
    day: DayOption,
    scale: Annotated[float, typer.Option(help="Size factor: 1 is a small cluster (a few MB).")] = 1.0,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same files.")] = 7,
) -> None:
    """Write a synthetic but realistic day of landing files in Pulsar's formats."""
    _run_stage("demo-data", _day(day), scale=scale, seed=seed)


@app.command()
def collect(
    admin_url: Annotated[str | None, typer.Option(help="Pulsar admin REST URL, e.g. http://broker:8080 (default: settings admin_url).")] = None,
    prometheus_url: Annotated[str | None, typer.Option(help="Prometheus server URL: pull DATE's Pulsar series (query_range) instead of the admin API.")] = None,
    day: Annotated[datetime | None, typer.Option("--date", "-d", formats=["%Y-%m-%d"], help="With --prometheus-url: the UTC day to pull, YYYY-MM-DD.")] = None,
    step: Annotated[int, typer.Option(help="With --prometheus-url: query step in seconds, the scrape interval.")] = 60,
) -> None:
    """Snapshot a live cluster's admin REST API into landing, or pull a day from Prometheus."""
    from brokerlens.pipeline import run_stage
    from brokerlens.platform.stage import StageFailed
    from brokerlens.settings import get_settings

    try:
        if prometheus_url:
            result = run_stage("collect", _day(day) if day else None, get_settings(), prometheus_url=prometheus_url, step_seconds=step)
        else:
            result = run_stage("collect", None, get_settings(), admin_url=admin_url)
        typer.echo(result.render())
    except StageFailed as exc:
        _fail(f"collect failed: {exc}", code=1)


@app.command()
def land(day: DayOption) -> None:
    """Landing files of DAY → bronze tables (+ quarantine)."""
    _run_stage("land", _day(day))


@app.command()
def validate(
    day: DayOption,
    layer: Annotated[ValidateLayer | None, typer.Option(help="Only this layer's suites (default: bronze and silver).")] = None,
) -> None:
    """Run the Great Expectations suites on DAY's partitions; non-zero exit on a critical failure."""
    _run_stage("validate", _day(day), layer=layer and layer.value)


@app.command()
def build(
    day: DayOption,
    layer: Annotated[BuildLayer | None, typer.Option(help="Only this layer (default: silver, then gold).")] = None,
) -> None:
    """Silver and gold tables for DAY."""
    _run_stage("build", _day(day), layer=layer and layer.value)


@app.command()
def alert(
    day: DayOption,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be sent; send and record nothing.")] = False,
) -> None:
    """Evaluate hole-risk alerts for DAY and send the emails."""
    _run_stage("alert", _day(day), dry_run=dry_run)


@app.command()
def report(day: DayOption) -> None:
    """Write the self-contained HTML report for DAY."""
    _run_stage("report", _day(day))


@app.command()
def run(day: DayOption) -> None:
    """land → validate bronze → build silver → validate silver → build gold → alert → report for
    DAY (what the daily DAG does)."""
    from brokerlens.pipeline import DAILY_STEPS

    for name, layer in DAILY_STEPS:
        _run_stage(name, _day(day), **({"layer": layer} if layer else {}))


@app.command()
def sql(
    query: Annotated[
        str | None, typer.Argument(help="A Spark SQL query over the tables by name; without one, read queries ended by ; from stdin (\\q quits).")
    ] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
) -> None:
    """Ad-hoc Spark SQL over every table by name (stdout holds only the result)."""
    from brokerlens.deliver.query import QueryError, format_rows, run_sql
    from brokerlens.settings import get_settings

    settings = get_settings()
    if query is None:
        from brokerlens.deliver.repl import repl

        raise typer.Exit(repl(_spark(settings), settings, fmt.value))
    try:
        columns, rows = run_sql(_spark(settings), query, settings)
    except QueryError as exc:
        _keep_trace(always=False)
        _fail(str(exc))
    sys.stdout.write(format_rows(columns, rows, fmt.value) + "\n")


@app.command()
def tables(
    names: Annotated[list[str] | None, typer.Argument(help="Only these tables (default: all).")] = None,
) -> None:
    """List the tables with their columns and latest version."""
    from brokerlens.platform.schemas import table_schema
    from brokerlens.platform.table_admin import describe_tables
    from brokerlens.settings import get_settings

    for name in names or []:
        table_schema(name)  # an unknown name fails with the list of known tables
    settings = get_settings()
    for info in describe_tables(_spark(settings), settings, names or ()):
        version = "not written yet" if info.version is None else f"version {info.version}"
        typer.echo(f"{info.name}  [{info.layer}, {version}]  {info.description}")
        for name, type_, description in info.columns:
            typer.echo(f"    {name:<34} {type_:<22} {description}")


@app.command()
def docs(
    check: Annotated[bool, typer.Option("--check", help="Only check that docs/tables.md is up to date (exit 1 if not).")] = False,
) -> None:
    """Regenerate docs/tables.md, the reference of every table and column, from schemas/."""
    from brokerlens.platform.reference import docs_path, tables_markdown, write_docs

    if check:
        path = docs_path()
        if not path.is_file() or path.read_text(encoding="utf-8") != tables_markdown():
            _fail(f"{path} is out of date with schemas/tables/: run `brokerlens docs`", code=1)
        typer.echo(f"{path} is up to date")
        return
    path, changed = write_docs()
    typer.echo(f"{path} {'written' if changed else 'unchanged'}")


@app.command("connect-server")
def connect_server(
    port: Annotated[int | None, typer.Option(help="Port (default: settings spark.connect_port, 15002).")] = None,
) -> None:
    """Run a Spark Connect server with brokerlens' JARs and settings in the foreground (its pid
    is this command's); stages reach it with BROKERLENS_SPARK__REMOTE=sc://host:port."""
    from brokerlens.platform.connect_server import exec_server
    from brokerlens.settings import get_settings

    exec_server(get_settings(), port)


@app.command("warm-up")
def warm_up() -> None:
    """Run the daily stages once on a small generated day in a scratch folder, so that the first
    real day runs on a warm JVM (after `brokerlens connect-server`, with spark.remote set)."""
    from brokerlens.pipeline import warm_up as warm_up_stages
    from brokerlens.settings import get_settings

    settings = get_settings()
    typer.echo(f"warmed up in {warm_up_stages(_spark(settings), settings):.1f} s")


@app.command("vacuum")
def vacuum_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted.")] = False,
) -> None:
    """Delta's VACUUM on every table: delete files no version within the table's retention
    (delta.deletedFileRetentionDuration, 7 days) references, and orphans of killed writes."""
    from brokerlens.platform.schemas import table_schemas
    from brokerlens.platform.table_admin import vacuum
    from brokerlens.settings import get_settings

    settings = get_settings()
    spark = _spark(settings)
    for name in sorted(table_schemas()):
        removed = vacuum(spark, name, settings, dry_run=dry_run)
        if removed:
            typer.echo(f"{name}: {'would delete' if dry_run else 'deleted'} {len(removed)} files")


def _user_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """(brokerlens's errors, whose message is written for the user; other mistakes of the user:
    an invalid setting, a missing or unwritable path)."""
    from pydantic import ValidationError

    from brokerlens.deliver.query import QueryError
    from brokerlens.platform.schemas import SchemaError
    from brokerlens.platform.tables import TableError

    return (TableError, SchemaError, QueryError), (ValidationError, FileNotFoundError, NotADirectoryError, PermissionError)


def _keep_trace(always: bool) -> None:
    """The current exception's stack trace to the log file, or to stderr with --verbose; if
    ``always``, also where stderr is the log (under spark-submit)."""
    if always or _log_path or _verbose:
        logs.to_log_file(traceback.format_exc())


def _one_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message; for an error raised in Spark's
    JVM, the Java exception's own (e.g. ``ParentNotDirectoryException: Parent path is not a
    directory: ...``) rather than Py4J's wrapper around it."""
    java = getattr(exc, "java_exception", None)
    try:
        text = str(java.toString()) if java is not None else str(exc)
    except Exception:  # the JVM is gone: Py4J's own message will do
        text = str(exc)
    first = next((line.strip() for line in text.strip().splitlines() if line.strip()), "")
    if java is not None:  # "org.apache.hadoop.fs.ParentNotDirectoryException: ..." without the package
        name, colon, message = first.partition(":")
        return name.rpartition(".")[2] + colon + message
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def main(log_to_file: bool = True, argv: list[str] | None = None) -> None:
    """The ``brokerlens`` command. Errors end in one ``error:`` line on stderr (the last line of
    an Airflow task's log). The stack trace of an unexpected error goes to the log file, or to
    stderr with --verbose and under spark-submit (``log_to_file=False``, stderr is the task log);
    a user's mistake needs none there. ``argv``: the arguments, if not the process's (the stage
    bench runs it in its own process)."""
    global _log_to_file
    _log_to_file = log_to_file
    redact.install()  # no secret in any line this command prints or logs
    try:
        app(args=argv, prog_name="brokerlens")
    except Exception as exc:  # SystemExit passes: the commands' own exit codes stand
        ours, theirs = _user_errors()
        user_error = isinstance(exc, ours + theirs)
        _keep_trace(always=not user_error)
        if user_error:
            typer.echo(f"error: {exc if isinstance(exc, ours) else _one_line(exc)}", err=True)
            sys.exit(USER_ERROR_EXIT)
        where = f" (stack trace in {_log_path})" if _log_path else ""
        typer.echo(f"error: unexpected {_one_line(exc)}{where}", err=True)
        sys.exit(UNEXPECTED_EXIT)


if __name__ == "__main__":
    main()
