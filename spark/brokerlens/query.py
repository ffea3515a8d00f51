"""Ad-hoc Spark SQL over every table by name, and its output formats."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Row, SparkSession

from .schemas import table_schemas
from .tables import register_tables

OutputFormat = Literal["table", "csv", "json"]


class QueryError(ValueError):
    """The query cannot run; the message is meant for the user."""


def run_sql(query: str, spark: SparkSession | None = None) -> tuple[list[str], list[Row]]:
    """Register every table, run ``query``, return its column names and rows."""
    from .spark import get_spark

    spark = spark or get_spark()
    register_tables(spark)
    try:
        df = spark.sql(query)
        return df.columns, df.collect()
    except ParseException as exc:
        raise QueryError(f"SQL syntax error: {_first_line(exc)}") from exc
    except AnalysisException as exc:
        message = _first_line(exc)
        if getattr(exc, "getCondition", lambda: None)() == "TABLE_OR_VIEW_NOT_FOUND" or (
            "TABLE_OR_VIEW_NOT_FOUND" in message
        ):
            missing = re.search(r"`?([\w.]+)`? cannot be found", message)
            name = missing.group(1) if missing else "?"
            raise QueryError(
                f"unknown table {name}; tables are: {', '.join(sorted(table_schemas()))}"
            ) from exc
        raise QueryError(message) from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.split("\n\nJVM stacktrace")[0].strip()


def _plain(value: Any) -> Any:
    """JSON- and CSV-friendly value: ISO timestamps in UTC, numbers as numbers."""
    if isinstance(value, datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return stamp.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
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
            writer.writerow(
                [json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v) for v in r]
            )
        return buffer.getvalue().rstrip("\n")
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table

        table = Table(show_lines=False, header_style="bold")
        for c in columns:
            table.add_column(c, overflow="fold")
        for r in records:
            table.add_row(*["NULL" if v is None else str(v) for v in r])
        console = Console(file=io.StringIO(), width=200, force_terminal=False)
        console.print(table)
        console.print(f"{len(records)} row{'s' if len(records) != 1 else ''}")
        return console.file.getvalue().rstrip("\n")
    raise QueryError(f"unknown format {fmt!r}: use table, csv or json")
