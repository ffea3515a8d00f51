"""`brokerlens sql` without a query: read statements until `;` or end of input, print each result.

Works on a terminal (prompts and line editing, on stderr so stdout holds only results) and with
stdin from a pipe or a file (`brokerlens sql < queries.sql`). Commands: `\\q` quits, `\\d` lists
the tables, `\\d TABLE` shows a table's columns, `\\f table|csv|json` changes the output format,
`\\?` shows this help.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TextIO

from pyspark.sql import SparkSession

from brokerlens.platform.settings import PlatformSettings

HELP = """\
End a query with ; (or end of input). Tables are queried by name, e.g.
  SELECT * FROM hole_alerts WHERE day = date'2026-11-21' ORDER BY ranges DESC;
\\d          list the tables        \\d TABLE   its columns with their descriptions
\\f FORMAT   table, csv or json     \\q         quit (or Ctrl-D)"""


class Splitter:
    """Statements ended by `;` outside quotes and `--` comments; the last one may end at EOF.

    A line starting with a backslash between statements is a command, returned as it is.
    """

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.quote: str | None = None

    @property
    def pending(self) -> bool:
        return bool("".join(self.buffer).strip())

    def feed(self, line: str) -> list[str]:
        if self.quote is None and not self.pending and line.lstrip().startswith("\\"):
            self.buffer.clear()
            return [line.strip()]
        out, start = [], 0
        for i, ch in enumerate(line):
            if self.quote:
                if ch == self.quote:
                    self.quote = None
            elif ch in ("'", '"', "`"):
                self.quote = ch
            elif line.startswith("--", i):
                line = line[:i] + "\n"
                break
            elif ch == ";":
                self.buffer.append(line[start:i])
                statement = "".join(self.buffer).strip()
                self.buffer.clear()
                if statement:
                    out.append(statement)
                start = i + 1
        self.buffer.append(line[start:])
        return out

    def finish(self) -> list[str]:
        statement = "".join(self.buffer).strip()
        self.buffer.clear()
        return [statement] if statement else []


def split_statements(lines: Iterable[str]) -> Iterator[str]:
    splitter = Splitter()
    for line in lines:
        yield from splitter.feed(line)
    yield from splitter.finish()


def _lines(stdin: TextIO, interactive: bool, splitter: Splitter) -> Iterator[str]:
    if not interactive:
        yield from stdin
        return
    import readline  # noqa: F401  (line editing and history for input())

    while True:
        try:
            yield input("      ...> " if splitter.pending else "brokerlens> ") + "\n"
        except EOFError:
            sys.stderr.write("\n")
            return
        except KeyboardInterrupt:  # drop the statement being typed, like psql
            sys.stderr.write("^C\n")
            splitter.buffer.clear()
            splitter.quote = None


def repl(
    spark: SparkSession, settings: PlatformSettings, fmt: str = "table", stdin: TextIO | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run statements from stdin over the tables of ``settings``' lake; returns the exit code (2 when a statement failed)."""
    from brokerlens.platform.schemas import SchemaError, table_schema, table_schemas

    from .query import QueryError, format_rows, run_sql

    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    interactive = stdin.isatty()
    if interactive:
        stderr.write("brokerlens sql: \\? for help, \\q to quit\n")
    failed = False
    splitter = Splitter()

    def statements() -> Iterator[str]:
        for line in _lines(stdin, interactive, splitter):
            yield from splitter.feed(line)
        yield from splitter.finish()

    for statement in statements():
        if statement.startswith("\\"):
            command, _, arg = statement[1:].partition(" ")
            arg = arg.strip()
            if command == "q":
                break
            if command == "?":
                stderr.write(HELP + "\n")
            elif command == "d" and not arg:
                for name, schema in sorted(table_schemas().items()):
                    stdout.write(f"{name:<28} {schema.layer:<7} {schema.description}\n")
            elif command == "d":
                try:
                    schema = table_schema(arg)
                except SchemaError as exc:
                    stderr.write(f"error: {exc}\n")
                    failed = True
                    continue
                for c in schema.columns:
                    stdout.write(f"{c.name:<34} {c.type:<22} {c.description}\n")
            elif command == "f" and arg in ("table", "csv", "json"):
                fmt = arg
            else:
                stderr.write(f"error: unknown command \\{command} {arg}".rstrip() + "\n" + HELP + "\n")
                failed = True
            stdout.flush()
            continue
        try:
            columns, rows = run_sql(spark, statement, settings)
        except QueryError as exc:
            stderr.write(f"error: {exc}\n")
            failed = True
            continue
        stdout.write(format_rows(columns, rows, fmt) + "\n")  # type: ignore[arg-type]  # format_rows rejects others
        stdout.flush()
    return 2 if failed and not interactive else 0
