"""Hostile landing files through `brokerlens land`, as a user runs it: each file lands or is
quarantined with its reason; the command neither crashes nor hangs, and its JVM keeps to the
driver memory of the settings."""

from __future__ import annotations

import pytest

import gzip
import os
import random
import subprocess
import threading
import time
from pathlib import Path

from deltalake import DeltaTable
from landing_helpers import FIXTURES

from brokerlens.land.survey import EMPTY_FILE, OUTSIDE_LANDING, TOO_LARGE
from brokerlens.settings import Settings

DAY = "2026-11-21"
HUGE_LINE_MB = 200


def hostile_folder(landing: Path, home: Path) -> dict[str, str | None]:
    """The generated bad files: file → its expected quarantine reason, None when it must land,
    "either" when landing and quarantining are both right."""
    day = landing / DAY
    for kind in ("topic-stats", "dispatch"):
        (day / kind).mkdir(parents=True)
    stats = (FIXTURES / DAY / "topic-stats/orders-1000.json").read_bytes()
    dispatch = (FIXTURES / DAY / "dispatch/broker-1.jsonl").read_bytes().splitlines()
    (day / "topic-stats/random.json").write_bytes(random.Random(7).randbytes(65536))
    (day / "topic-stats/truncated.json").write_bytes(stats[: len(stats) // 2])
    (day / "topic-stats/deep.json").write_text('{"a":' * 10_000 + "1" + "}" * 10_000)
    (day / "dispatch/deep.jsonl").write_text("[" * 10_000 + "]" * 10_000 + "\n")
    (day / "dispatch/invalid-utf8.jsonl").write_bytes(dispatch[0].replace(b'"broker-1', b'"broker-\xff\xfe1') + b"\n")
    (day / "dispatch/bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(dispatch[1:3]) + b"\n")
    (day / "dispatch/crlf.jsonl").write_bytes(b"\r\n".join(dispatch[3:5]) + b"\r\n")
    with (day / "dispatch/huge.jsonl").open("wb") as out:  # one line of 200 MB, valid JSON
        out.write(b'{"period_start": "2026-11-21T10:00:00Z", "junk": "')
        chunk = b"x" * (1 << 20)
        for _ in range(HUGE_LINE_MB):
            out.write(chunk)
        out.write(b'"}\n')
    (day / "dispatch/zero.jsonl.gz").touch()
    (day / "dispatch/not-gzip.jsonl.gz").write_bytes(dispatch[5] + b"\n")
    (day / "dispatch/cut.jsonl.gz").write_bytes(gzip.compress(b"\n".join(dispatch))[:-20])
    outside = home / "outside.json"
    outside.write_bytes(stats)
    (day / "topic-stats/outside.json").symlink_to(outside)
    return {
        "topic-stats/random.json": "unreadable-file",
        "topic-stats/truncated.json": "malformed-json",
        "topic-stats/deep.json": "malformed-json",
        "dispatch/deep.jsonl": "malformed-json",
        "dispatch/invalid-utf8.jsonl": "either",
        "dispatch/bom.jsonl": None,
        "dispatch/crlf.jsonl": None,
        "dispatch/huge.jsonl": TOO_LARGE,  # over land.max_record_mb: never handed to Spark
        "dispatch/zero.jsonl.gz": EMPTY_FILE,
        "dispatch/not-gzip.jsonl.gz": "unreadable-file",
        "dispatch/cut.jsonl.gz": "unreadable-file",
        "topic-stats/outside.json": OUTSIDE_LANDING,
    }


def java_rss_peak(command: subprocess.Popen, stop: threading.Event, peak: dict) -> None:
    """The largest resident size of any JVM under ``command``, and its -Xmx, until ``stop`` (not
    this process's own session JVM, which the ``spark`` fixture starts with its own memory)."""
    while not stop.is_set():
        for status in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = status.read_bytes().split(b"\0")
                if not argv[0].endswith(b"java") or str(command.pid).encode() not in _ancestors(status.parent):
                    continue
                rss = next(int(line.split()[1]) for line in (status.parent / "status").read_text().splitlines() if line.startswith("VmRSS:"))
            except (OSError, StopIteration, ValueError):
                continue
            peak["rss_mb"] = max(peak.get("rss_mb", 0), rss // 1024)
            peak["xmx"] = [a.decode() for a in argv if a.startswith(b"-Xmx")]
        time.sleep(0.5)


def _ancestors(proc: Path) -> list[bytes]:
    found = []
    while True:
        stat = (proc / "stat").read_text()
        parent = stat.rsplit(")", 1)[1].split()[1]
        if parent in ("0", "1"):
            return found
        found.append(parent.encode())
        proc = Path("/proc") / parent


@pytest.mark.slow
def test_hostile_files_land_or_are_quarantined_within_the_driver_memory(brokerlens_home, brokerlens_command):
    settings = Settings()
    expected = hostile_folder(settings.landing, brokerlens_home)
    stop, peak = threading.Event(), {}
    started = time.monotonic()
    with subprocess.Popen(brokerlens_command("land", "--date", DAY), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as land:
        watcher = threading.Thread(target=java_rss_peak, args=(land, stop, peak), daemon=True)
        watcher.start()
        try:
            stdout, stderr = land.communicate(timeout=1800)
        finally:
            stop.set()
            watcher.join()
    run = subprocess.CompletedProcess(land.args, land.returncode, stdout, stderr)
    seconds = time.monotonic() - started
    print(f"land of the hostile folder: {seconds:.0f} s, JVM peak RSS {peak.get('rss_mb')} MB with {peak.get('xmx')}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert peak["xmx"] == [f"-Xmx{settings.spark.driver_memory}"]  # the settings' driver memory held it

    lake = settings.lake
    quarantined: dict[str, set] = {}
    for r in DeltaTable(str(lake / "quarantine")).to_pyarrow_table().to_pylist():
        quarantined.setdefault(r["source_file"].removeprefix(f"{DAY}/"), set()).add(r["reason"])
        assert len(r["raw"] or "") <= 64 * 1024
    landed = {}
    for table in ("bronze_topic_stats", "bronze_dispatch"):
        for r in DeltaTable(str(lake / table)).to_pyarrow_table(columns=["source_file"]).to_pylist():
            name = r["source_file"].removeprefix(f"{DAY}/")
            landed[name] = landed.get(name, 0) + 1
    for name, reason in expected.items():
        if reason is None:
            assert name in landed and name not in quarantined, name
        elif reason == "either":
            assert (name in landed) != (name in quarantined), name
        else:
            assert quarantined.get(name) == {reason} and name not in landed, (name, quarantined.get(name))
    assert landed["dispatch/bom.jsonl"] == 2 and landed["dispatch/crlf.jsonl"] == 2  # every line, BOM or CR
    assert "topic-stats: 4 files seen, 2 read, 0 rows, 4 quarantined" in run.stdout, run.stdout
    assert "dispatch: 8 files seen, 4 read" in run.stdout
