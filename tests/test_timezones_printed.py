"""What people read prints the same instants whatever the time zone of the machine.

One demo day is built (land to gold) once, in this process. A copy of its home is then read by
the `brokerlens` command under ``TZ=UTC``, ``TZ=Asia/Kolkata`` (UTC+5:30) and
``TZ=America/Los_Angeles`` (UTC-8 in November), one process per zone: `brokerlens sql` in its
three formats and its interactive mode, `brokerlens tables`, the day's report and the alert
mail. Each zone's output must be the UTC run's, character for character (but the report's
generation time and the mail's Date).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from test_alerting import free_port
from test_timezones import DAY, ZONES, Inbox, mail, zone_env

from brokerlens.deliver.query import run_sql
from brokerlens.pipeline import DAILY_STEPS, run_stage

pytestmark = pytest.mark.slow

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
COMMANDS = [
    ("sql table", ["sql", "--format", "table", SNAPSHOTS], ""),
    ("sql csv", ["sql", "--format", "csv", SNAPSHOTS], ""),
    ("sql json", ["sql", "--format", "json", SNAPSHOTS], ""),
    ("sql console", ["sql"], CONSOLE),
    ("tables", ["tables", "cursor_ranges"], ""),
    ("report", ["report", "--date", DAY.isoformat()], ""),  # before the alert: its mails' sent_at is now
    ("alert", ["alert", "--date", DAY.isoformat()], ""),
]
# Runs the commands in one process, as the stage server does: one JVM per zone, not per command.
DRIVER = """
import contextlib, io, json, sys
from brokerlens.cli import main

out = {}
for name, argv, stdin in json.loads(sys.argv[1]):
    sys.stdin, buffer = io.StringIO(stdin), io.StringIO()
    with contextlib.redirect_stdout(buffer):
        try:
            main(log_to_file=False, argv=argv)
        except SystemExit as exc:
            assert not exc.code, f"{name}: exit {exc.code}"
    out[name] = buffer.getvalue()
print(json.dumps(out))
"""


def read_in_zone(zone: str, built: Path, home: Path) -> dict[str, object]:
    shutil.copytree(built, home)
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        run = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(COMMANDS)],
            env=zone_env(zone, home, controller.port),
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=home,
        )
    finally:
        controller.stop()
    assert run.returncode == 0, f"TZ={zone}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    out = json.loads(run.stdout.splitlines()[-1])
    report = (home / "reports" / DAY.isoformat() / f"brokerlens-{DAY}.html").read_text()
    out["report"] = re.sub(r"Generated [^<]*UTC", "Generated (when)", report.replace(str(home), "HOME"))
    out["alert"] = [line.replace(str(home), "HOME") for line in out["alert"].splitlines() if "sent to" in line]
    out["mails"] = sorted(mail(m) for m in inbox.messages)
    return out


def test_every_output_prints_the_utc_instants_in_every_zone(tmp_path, spark, settings, brokerlens_home):
    run_stage("demo-data", DAY, settings, scale=0.01, seed=7)
    for stage, layer in DAILY_STEPS[:5]:  # land to build gold, each layer validated
        run_stage(stage, DAY, settings, **({"layer": layer} if layer else {}))

    zones = ("UTC", *ZONES)
    with ThreadPoolExecutor(len(zones)) as pool:
        outputs = dict(zip(zones, pool.map(lambda z: read_in_zone(z, brokerlens_home, tmp_path / z.replace("/", "_")), zones)))

    utc = outputs["UTC"]
    snapshots = json.loads(utc["sql json"])
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
    assert len(snapshots) == 12 and all(stamp.match(r["snapshot_at"]) for r in snapshots), snapshots
    # What Spark holds, written by Spark itself in this process's UTC session.
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
