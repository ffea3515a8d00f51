"""The pipeline gives the same tables whatever the time zone of the machine it runs on.

A small demo day, plus dispatch records at the very edges of the day, goes through `brokerlens run`
(land, validate, build, alert, report) twice, each in its own process with its own home: under
``TZ=America/Los_Angeles`` (UTC-8 in November) and ``TZ=Asia/Kolkata`` (UTC+5:30, a half-hour
offset), zones on either side of UTC, so a day boundary taken in local time shows in one of them.
Every table must hold the same rows in both (but the times a run landed or validated things), the
alert mails must say the same, and the day's edges must be where UTC puts them.
"""

from __future__ import annotations

import email
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta, timezone
from email import policy
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from alert_helpers import free_port

from brokerlens.platform.schemas import table_schemas
from brokerlens.sources.demo import generate_day

pytestmark = pytest.mark.slow

DAY = date(2026, 11, 21)
ZONES = ("America/Los_Angeles", "Asia/Kolkata")
EDGE_TOPIC = "persistent://tz/edges/t-partition-0"
# When a run happened, and where its home is: different in every run by nature.
RUN_COLUMNS = {"ingested_at", "run_at", "sent_at", "outbox_file"}


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


def zone_env(zone: str, home: Path, smtp_port: int) -> dict[str, str]:
    """A brokerlens process's environment under ``TZ=zone``, with its own home and mail sink."""
    assert Path("/usr/share/zoneinfo", zone).is_file(), f"time zone data (tzdata) missing for {zone}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERLENS_", "AIRFLOW_CONN_"))}
    env.update(
        TZ=zone,
        BROKERLENS_HOME=str(home),
        BROKERLENS_SPARK__SHUFFLE_PARTITIONS="2",
        # Mails link to the report: under one base URL, not each run's own home folder.
        BROKERLENS_REPORT__BASE_URL="https://ops.example.com/brokerlens/",
        AIRFLOW_CONN_SMTP_DEFAULT=f"smtp://127.0.0.1:{smtp_port}?disable_ssl=true&disable_tls=true",
    )
    return env


def run_in_zone(zone: str, landing: Path, home: Path, smtp_port: int, command) -> None:
    home.mkdir()
    subprocess.run(["cp", "-r", str(landing), str(home / "landing")], check=True)
    run = subprocess.run(command("run", "--date", DAY.isoformat()), env=zone_env(zone, home, smtp_port), capture_output=True, text=True, timeout=3600, cwd=home)
    assert run.returncode == 0, f"TZ={zone}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


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


def mail(message: email.message.EmailMessage) -> tuple:
    text = message.get_body(preferencelist=("plain",)).get_content()
    html = message.get_body(preferencelist=("html",)).get_content()
    return message["To"], message["Subject"], message["Message-ID"], text, html


def test_tables_and_mails_are_the_same_in_every_time_zone(tmp_path, settings, brokerlens_command):
    generate_day(DAY, settings, scale=0.01)
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

    def run(zone: str) -> tuple[dict, list]:
        inbox = Inbox()
        controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
        controller.start()
        try:
            home = tmp_path / zone.replace("/", "_")
            run_in_zone(zone, settings.landing, home, controller.port, brokerlens_command)
        finally:
            controller.stop()
        return tables(home), sorted(mail(m) for m in inbox.messages)

    # The zones' runs at once, each in its own process and home (most of a run is JVM start-up
    # and planning, which one core at a time does not slow much).
    with ThreadPoolExecutor(len(ZONES)) as pool:
        runs = dict(zip(ZONES, pool.map(run, ZONES)))
    results = {zone: tables_of for zone, (tables_of, _) in runs.items()}
    mails = {zone: mails_of for zone, (_, mails_of) in runs.items()}

    first, other = ZONES
    tables_first = results[first]
    assert {"bronze_dispatch", "dispatch_periods", "cursor_ranges", "hole_alerts", "alert_notifications"} <= set(tables_first)
    assert mails[first], "the demo day mails alerts"
    assert set(results[other]) == set(tables_first)
    for name in tables_first:
        assert results[other][name] == tables_first[name], f"{name} differs between TZ={first} and TZ={other}"
    assert mails[other] == mails[first]

    from deltalake import DeltaTable

    lake = tmp_path / first.replace("/", "_") / "lake"
    edges = [r for r in DeltaTable(str(lake / "bronze_dispatch")).to_pyarrow_table().to_pylist() if r["topic"] == EDGE_TOPIC]
    as_utc = lambda t: t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # noqa: E731
    assert sorted((r["day"], as_utc(r["period_start"])) for r in edges) == [
        (DAY, datetime(2026, 11, 21, tzinfo=timezone.utc)),
        (DAY, datetime(2026, 11, 21, 23, 59, 59, 999000, tzinfo=timezone.utc)),
    ]
    quarantined = [r for r in DeltaTable(str(lake / "quarantine")).to_pyarrow_table().to_pylist() if r["source_file"] == f"{DAY}/dispatch/edges.jsonl"]
    assert sorted(r["line"] for r in quarantined) == [3, 4]
    assert {r["reason"] for r in quarantined} == {"outside-day"}, quarantined
