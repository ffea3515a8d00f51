"""The pipeline gives the same tables, and what people read prints the same instants, whatever
the time zone of the machine it runs on.

One small demo day, plus dispatch records at the very edges of the day, is landed once. Then, all
in this process and on the test session, each zone set by ``time.tzset`` (Python's local time):

* the whole daily pipeline on a copy of the landing, twice: under ``TZ=UTC`` with each step's own
  command (land, validate, build, alert, report), and under ``TZ=Asia/Kolkata`` (UTC+5:30, a
  half-hour offset) with ``brokerlens run``, so the two ways must agree too. Every table must hold
  the same rows in both (but the times a run landed or validated things), the alert mails must say
  the same, and the day's edges must be where UTC puts them. In Kolkata's local time the day's
  last millisecond is on the next day and the millisecond before the day on the day itself, so a
  day boundary taken in local time shows;
* a copy of the day as UTC built it before its alert (land to gold) is read by the `brokerlens`
  command under ``TZ=UTC``, Kolkata and ``TZ=America/Los_Angeles`` (UTC-8 in November, on the other
  side of UTC): `sql` in its three formats and its interactive mode, `tables`, the day's report and
  the alert mail. Each zone's output must be UTC's, character for character (but the report's
  generation time and the mail's Date).

The session's JVM was started under ``TZ=Asia/Kolkata`` (conftest.py), and is in UTC all the same,
as every brokerlens JVM is: asserted first. One JVM for every command, as the DAG's tasks share the
Spark Connect server's.
"""

from __future__ import annotations

import contextlib
import email
import io
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from email import policy
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from alert_helpers import free_port
from brokerlens.deliver.query import run_sql
from brokerlens.pipeline import DAILY_STEPS, run_stage
from brokerlens.platform.schemas import table_schemas
from brokerlens.settings import reload_settings

pytestmark = pytest.mark.slow

DAY = date(2026, 11, 21)
ZONES = ("America/Los_Angeles", "Asia/Kolkata")
EDGE_TOPIC = "persistent://tz/edges/t-partition-0"
# When a run happened, and where its home is: different in every run by nature.
RUN_COLUMNS = {"ingested_at", "run_at", "sent_at", "outbox_file"}

SNAPSHOTS = (
    "SELECT topic, subscription, snapshot_at, forecast_cap_at FROM cursor_ranges ORDER BY forecast_cap_at NULLS LAST, snapshot_at, topic, subscription LIMIT 12"
)
# The interactive mode, switching formats: nested timestamps (an array, a struct) and the alerts'.
CONSOLE = (
    "\\f json\n"
    "SELECT subscription, collect_list(snapshot_at) AS snapshots, "
    "named_struct('first', min(snapshot_at), 'last', max(snapshot_at)) AS span "
    "FROM cursor_ranges GROUP BY subscription ORDER BY subscription LIMIT 3;\n"
    "\\f csv\n"
    "SELECT topic, subscription, ranges_at, forecast_cap_at, last_snapshot_at FROM hole_alerts "
    "ORDER BY topic, subscription;\n"
)
READ_COMMANDS = [
    ("sql table", ["sql", "--format", "table", SNAPSHOTS], ""),
    ("sql csv", ["sql", "--format", "csv", SNAPSHOTS], ""),
    ("sql json", ["sql", "--format", "json", SNAPSHOTS], ""),
    ("sql console", ["sql"], CONSOLE),
    ("tables", ["tables", "cursor_ranges"], ""),
    ("report", ["report", "--date", DAY.isoformat()], ""),  # before the alert: its mails' sent_at is now
    ("alert", ["alert", "--date", DAY.isoformat()], ""),
]


def edge(stamp: str) -> str:
    return json.dumps(
        {
            "period_start": stamp,
            "period_seconds": 1,
            "level": "topic",
            "cluster": "c1",
            "broker": "broker-1:8080",
            "topic": EDGE_TOPIC,
            "msgs": 1,
            "bytes": 10,
            "entries": 1,
            "redelivered_msgs": 0,
        }
    )


class Inbox:
    def __init__(self):
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.original_content, policy=policy.default))
        return "250 OK"


def mail(message: email.message.EmailMessage) -> tuple:
    text = message.get_body(preferencelist=("plain",)).get_content()
    html = message.get_body(preferencelist=("html",)).get_content()
    return message["To"], message["Subject"], message["Message-ID"], text, html


def smtp_url(port: int) -> str:
    return f"smtp://127.0.0.1:{port}?disable_ssl=true&disable_tls=true"


