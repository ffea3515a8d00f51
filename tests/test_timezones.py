"""The pipeline gives the same tables, and what people read prints the same instants, whatever
the time zone of the machine it runs on.

One small demo day, plus dispatch records at the very edges of the day, is landed once. Then:

* the whole daily pipeline on a copy of the landing, twice: in this process under ``TZ=UTC``
  with each step's own command (land, validate, build, alert, report), and in a process under
  ``TZ=Asia/Kolkata`` (UTC+5:30, a half-hour offset) with ``brokerlens run``, so the two ways must
  agree too. Every table must hold the same rows in both (but the times a run landed or validated
  things), the alert mails must say the same, and the day's edges must be where UTC puts them.
  In Kolkata's local time the day's last millisecond is on the next day and the millisecond
  before the day on the day itself, so a day boundary taken in local time shows;
* a copy of the day as UTC built it before its alert (land to gold) is read by the `brokerlens`
  command under ``TZ=UTC`` (here), Kolkata and ``TZ=America/Los_Angeles`` (UTC-8 in November, on
  the other side of UTC): `sql` in its three formats and its interactive mode, `tables`, the day's
  report and the alert mail. Each zone's output must be UTC's, character for character (but the
  report's generation time and the mail's Date).

Kolkata's commands run in a process started under its zone (tests/zone_phases.py; one JVM, not
one per command, as the DAG's tasks do on the Spark Connect server). UTC's and Los Angeles' run at the
same time in this process, on the test session, each zone set by ``time.tzset`` (Python's local
time; the session's JVM is in UTC whatever its zone, as every brokerlens JVM is).
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from email import policy
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from airflow_harness import JIT_ENV
from alert_helpers import free_port
from brokerlens.deliver.query import run_sql
from brokerlens.pipeline import DAILY_STEPS, run_stage
from brokerlens.platform.schemas import table_schemas
from brokerlens.settings import reload_settings
from zone_phases import run_phases

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


def zone_env(zone: str) -> dict[str, str]:
    """A brokerlens process's environment under ``TZ=zone``, none of this one's settings."""
    assert Path("/usr/share/zoneinfo", zone).is_file(), f"time zone data (tzdata) missing for {zone}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERLENS_", "AIRFLOW_CONN_")) or k == JIT_ENV}
    env.update(
        TZ=zone,
        BROKERLENS_SPARK__SHUFFLE_PARTITIONS="2",
        # Mails link to the report: under one base URL, not each run's own home folder.
        BROKERLENS_REPORT__BASE_URL="https://ops.example.com/brokerlens/",
    )
    return env


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


STEPS = [(f"{stage} {layer or ''}".strip(), [stage, "--date", DAY.isoformat(), *(["--layer", layer] if layer else [])]) for stage, layer in DAILY_STEPS]
BUILD_STEPS, DELIVER_STEPS = STEPS[:5], STEPS[5:]  # land to build gold; alert and report


@contextmanager
def as_a_zones_process():
    """This process with the environment :func:`zone_env` gives a zone's process (the phases
    set the zone, run_phases); its environment and zone as they were afterwards."""
    before = dict(os.environ)
    env = zone_env("UTC")
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)
        time.tzset()
        reload_settings()


class Phases:
    """The phases of one process (tests/zone_phases.py), each with its own home and mail sink."""

    def __init__(self, root: Path):
        self.root, self.phases, self.inboxes, self.controllers = root, [], {}, []

    def add(self, zone: str, kind: str, **phase) -> dict:
        label = f"{zone} {kind}"
        inbox = self.inboxes[label] = Inbox()
        controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
        controller.start()
        self.controllers.append(controller)
        home = self.root / label.replace("/", "_").replace(" ", "-")
        env = {"BROKERLENS_HOME": str(home), "AIRFLOW_CONN_SMTP_DEFAULT": smtp_url(controller.port)}
        self.phases.append({"label": label, "kind": kind, "tz": zone, "env": env, **phase})
        return env

    def pipeline(self, zone: str, landing: Path, steps: bool, built: Path) -> None:
        """The daily pipeline on a copy of ``landing``: a command per step, publishing the home as
        ``built`` after build gold, or ``brokerlens run``."""
        if steps:
            env = self.add(zone, "run", commands=[(f"run {n}", argv, "") for n, argv in BUILD_STEPS], publish=str(built))
            deliver = [(f"run {n}", argv, "") for n, argv in DELIVER_STEPS]
            self.phases.append({**self.phases[-1], "label": f"{zone} deliver", "kind": "deliver", "commands": deliver, "publish": None})
        else:
            env = self.add(zone, "run", commands=[("run", ["run", "--date", DAY.isoformat()], "")])
        shutil.copytree(landing, Path(env["BROKERLENS_HOME"]) / "landing")

    def reads(self, zone: str, built: Path) -> None:
        """The read commands on a copy of ``built``."""
        self.add(zone, "read", copy_of=str(built), commands=READ_COMMANDS)

    def run(self, here: bool) -> dict[str, dict]:
        """{zone: what its phases printed, its tables and mails}: in this process or in one of
        its own."""
        try:
            if here:
                with as_a_zones_process():
                    printed = run_phases(self.phases)
            else:
                proc = subprocess.run(
                    [sys.executable, str(Path(__file__).with_name("zone_phases.py")), json.dumps(self.phases)],
                    env=zone_env(self.phases[0]["tz"]),
                    capture_output=True,
                    text=True,
                    timeout=3600,
                    cwd=self.root,
                )
                assert proc.returncode == 0, f"{self.phases[0]['label']}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                printed = json.loads(proc.stdout.splitlines()[-1])
        finally:
            for controller in self.controllers:
                controller.stop()
        out: dict[str, dict] = {}
        for phase in self.phases:
            zone, kind = phase["tz"], phase["kind"]
            got, home, inbox = out.setdefault(zone, {}), Path(phase["env"]["BROKERLENS_HOME"]), self.inboxes.get(phase["label"])
            if kind == "read":
                got.update(printed[phase["label"]])
                report = (home / "reports" / DAY.isoformat() / f"brokerlens-{DAY}.html").read_text()
                got["report"] = re.sub(r"Generated [^<]*UTC", "Generated (when)", report.replace(str(home), "HOME"))
                got["alert"] = [line.replace(str(home), "HOME") for line in got["alert"].splitlines() if "sent to" in line]
                got["mails"] = sorted(mail(m) for m in inbox.messages)
            elif kind == "run":
                got["run home"], got["run tables"] = home, tables(home)
                got["run mails"] = sorted(mail(m) for m in inbox.messages)
        return out


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
    built = tmp_path / "built"
    # Kolkata's run and reads in a process of their own; UTC's steps and reads and Los Angeles'
    # reads here meanwhile (UTC's build gold is the day they all read). A zone set by tzset is
    # Python's local time; the JVM is in UTC whatever its zone.
    there, here = Phases(tmp_path / "there"), Phases(tmp_path / "here")
    there.pipeline("Asia/Kolkata", settings.landing, steps=False, built=built)
    there.reads("Asia/Kolkata", built)
    here.pipeline("UTC", settings.landing, steps=True, built=built)
    here.reads("UTC", built)
    here.reads("America/Los_Angeles", built)
    with ThreadPoolExecutor(1) as pool:
        other_zones = pool.submit(there.run, here=False)
        outputs = here.run(here=True)
        outputs |= other_zones.result()

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
