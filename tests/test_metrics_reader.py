"""Land's one-pass /metrics reader (MetricsPageRows.scala) gives the general parser's rows exactly,
on every page it takes, and leaves every page the general parser has something to say about to
it, whichever families land (``land.metric_families``).

The reference is the general parser alone (metrics.parse over every file's lines, after
landed_records and the duplicate check, as land ran it before the reader). Rows are compared as
their repr, so that a double's last bit and its sign count.
"""

from __future__ import annotations

import os
import shutil
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from brokerlens.land import metrics
from brokerlens.land.bronze import _parsed_lines
from brokerlens.land.checks import mark_duplicates
from brokerlens.land.files import read_lines
from brokerlens.land.settings import LandSettings
from brokerlens_bench.large_files import write_large_day

FIXTURES = Path(__file__).parent / "fixtures"
DAY = date(2026, 11, 21)
AT_MS = 1795255200000  # 2026-11-21T10:00:00Z
HEADER = '# brokerlens: {"collected_at": "2026-11-21T10:00:00Z", "cluster": "c1", "broker": "b-1:8080"}\n'
OUT = 'pulsar_out_messages_total{cluster="c1",namespace="t/ns",topic="persistent://t/ns/x",subscription="s"}'
# Pulsar's pages as 2.5.0 served them, named as scrapes, on the day they were taken (some of their
# samples carry a timestamp of that day).
REAL = {"standalone-v2.5.0-topics.prom": "standalone_8080@1.prom", "standalone-v2.5.0-namespaces.prom": "standalone_8081.prom"}
REAL_DAY = date(2020, 3, 9)

# Pages the reader takes, whatever lands: the values, escapes and layouts where a re-parse could differ.
TAKEN = {
    "values.prom": HEADER
    + "# HELP pulsar_out_messages_total Total\n# TYPE pulsar_out_messages_total counter\n\n"
    + f"{OUT} 1000 {AT_MS}\n{OUT.replace('x', 'y')} 1.5E7\n{OUT.replace('x', 'z')} +Inf\n"
    + f'{OUT.replace("x", "n")} NaN\npulsar_out_bytes_total{{cluster="c1",topic="persistent://t/ns/x"}} 0.30000000000000004\n'
    + 'pulsar_version_info{cluster="c1",version="4.0.7",note="a \\"quoted\\" \\\\ value,\\nwith comma"} 1\n'
    + "# TYPE pulsar_ml_cursor_nonContiguousDeletedMessagesRange gauge\n"
    + 'pulsar_ml_cursor_nonContiguousDeletedMessagesRange{cluster="c1",ledger_name="t/ns/persistent/x",cursor_name="s"} 12 '
    + f"{AT_MS + 5000}\n"
    + 'pulsar_subscription_back_log{cluster="c1",subscription="s"} 5\n# TYPE jvm_gc_seconds summary\njvm_gc_seconds_count{cluster="c1"} 3\n',
    "broker-2_8080@1000.prom": f'# TYPE pulsar_out_messages_total counter\n{OUT.replace("c1", "c2")} 7 {AT_MS}\nup{{cluster="c9"}} 1',
    "no-timestamps.prom": f'{OUT} 3\npulsar_out_bytes_total{{topic="persistent://t/ns/x"}} 300\n',
    "comments-only.prom": "# HELP up whether it is up\n# TYPE up gauge\n",
    # Samples the reader scans instead of matching (a family that does not land): a brace in a
    # label, tabs, a character that is not ASCII (which the regex judges).
    "scanned.prom": HEADER + 'up{a="}",b="{"} 1\ngo_threads\t7\t1795255200000\nup{note="caf\u00e9"} 1\n',
}
# Pages the general parser must read: it finds a problem in each, or splits or reads a value the
# reader does not (a carriage return, a hexadecimal value, white space around a line).
LEFT = {
    "crlf.prom": HEADER.replace("\n", "\r\n") + f"{OUT} 1\r\n",
    "hex-value.prom": HEADER + f"{OUT} 0x1p3\n",
    "not-a-number.prom": HEADER + f"{OUT} many\n",
    "negative-counter.prom": HEADER + f"# TYPE pulsar_out_messages_total counter\n{OUT} -3\n",
    "repeated.prom": HEADER + f"{OUT} 1\n{OUT} 1\n",
    "outside-day.prom": HEADER + f"{OUT} 1 {AT_MS + 86_400_000}\n",
    "two-headers.prom": HEADER + HEADER + f"{OUT} 1\n",
    "header-without-cluster.prom": '# brokerlens: {"collected_at": "2026-11-21T10:00:00Z"}\n' + f"{OUT} 1\n",
    "header-epoch.prom": '# brokerlens: {"collected_at": 1795255200, "cluster": "c1"}\n' + f"{OUT} 1\n",
    "no-cluster.prom": OUT.replace('cluster="c1",', "") + f" 1 {AT_MS}\n",
    "unknown-type.prom": HEADER + "# TYPE pulsar_out_messages_total thing\n",
    "not-a-sample.prom": HEADER + "this is not a sample line at all {\n",
    "trailing-space.prom": HEADER + f"{OUT} 1 \n",
    "file-time-outside-day.prom": f"{OUT} 1\n",
    # Not samples, whatever lands: text after the last brace, no blank before the value, a third number.
    "brace-after-value.prom": HEADER + 'up{a="b"} 1 }\n',
    "no-blank-before-value.prom": HEADER + 'up{a="b"}1\n',
    "three-numbers.prom": HEADER + "up 1 2 3\n",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("metrics-reader")
    folder = root / "landing" / DAY.isoformat() / "metrics"
    folder.mkdir(parents=True)
    for path in (FIXTURES / "landing" / DAY.isoformat() / "metrics").glob("*.prom"):
        shutil.copyfile(path, folder / path.name)
    for name, text in {**TAKEN, **LEFT}.items():
        (folder / name).write_text(text)
    write_large_day(root / "large", DAY, partitions=20, minutes=2)
    for path in (root / "large" / DAY.isoformat() / "metrics").glob("*.prom"):
        shutil.copyfile(path, folder / f"large-{path.name}")
    # Pages without a header or sample timestamps are dated by the file: on the day, but one.
    on_day = datetime(2026, 11, 21, 18, 0, tzinfo=timezone.utc).timestamp()
    for path in folder.iterdir():
        os.utime(path, (on_day, on_day))
    next_day = datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc).timestamp()
    os.utime(folder / "file-time-outside-day.prom", (next_day, next_day))
    return folder


