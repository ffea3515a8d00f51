"""The pipeline gives the same tables, and what people read prints the same instants, whatever
the time zone of the machine it runs on.

One small demo day, plus dispatch records at the very edges of the day, is landed once. Then one
process per zone, each with its own homes and mail sinks:

* under ``TZ=America/Los_Angeles`` (UTC-8 in November) and ``TZ=Asia/Kolkata`` (UTC+5:30, a
  half-hour offset), zones on either side of UTC so that a day boundary taken in local time shows
  in one of them, the whole daily pipeline on a copy of the landing: Kolkata with ``brokerlens
  run``, Los Angeles with each step's own command (land, validate, build, alert, report), so the
  two ways must agree too. Every table must hold the same rows in both (but the times a run
  landed or validated things), the alert mails must say the same, and the day's edges must be
  where UTC puts them;
* under those two zones and ``TZ=UTC``, a copy of the day as Los Angeles had built it before its
  alert (land to gold) is read by the `brokerlens` command: `sql` in its three formats and its
  interactive mode, `tables`, the day's report and the alert mail. Each zone's output must be
  the UTC process's, character for character (but the report's generation time and the mail's
  Date).

A zone's commands run in one process (one JVM per zone, not per command), as the DAG's tasks do
on the stage server. The day is built only by the zones' processes, at once.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta, timezone
from email import policy
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from alert_helpers import free_port
from brokerlens.deliver.query import run_sql
from brokerlens.pipeline import DAILY_STEPS, run_stage
from brokerlens.platform.schemas import table_schemas
from brokerlens.platform.settings import reload_settings

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
# Runs phases of commands in one process; each phase has its own home and mail sink. A phase may
# start from a copy of a home another process publishes (it waits for it), and may publish its
# own home once its commands have run.
DRIVER = """
import contextlib, io, json, os, shutil, sys, time
from pathlib import Path

phases = json.loads(sys.argv[1])
pending = [phase["publish"] for phase in phases if phase.get("publish")]


def wait_for(published):
    deadline = time.monotonic() + 1800
    while not Path(published + ".done").exists():
        assert not Path(published + ".failed").exists(), f"the process that builds {published} failed"
        assert time.monotonic() < deadline, f"{published} not published in 30 minutes"
        time.sleep(1)


out = {}
try:
    from brokerlens.cli import main
    from brokerlens.platform.settings import reload_settings

    for phase in phases:
        if phase.get("copy_of"):
            wait_for(phase["copy_of"])
            shutil.copytree(phase["copy_of"], phase["env"]["BROKERLENS_HOME"])
        os.environ.update(phase["env"])
        reload_settings()
        for name, argv, stdin in phase["commands"]:
            sys.stdin, buffer = io.StringIO(stdin), io.StringIO()
            with contextlib.redirect_stdout(buffer):
                try:
                    main(log_to_file=False, argv=argv)
                except SystemExit as exc:
                    assert not exc.code, f"{name}: exit {exc.code}"
            out[name] = buffer.getvalue()
        if phase.get("publish"):
            shutil.copytree(phase["env"]["BROKERLENS_HOME"], phase["publish"])
            Path(phase["publish"] + ".done").touch()
            pending.remove(phase["publish"])
except BaseException:
    for published in pending:  # the processes waiting for it fail at once
        Path(published + ".failed").touch()
    raise
