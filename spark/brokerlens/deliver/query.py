"""Ad-hoc Spark SQL over every table by name, and its output formats."""

from __future__ import annotations

import csv
import difflib
import io
import json
import logging
import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal

from pyspark.errors import ParseException, PySparkException
from pyspark.logger import PySparkLogger
from pyspark.sql import Row, SparkSession

from brokerlens.platform.schemas import table_schemas
from brokerlens.platform.settings import PlatformSettings
from brokerlens.platform.table_admin import register_tables
from brokerlens.platform.times import collect, iso

OutputFormat = Literal["table", "csv", "json"]


class QueryError(ValueError):
    """The query cannot run; the message is meant for the user."""


def run_sql(spark: SparkSession, query: str, settings: PlatformSettings) -> tuple[list[str], list[Row]]:
    """Register every table of ``settings``' lake, run ``query``, return its column names and rows."""
    register_tables(spark, settings)
    # PySpark logs every failed query as a JSON record with the whole Java stack trace, on a
    # handler of its own; the error reaches the user as a QueryError (its trace: the log file).
    verbose = logging.getLogger("brokerlens").isEnabledFor(logging.DEBUG)
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    try:
        df = spark.sql(query)
        return df.columns, collect(df)
    except PySparkException as exc:
        raise QueryError(explain(exc, query)) from exc


def explain(exc: PySparkException, query: str) -> str:
    """One line for a failed query: what is wrong and what to do, without Spark's plan or trace."""
    condition = exc.getCondition() or ""
    params = exc.getMessageParameters() or {}
    tables = sorted(table_schemas())
    if condition == "TABLE_OR_VIEW_NOT_FOUND":
        name = _unquote(params.get("relationName", "?"))
        return f"unknown table {name}; {_suggest(name, tables, 'tables are')}"
    if condition.startswith("UNRESOLVED_COLUMN"):
        name = _unquote(params.get("objectName", "?"))
        used = [t for t in tables if re.search(rf"\b{t}\b", query)]
        where = f" in {', '.join(used)}" if used else ""
        proposal = _unquote(params.get("proposal", ""))
        hint = f"; did you mean: {proposal}" if proposal else ""
        return f"column {name} not found{where}{hint} (`brokerlens tables NAME` lists the columns)"
    message = _first_line(exc)
    if isinstance(exc, ParseException):
        return f"SQL syntax error: {message}"
    return message


def _unquote(text: str) -> str:
    return text.replace("`", "")


def _suggest(name: str, known: list[str], label: str) -> str:
    close = difflib.get_close_matches(name.split(".")[-1], known, n=3)
    return f"did you mean: {', '.join(close)}" if close else f"{label}: {', '.join(known)}"


def _first_line(exc: PySparkException) -> str:
    """Spark's message without its error class, SQLSTATE, plan or stack trace."""
    text = (exc.getMessage() if exc.getCondition() else str(exc)).strip()
    text = text.split("\n\nJVM stacktrace")[0].splitlines()[0] if text else type(exc).__name__
    text = re.sub(r"^\[[A-Z_.]+\]\s*", "", text)
    return re.sub(r"\s*SQLSTATE: \w+\.?;?.*$", "", text).strip()


def _plain(value: Any) -> Any:
    """JSON- and CSV-friendly value: ISO timestamps in UTC, numbers as numbers."""
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def format_rows(columns: list[str], rows: list[Row], fmt: OutputFormat) -> str:
    records = [[_plain(v) for v in row] for row in rows]
    if fmt == "json":
        return json.dumps([dict(zip(columns, r)) for r in records], ensure_ascii=False)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for r in records:
            writer.writerow([json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v) for v in r])
        return buffer.getvalue().rstrip("\n")
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table

        table = Table(show_lines=False, header_style="bold")
        for c in columns:
            table.add_column(c, overflow="fold")
        for r in records:
            table.add_row(*["NULL" if v is None else str(v) for v in r])
        out = io.StringIO()
        console = Console(file=out, width=200, force_terminal=False)
        console.print(table)
        console.print(f"{len(records)} row{'s' if len(records) != 1 else ''}")
        return out.getvalue().rstrip("\n")
    raise QueryError(f"unknown format {fmt!r}: use table, csv or json")
