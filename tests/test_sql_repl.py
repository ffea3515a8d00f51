"""`brokerlens sql` without a query: statements from stdin until `;` or EOF, `\\q` quits."""

from __future__ import annotations

import pytest

import os
import pty
import re
import select
import subprocess
import time
from datetime import date, datetime

from typer.testing import CliRunner

from brokerlens import cli
from brokerlens.deliver.repl import split_statements
from brokerlens.platform.tables import table_schema, write_table
from brokerlens.platform.frames import rows_frame

REASONS = ["duplicate", "duplicate", "negative-counter"]


def seed_quarantine(spark, settings):
    rows = [(date(2026, 11, 21), "land", "dispatch", "d.jsonl", i, r, None, "{}", datetime(2026, 11, 21, 1)) for i, r in enumerate(REASONS, start=1)]
    write_table(rows_frame(spark, rows, table_schema("quarantine").struct), "quarantine", "append", settings=settings)


def test_statements_end_at_semicolons_outside_quotes_and_comments():
    lines = ["SELECT 1; SELECT ';' AS semi; -- not; a statement\n", "\\d quarantine\n", "SELECT\n", "  2 -- two;\n", ";\n", "SELECT 3"]
    assert list(split_statements(lines)) == ["SELECT 1", "SELECT ';' AS semi", "\\d quarantine", "SELECT\n  2", "SELECT 3"]


@pytest.mark.slow
def test_piped_queries_print_each_result_until_quit(spark, settings):
    seed_quarantine(spark, settings)
    script = "\n".join(
        [
            "SELECT reason, count(*) AS n",
            "FROM quarantine GROUP BY reason ORDER BY reason;",
            "\\f csv",
            "SELECT line FROM quarantine WHERE reason = 'negative-counter';",
            "\\d quarantine",
            "\\q",
            "SELECT 'never run' AS x;",
        ]
    )
    out = CliRunner().invoke(cli.app, ["sql"], input=script)
    assert out.exit_code == 0, out.output
    text = out.stdout
    # First result as a table with the counts of the seeded rows, then CSV after \f csv.
    assert re.search(r"duplicate\s*│\s*2\s*│", text) and re.search(r"negative-counter\s*│\s*1\s*│", text)
    assert f"{len(REASONS) - 1} rows" in text
    assert "line\n3\n" in text
    assert "source_file" in text and "Landing file path relative to the landing root." in text
    assert "never run" not in text


@pytest.mark.slow
def test_end_of_input_ends_the_last_statement_and_errors_exit_2(spark, settings):
    seed_quarantine(spark, settings)
    out = CliRunner().invoke(cli.app, ["sql", "-f", "json"], input="SELECT * FROM no_such_table;\nSELECT count(*) AS n FROM quarantine")
    assert out.exit_code == 2
    assert "unknown table no_such_table" in out.stderr
    # The statement after the error still ran; the last one needed no semicolon.
    assert out.stdout.strip() == f'[{{"n": {len(REASONS)}}}]'


@pytest.mark.slow
def test_on_a_terminal_it_prompts_and_quits(brokerlens_command):
    """A real pseudo-terminal: prompts, \\d without Spark, \\q ends the session with code 0."""
    main, child = pty.openpty()
    proc = subprocess.Popen(brokerlens_command("sql"), stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    output = b""

    def read_until(marker: bytes, timeout: float = 120) -> None:
        nonlocal output
        deadline = time.monotonic() + timeout
        while marker not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1)
            if ready:
                try:
                    output += os.read(main, 4096)
                except OSError:
                    break
        assert marker in output, output.decode(errors="replace")

    try:
        read_until(b"brokerlens> ")
        os.write(main, b"\\d\n")
        read_until(b"dispatch_periods")
        os.write(main, b"\\q\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