print(json.dumps(out))
"""


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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERLENS_", "AIRFLOW_CONN_"))}
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


def in_zone(zone: str, landing: Path, built: Path, root: Path) -> dict[str, object]:
    """Under ``TZ=zone``: the daily pipeline on a copy of ``landing`` (not under UTC, this
    process's own zone; Los Angeles publishes its home as ``built`` after build gold), then the
    read commands on a copy of ``built``."""
    root.mkdir(parents=True)
    phases, inboxes, controllers = [], {}, []
    for phase in ("run", "read") if zone != "UTC" else ("read",):
        inbox = inboxes[phase] = Inbox()
        controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
        controller.start()
        controllers.append(controller)
        env = {"BROKERLENS_HOME": str(root / phase), "AIRFLOW_CONN_SMTP_DEFAULT": smtp_url(controller.port)}
        if phase == "read":
            phases.append({"env": env, "copy_of": str(built), "commands": READ_COMMANDS})
            continue
        shutil.copytree(landing, root / phase / "landing")
        if zone == "America/Los_Angeles":
            phases.append({"env": env, "commands": [(f"run {n}", argv, "") for n, argv in BUILD_STEPS], "publish": str(built)})
            phases.append({"env": env, "commands": [(f"run {n}", argv, "") for n, argv in DELIVER_STEPS]})
        else:
            phases.append({"env": env, "commands": [("run", ["run", "--date", DAY.isoformat()], "")]})
    try:
        run = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(phases)],
            env=zone_env(zone),
            capture_output=True,
            text=True,
            timeout=3600,
            cwd=root,
        )
    finally:
        for controller in controllers:
            controller.stop()
    assert run.returncode == 0, f"TZ={zone}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    out = json.loads(run.stdout.splitlines()[-1])
    read_home = root / "read"
    report = (read_home / "reports" / DAY.isoformat() / f"brokerlens-{DAY}.html").read_text()
    out["report"] = re.sub(r"Generated [^<]*UTC", "Generated (when)", report.replace(str(read_home), "HOME"))
    out["alert"] = [line.replace(str(read_home), "HOME") for line in out["alert"].splitlines() if "sent to" in line]
    out["mails"] = sorted(mail(m) for m in inboxes["read"].messages)
    if "run" in inboxes:
        out["run tables"] = tables(root / "run")
        out["run mails"] = sorted(mail(m) for m in inboxes["run"].messages)
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
    zones = ("UTC", *ZONES)
    with ThreadPoolExecutor(len(zones)) as pool:
        outputs = dict(zip(zones, pool.map(lambda z: in_zone(z, settings.landing, built, tmp_path / z.replace("/", "_")), zones)))

    # The daily pipeline under either zone (`brokerlens run`, or a command per step): the same tables and mails.
    first, other = ZONES
    tables_first = outputs[first]["run tables"]
    assert {"bronze_dispatch", "dispatch_periods", "cursor_ranges", "hole_alerts", "alert_notifications"} <= set(tables_first)
    assert outputs[first]["run mails"], "the demo day mails alerts"
    assert set(outputs[other]["run tables"]) == set(tables_first)
    for name in tables_first:
        assert outputs[other]["run tables"][name] == tables_first[name], f"{name} differs between TZ={first} and TZ={other}"
    assert outputs[other]["run mails"] == outputs[first]["run mails"]

    from deltalake import DeltaTable

    lake = tmp_path / first.replace("/", "_") / "run" / "lake"
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
    reload_settings()
    _, held = run_sql(SNAPSHOTS.replace("snapshot_at, forecast_cap_at FROM", "date_format(snapshot_at, \"yyyy-MM-dd'T'HH:mm:ss'Z'\") AS t FROM"))
    assert [r["snapshot_at"] for r in snapshots] == [r["t"] for r in held]
    assert stamp.match(snapshots[0]["forecast_cap_at"]), snapshots[0]
    assert snapshots[0]["snapshot_at"] in utc["sql table"] and snapshots[0]["snapshot_at"] in utc["sql csv"]
    assert '"snapshots": ["2026-11-21T' in utc["sql console"] and "ranges_at" in utc["sql console"]
    assert "cap reached (UTC)" in utc["report"] and "run at (UTC)" in utc["report"]
    assert utc["mails"] and utc["alert"] and " UTC" in utc["mails"][0][3]
    for zone in ZONES:
        for name in ("sql table", "sql csv", "sql json", "sql console", "tables", "report", "alert", "mails"):
            assert outputs[zone][name] == utc[name], f"{name} under TZ={zone} differs from TZ=UTC"