def brokerlens_env() -> dict[str, str]:
    """The environment the commands run in: none of this process's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERLENS_", "AIRFLOW_CONN_"))}
    env.update(
        BROKERLENS_SPARK__SHUFFLE_PARTITIONS="2",
        # Mails link to the report: under one base URL, not each run's own home folder.
        BROKERLENS_REPORT__BASE_URL="https://ops.example.com/brokerlens/",
    )
    return env


@contextmanager
def environment_restored():
    """This process's environment, zone and settings as they were, after the block."""
    before = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)
        time.tzset()
        reload_settings()


def in_zone(zone: str, home: Path, commands: list[tuple[str, list[str], str]], env: dict[str, str]) -> tuple[dict[str, str], list[tuple]]:
    """`brokerlens` ``commands`` (name, argv, stdin) run in this process (cli.main) under ``TZ=zone``
    (Python's local time, by ``time.tzset``), in ``env`` with ``home`` as BROKERLENS_HOME and a
    mail sink of their own: what each printed, and the mails the sink received."""
    from brokerlens.cli import main

    assert Path("/usr/share/zoneinfo", zone).is_file(), f"time zone data (tzdata) missing for {zone}"
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    os.environ.clear()
    os.environ.update(env, TZ=zone, BROKERLENS_HOME=str(home), AIRFLOW_CONN_SMTP_DEFAULT=smtp_url(controller.port))
    time.tzset()
    reload_settings()
    printed = {}
    try:
        for name, argv, stdin in commands:
            stdin_before, sys.stdin, buffer = sys.stdin, io.StringIO(stdin), io.StringIO()
            try:
                with contextlib.redirect_stdout(buffer):
                    main(log_to_file=False, argv=argv)
            except SystemExit as exc:
                assert not exc.code, f"{zone} {name}: exit {exc.code}"
            finally:
                sys.stdin = stdin_before
            printed[name] = buffer.getvalue()
    finally:
        controller.stop()
    return printed, sorted(mail(m) for m in inbox.messages)


def tables(home: Path) -> dict[str, list[str]]:
    """Every table's rows (read with delta-rs, in this process), comparable across runs."""
    from deltalake import DeltaTable

    out = {}
    for name in sorted(table_schemas()):
        path = home / "lake" / name
        if not (path / "_delta_log").is_dir():
            continue
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        out[name] = sorted(repr(sorted((k, v) for k, v in r.items() if k not in RUN_COLUMNS)) for r in rows)
    return out


STEPS = [(f"{stage} {layer or ''}".strip(), [stage, "--date", DAY.isoformat(), *(["--layer", layer] if layer else [])], "") for stage, layer in DAILY_STEPS]
BUILD_STEPS, DELIVER_STEPS = STEPS[:5], STEPS[5:]  # land to build gold; alert and report


def read_outputs(home: Path, printed: dict[str, str], mails: list[tuple]) -> dict:
    """What the read commands printed, the report they wrote and the mails they sent, comparable
    across zones and homes."""
    report = (home / "reports" / DAY.isoformat() / f"brokerlens-{DAY}.html").read_text()
    return {
        **printed,
        "report": re.sub(r"Generated [^<]*UTC", "Generated (when)", report.replace(str(home), "HOME")),
        "alert": [line.replace(str(home), "HOME") for line in printed["alert"].splitlines() if "sent to" in line],
        "mails": mails,
    }