def same_rows(spark, settings, paths: list[Path], day: date, land: LandSettings, min_rows: int):
    """Land's rows of ``paths`` (the reader's and the general parser's of the files it left) equal
    the general parser's of every file, repr for repr, and so do the samples not landed. Gives
    (the names of the files the reader left, land's parsed rows: unpersist them)."""
    lines = read_lines(spark, paths)
    records, expected_not_landed = metrics.landed_records(lines, land)
    general = metrics.parse(mark_duplicates(records, within_file=True), day)
    taken = metrics.read(spark, paths, day, land)
    left = {p.name for p in taken.left}
    taken.scanned.unpersist()
    parsed, not_landed = _parsed_lines(spark, metrics, paths, day, settings.model_copy(update={"land": land}))
    try:
        assert general.schema.simpleString() == parsed.frame.schema.simpleString()
        expected = sorted(repr(r) for r in general.collect())
        got = sorted(repr(r) for r in parsed.frame.collect())
        assert not_landed == expected_not_landed
        assert len(got) == len(expected) >= min_rows
        assert got == expected
    except BaseException:
        parsed.unpersist()
        raise
    return left, parsed


@pytest.mark.parametrize("families", [[], ["pulsar_subscription_*", "jvm_*"], ["*"]], ids=["analytics", "patterns", "every"])
def test_the_reader_gives_the_general_parsers_rows_and_leaves_it_every_problem(spark, settings, folder, families):
    paths = sorted(folder.iterdir())
    left, parsed = same_rows(spark, settings, paths, DAY, LandSettings(metric_families=families), min_rows=60)
    # headerless.prom's one sample (`up 1`) has no cluster: left once it lands.
    expected_left = set(LEFT) | {"broker-1.prom"} | ({"headerless.prom"} if families == ["*"] else set())
    assert left == expected_left, left ^ expected_left
    assert sum(p.name.startswith("large-") for p in paths) == 20 and not {p.name for p in paths if p.name.startswith("large-")} & left
    try:
        if families == ["*"]:
            # The reader's rows hold what the pages say (not only what the general parser says too).
            values = {
                r["labels"].get("topic"): r for r in parsed.frame.where("source_file LIKE '%/values.prom' AND metric = 'pulsar_out_messages_total'").collect()
            }
            assert [values[f"persistent://t/ns/{t}"]["value"] for t in "xyz"] == [1000.0, 1.5e7, float("inf")]
            assert values["persistent://t/ns/x"]["metric_type"] == "counter"
            version = parsed.frame.where(F.col("metric") == "pulsar_version_info").where("source_file LIKE '%/values.prom'").first()
            assert version["labels"]["note"] == 'a "quoted" \\ value,\nwith comma'
            assert (version["cluster"], version["broker"], version["line"]) == ("c1", "b-1:8080", 10)
            gc = parsed.frame.where(F.col("metric") == "jvm_gc_seconds_count").first()
            assert gc["metric_type"] == "summary"
            [up] = parsed.frame.where("source_file LIKE '%/broker-2_8080@1000.prom' AND metric = 'up'").collect()
            assert (up["cluster"], up["broker"], up["collected_at"]) == ("c9", "broker-2:8080", datetime(2026, 11, 21, 10, 0))
    finally:
        parsed.unpersist()


def test_the_reader_takes_pulsars_own_pages(spark, settings, tmp_path):
    folder = tmp_path / REAL_DAY.isoformat() / "metrics"
    folder.mkdir(parents=True)
    for name, target in REAL.items():
        shutil.copyfile(FIXTURES / "real" / name, folder / target)
    left, parsed = same_rows(spark, settings, sorted(folder.iterdir()), REAL_DAY, LandSettings(metric_families=["*"]), min_rows=1000)
    try:
        assert left == set()
        assert {r["broker"] for r in parsed.frame.select("broker").distinct().collect()} == {"standalone:8080", "standalone:8081"}
    finally:
        parsed.unpersist()
