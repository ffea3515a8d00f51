"""Every file in a day's landing folder is landed or quarantined with its reason, and the summary
says so per kind; compressed files land exactly like their plain twins."""

from __future__ import annotations

import pytest

import bz2
import gzip
import json
import os
import re
import shutil
from datetime import date
from pathlib import Path

from landing_helpers import FIXTURES, install_fixtures
from pyspark import StorageLevel

from brokerlens.land import bronze, dispatch, metrics, topic_stats
from brokerlens.land.bronze import land_day, land_kind
from brokerlens.land.survey import (
    EMPTY_FILE,
    NOT_A_FILE,
    OUTSIDE_LANDING,
    TOO_LARGE,
    UNKNOWN_KIND,
    UNSUPPORTED_EXTENSION,
    survey,
)
from brokerlens.platform.tables import read_table, write_table

DAY = date(2026, 11, 21)
_CODEC = re.compile(r"\.(gz|bz2)\b")


def compress(path: Path, codec: str) -> Path:
    """``path`` replaced by its compressed twin, with the same modification time."""
    target = path.with_name(path.name + codec)
    with (gzip.open if codec == ".gz" else bz2.open)(target, "wb") as out:
        out.write(path.read_bytes())
    info = path.stat()
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    path.unlink()
    return target


def landed(spark, parser, settings) -> tuple[list, list]:
    """(bronze rows, quarantine rows) of one kind, with the codec's extension taken out of the
    file names (the only difference a compressed twin may make), in a stable order."""
    good, bad, parsed, _ = land_kind(spark, parser, DAY, settings)

    def plain(df):
        out = []
        for row in df.collect():
            row = row.asDict(recursive=True)
            for key in ("source_file", "detail"):
                if isinstance(row.get(key), str):
                    row[key] = _CODEC.sub("", row[key])
            out.append(row)
        return sorted(out, key=repr)

    try:
        return plain(good), plain(bad)
    finally:
        parsed.unpersist()


@pytest.mark.slow
def test_compressed_files_land_like_their_plain_twins(spark, every_metric_family, settings):
    install_fixtures(settings, "2026-11-21")
    parsers = (topic_stats, dispatch, metrics)  # whole-file JSON, JSON lines, Prometheus text
    plain = {p.KIND: landed(spark, p, settings) for p in parsers}
    files = sorted(p for p in (settings.landing / "2026-11-21").glob("*/*") if p.parent.name in plain)
    for i, path in enumerate(files):
        compress(path, (".gz", ".bz2")[i % 2])
    twins = {p.KIND: landed(spark, p, settings) for p in parsers}
    # The same rows, good and quarantined (the binary file is quarantined as such in both).
    for kind in plain:
        assert twins[kind] == plain[kind], kind
    assert all(plain[k][0] for k in plain) and [len(plain[k][1]) for k in plain] == [8, 7, 7]  # test_land's bad records
    assert {r["broker"] for r in twins["metrics"][0]} == {"broker-1:8080"}  # the name without .prom.gz