def test_tables_mails_and_printed_instants_are_the_same_in_every_zone(tmp_path, monkeypatch, spark, settings):
    run_stage("demo-data", DAY, settings, scale=0.01, seed=7)
    prev, nxt = DAY - timedelta(days=1), DAY + timedelta(days=1)
    # The first and the last instant of the day are on the day; a millisecond before or after,
    # not (quarantined as such).
    (settings.landing / DAY.isoformat() / "dispatch" / "edges.jsonl").write_text(
        "\n".join(
            [
                edge(f"{DAY}T00:00:00Z"),
                edge(f"{DAY}T23:59:59.999Z"),
                edge(f"{prev}T23:59:59.999Z"),
                edge(f"{nxt}T00:00:00Z"),
            ]
        )
        + "\n"
    )
    # The session's JVM was started under Kolkata's zone (conftest.py), and is in UTC.
    jvm = spark.sparkContext._jvm
    assert (jvm.java.lang.System.getenv("TZ"), jvm.java.util.TimeZone.getDefault().getID()) == ("Asia/Kolkata", "UTC")
    env, built = brokerlens_env(), tmp_path / "built"
    outputs: dict[str, dict] = {}
    with environment_restored():
        # UTC's steps (the day as it stands after build gold, before its alert, is the day every
        # zone reads), then Kolkata's `brokerlens run`.
        utc, kolkata = tmp_path / "UTC-run", tmp_path / "Asia_Kolkata-run"
        shutil.copytree(settings.landing, utc / "landing")
        utc_mails = in_zone("UTC", utc, BUILD_STEPS, env)[1]
        shutil.copytree(utc, built)
        utc_mails += in_zone("UTC", utc, DELIVER_STEPS, env)[1]
        shutil.copytree(settings.landing, kolkata / "landing")
        kolkata_mails = in_zone("Asia/Kolkata", kolkata, [("run", ["run", "--date", DAY.isoformat()], "")], env)[1]
        for zone, home, mails in (("UTC", utc, utc_mails), ("Asia/Kolkata", kolkata, kolkata_mails)):
            outputs[zone] = {"run home": home, "run tables": tables(home), "run mails": sorted(mails)}
        # The day built under UTC, read under every zone.
        for zone in ("UTC", *ZONES):
            home = tmp_path / f"{zone.replace('/', '_')}-read"
            shutil.copytree(built, home)
            outputs.setdefault(zone, {}).update(read_outputs(home, *in_zone(zone, home, READ_COMMANDS, env)))

    # The daily pipeline under either zone (a command per step, or `brokerlens run`): the same tables and mails.
    first, other = "UTC", "Asia/Kolkata"
    tables_first = outputs[first]["run tables"]
    assert {"bronze_dispatch", "dispatch_periods", "cursor_ranges", "hole_alerts", "alert_notifications"} <= set(tables_first)
    assert outputs[first]["run mails"], "the demo day mails alerts"
    assert set(outputs[other]["run tables"]) == set(tables_first)
    for name in tables_first:
        assert outputs[other]["run tables"][name] == tables_first[name], f"{name} differs between TZ={first} and TZ={other}"
    assert outputs[other]["run mails"] == outputs[first]["run mails"]

    from deltalake import DeltaTable

    lake = outputs[other]["run home"] / "lake"
    edges = [r for r in DeltaTable(str(lake / "bronze_dispatch")).to_pyarrow_table().to_pylist() if r["topic"] == EDGE_TOPIC]
    as_utc = lambda t: t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # noqa: E731
    assert sorted((r["day"], as_utc(r["period_start"])) for r in edges) == [
        (DAY, datetime(2026, 11, 21, tzinfo=timezone.utc)),
        (DAY, datetime(2026, 11, 21, 23, 59, 59, 999000, tzinfo=timezone.utc)),
    ]
    quarantined = [r for r in DeltaTable(str(lake / "quarantine")).to_pyarrow_table().to_pylist() if r["source_file"] == f"{DAY}/dispatch/edges.jsonl"]
    assert sorted(r["line"] for r in quarantined) == [3, 4]
    assert {r["reason"] for r in quarantined} == {"outside-day"}, quarantined

    # The day built here, read under every zone: the UTC process's characters.
    utc = outputs["UTC"]
    snapshots = json.loads(utc["sql json"])
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
    assert len(snapshots) == 12 and all(stamp.match(r["snapshot_at"]) for r in snapshots), snapshots
    # What Spark holds, written by Spark itself in this process's UTC session.
    monkeypatch.setenv("BROKERLENS_HOME", str(built))
    built_settings = reload_settings()
    _, held = run_sql(
        spark,
        SNAPSHOTS.replace("snapshot_at, forecast_cap_at FROM", "date_format(snapshot_at, \"yyyy-MM-dd'T'HH:mm:ss'Z'\") AS t FROM"),
        settings=built_settings,
    )
    assert [r["snapshot_at"] for r in snapshots] == [r["t"] for r in held]
    assert stamp.match(snapshots[0]["forecast_cap_at"]), snapshots[0]
    assert snapshots[0]["snapshot_at"] in utc["sql table"] and snapshots[0]["snapshot_at"] in utc["sql csv"]
    assert '"snapshots": ["2026-11-21T' in utc["sql console"] and "ranges_at" in utc["sql console"]
    assert "cap reached (UTC)" in utc["report"] and "run at (UTC)" in utc["report"]
    assert utc["mails"] and utc["alert"] and " UTC" in utc["mails"][0][3]
    for zone in ZONES:
        for name in ("sql table", "sql csv", "sql json", "sql console", "tables", "report", "alert", "mails"):
            assert outputs[zone][name] == utc[name], f"{name} under TZ={zone} differs from TZ=UTC"