def why_folder(settings) -> dict[str, str]:
    """The fixture day plus the files of the issue and more of the kind: file → expected reason
    (None: it lands)."""
    day = install_fixtures(settings, "2026-11-21") / "2026-11-21"
    stats = json.loads((FIXTURES / "2026-11-21/topic-stats/orders-1000.json").read_text())
    stats["topic"] = stats["topic"].replace("orders", "archived")  # not a copy of a landed file
    (day / "topic-stats/compressed.json.gz").write_bytes(gzip.compress(json.dumps(stats).encode()))
    (day / "topic-stats/empty.json").touch()
    (day / "unknown-kind").mkdir()
    (day / "unknown-kind/x.json").write_text("{}")
    (day / "topic-stats/notes.txt").write_text("collected by hand")
    (day / "README").write_text("a stray file in the day's folder")
    (day / "dispatch/zero.jsonl.gz").touch()
    (day / "dispatch/fake.jsonl.gz").write_text('{"not": "gzip"}\n')
    whole = gzip.compress((FIXTURES / "2026-11-21/dispatch/broker-1.jsonl").read_bytes())
    (day / "dispatch/truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    os.mkfifo(day / "metrics/pipe.prom")  # opening it would block: never opened
    outside = settings.home / "outside.jsonl"
    outside.write_text('{"secret": 1}\n')
    (day / "policies/outside.jsonl").symlink_to(outside)
    (day / "policies/dangling.jsonl").symlink_to(day / "policies/gone.jsonl")
    (day / "dispatch/nested").mkdir()
    (day / "dispatch/nested/more.jsonl").write_text("{}\n")
    return {
        "topic-stats/compressed.json.gz": None,
        "topic-stats/empty.json": EMPTY_FILE,
        "unknown-kind/x.json": UNKNOWN_KIND,
        "topic-stats/notes.txt": UNSUPPORTED_EXTENSION,
        "README": UNKNOWN_KIND,
        "dispatch/zero.jsonl.gz": EMPTY_FILE,
        "dispatch/fake.jsonl.gz": "unreadable-file",
        "dispatch/truncated.jsonl.gz": "unreadable-file",
        "metrics/pipe.prom": NOT_A_FILE,
        "policies/outside.jsonl": OUTSIDE_LANDING,
        "policies/dangling.jsonl": "unreadable-file",
        "dispatch/nested/more.jsonl": UNSUPPORTED_EXTENSION,
    }


@pytest.mark.slow
def test_every_file_of_the_day_is_landed_or_quarantined_and_the_summary_says_so(spark, every_metric_family, settings):
    expected = why_folder(settings)
    day = settings.landing / "2026-11-21"
    every_file = {p.relative_to(day).as_posix() for p in day.rglob("*") if not p.is_dir() or p.is_symlink()}
    result = land_day(spark, DAY, settings)

    quarantined: dict[str, set] = {}
    for r in read_table("quarantine", settings=settings, spark=spark).collect():
        quarantined.setdefault(r["source_file"].removeprefix("2026-11-21/"), set()).add(r["reason"])
    bronze = set()
    for table in ("bronze_topic_stats", "bronze_internal_stats", "bronze_dispatch", "bronze_producer_stats", "bronze_policies", "bronze_metrics"):
        bronze |= {r[0].removeprefix("2026-11-21/") for r in read_table(table, settings=settings, spark=spark).select("source_file").distinct().collect()}
    assert every_file - bronze - set(quarantined) == set()
    for name, reason in expected.items():
        if reason is None:
            assert name in bronze and name not in quarantined, name
        else:
            assert quarantined.get(name) == {reason} and name not in bronze, name  # a link out is not followed

    lines = result.lines
    stats_rows, dispatch_rows = (read_table(t, settings=settings, spark=spark).count() for t in ("bronze_topic_stats", "bronze_dispatch"))
    # 12 fixture files (binary.json unread, 8 bad records) + compressed.json.gz, empty.json, notes.txt.
    assert f"topic-stats: 15 files seen, 12 read, {stats_rows} rows, 10 quarantined" in lines, lines
    assert "unknown-kind: 1 files seen, 0 read, 0 rows, 1 quarantined" in lines
    assert "-: 1 files seen, 0 read, 0 rows, 1 quarantined" in lines
    assert f"dispatch: 6 files seen, 2 read, {dispatch_rows} rows, 11 quarantined" in lines
    # broker-1.jsonl's 7 records; every record of late.jsonl is quarantined (test_land: bronze_dispatch is exactly broker-1's lines).
    assert dispatch_rows == 7 and stats_rows > 0
    assert "quarantined unknown-kind: not-read: unknown kind 1" in lines
    assert result.metrics["files_seen"] == len(every_file)


def test_survey_measures_records_and_leaves_the_days_metadata(tmp_path):
    """Without Spark: a line over the limit, a whole file over it, metadata beside the kinds."""
    day = tmp_path / "landing" / "2026-11-21"
    (day / "dispatch").mkdir(parents=True)
    (day / "topic-stats").mkdir()
    (day / "_demo_manifest.json").write_text("{}")
    mib = 1 << 20
    short = b'{"msgs": 1}\n' * (3 * mib // 12)  # 3 MiB of short lines: read
    (day / "dispatch/short.jsonl").write_bytes(short)
    (day / "dispatch/long.jsonl").write_bytes(b"{}\n" + b"x" * (2 * mib + 5) + b"\n{}\n")  # one 2 MiB line
    (day / "dispatch/long.jsonl.gz").write_bytes(gzip.compress(b"{}\n" + b"x" * (2 * mib + 5)))
    (day / "topic-stats/big.json").write_bytes(b"{" + b" " * (2 * mib) + b"}")
    (day / "topic-stats/small.json").write_bytes(b"{}")
    found = survey(tmp_path / "landing", "2026-11-21", {"dispatch": (".jsonl",), "topic-stats": (".json",)}, whole_file={"topic-stats"}, max_record=2 * mib)
    assert set(found) == {"dispatch", "topic-stats"}  # the manifest is no kind's file
    assert [p.name for p in found["dispatch"].read] == ["short.jsonl"]
    assert {(n.source_file, n.reason) for n in found["dispatch"].not_read} == {
        ("2026-11-21/dispatch/long.jsonl", TOO_LARGE),
        ("2026-11-21/dispatch/long.jsonl.gz", TOO_LARGE),
    }
    assert [p.name for p in found["topic-stats"].read] == ["small.json"]
    [big] = found["topic-stats"].not_read
    assert big.reason == TOO_LARGE and big.detail.startswith("the file, one record, has 2 MiB")


@pytest.mark.slow
def test_a_failed_land_leaves_no_parsed_rows_persisted(spark, settings, monkeypatch):
    """Each kind's parsed rows are persisted on disk until the quarantine is written; a land that
    fails there unpersists every kind's all the same (a Spark Connect server's session goes on)."""
    day = install_fixtures(settings, "2026-11-21") / "2026-11-21"
    for kind in ("internal-stats", "metrics", "producer-stats", "topic-stats"):
        shutil.rmtree(day / kind)  # two kinds are enough, and quicker
    kept = []

    def recording(*args, **kwargs):
        landed = land_kind(*args, **kwargs)
        kept.extend((frame, frame.storageLevel) for frame in landed.parsed.persisted)
        return landed

    def failing(frame, table, *args, **kwargs):
        if table == "quarantine":
            raise OSError("disk full")
        return write_table(frame, table, *args, **kwargs)

    monkeypatch.setattr(bronze, "land_kind", recording)
    monkeypatch.setattr(bronze, "write_table", failing)
    with pytest.raises(OSError, match="disk full"):
        land_day(spark, DAY, settings)
    assert StorageLevel.DISK_ONLY in [level for _, level in kept]
    assert [frame.storageLevel for frame, _ in kept] == [StorageLevel.NONE] * len(kept)
