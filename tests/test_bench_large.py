"""The large-day bench section at a tiny scale: generated landing files in Pulsar's formats that
land without quarantine and build through every daily step with the numbers the generator
gives; counters that only grow; the large-day figures in the summary."""

from __future__ import annotations

import json
from datetime import date

import pytest

import brokerlens_bench as bench
from brokerlens_bench import large_cluster as large
from brokerlens_bench.large_files import write_large_day

DAY = date(2026, 11, 20)
PARTITIONS, MINUTES = 8, 6  # internal stats at 00:00 and 00:05
SUBS = len(large.SUBSCRIPTIONS)


def test_generated_files_and_counters(tmp_path):
    counts = write_large_day(tmp_path, DAY, PARTITIONS, MINUTES)
    root = tmp_path / DAY.isoformat()
    brokers = min(PARTITIONS, large.BROKERS)
    internal = -(-MINUTES * 60 // large.INTERNAL_EVERY)  # 00:00 and 00:05
    for kind, collections in (("topic-stats", MINUTES), ("internal-stats", internal), ("metrics", MINUTES)):
        assert counts[kind]["files"] == len(list((root / kind).iterdir())) == collections * brokers, kind
    assert counts["topic-stats"]["records"] == MINUTES * PARTITIONS * SUBS
    assert counts["internal-stats"]["records"] == internal * PARTITIONS * SUBS
    series = len(large.TOPIC_SERIES) + len(large.SUBSCRIPTION_SERIES) * SUBS
    assert counts["metrics"]["records"] == MINUTES * PARTITIONS * series
    # Counters only grow from one snapshot to the next, and the topic's out counter is its subscriptions'.
    snapshots: dict[str, list[dict]] = {}
    for path in sorted((root / "topic-stats").iterdir(), key=lambda p: p.name.rsplit("-", 1)[1]):
        for env in json.loads(path.read_text()):
            snapshots.setdefault(env["topic"], []).append(env["stats"])
    assert len(snapshots) == PARTITIONS and all(len(s) == MINUTES for s in snapshots.values())
    for stats in snapshots.values():
        for before, after in zip(stats, stats[1:]):
            for key in ("msgInCounter", "bytesInCounter", "msgOutCounter", "bytesOutCounter"):
                assert after[key] >= before[key], key
            for name, sub in after["subscriptions"].items():
                assert sub["msgOutCounter"] >= before["subscriptions"][name]["msgOutCounter"]
                assert sub["nonContiguousDeletedMessagesRanges"] >= before["subscriptions"][name]["nonContiguousDeletedMessagesRanges"]
        assert stats[-1]["msgOutCounter"] == sum(s["msgOutCounter"] for s in stats[-1]["subscriptions"].values())
    # Internal stats agree with topic stats of the same collection: the range counts, and the ranges listed.
    cursors = {}
    for path in sorted((root / "internal-stats").iterdir()):
        for env in json.loads(path.read_text()):
            for name, cursor in env["stats"]["cursors"].items():
                text = cursor["individuallyDeletedMessages"]
                assert text.count("(") == cursor["totalNonContiguousDeletedMessagesRange"]
                cursors.setdefault((env["topic"], name), []).append(cursor)
    failover = [c for (_, name), c in cursors.items() if name == "failover"]
    assert failover and all(c["totalNonContiguousDeletedMessagesRange"] == 0 for cs in failover for c in cs)
    assert max(c[-1]["totalNonContiguousDeletedMessagesRange"] for c in cursors.values()) >= large.CAP - 1000
    topic = next(iter(snapshots))
    assert (
        cursors[(topic, "shared")][0]["totalNonContiguousDeletedMessagesRange"]
        == (snapshots[topic][0]["subscriptions"]["shared"]["nonContiguousDeletedMessagesRanges"])
    )
    # Deterministic, and a shorter window is the same day's first minutes.
    again = write_large_day(tmp_path / "again", DAY, PARTITIONS, 2)
    first = sorted((root / "topic-stats").iterdir())[0]
    assert (tmp_path / "again" / DAY.isoformat() / "topic-stats" / first.name).read_bytes() == first.read_bytes()
    assert again["policies"] == counts["policies"]


@pytest.mark.heavy
@pytest.mark.slow  # the daily steps' fixed costs: about 2 minutes on 2 busy cores
def test_large_day_through_every_daily_step(spark, tmp_path):
    out = tmp_path / "bench" / "results.json"
    results = bench.run(
        out, sizes=(), days_partitions=None, land_scales=(), demo_day_scale=None, large_partitions=PARTITIONS, large_minutes=(MINUTES,), spark=spark
    )
    assert bench.failed_sections(results) == {}
    (window,) = results["large_day"]["windows"]
    landing, stages = window["landing"], window["stages"]
    assert list(stages) == ["land", "validate bronze", "build silver", "validate silver", "build gold", "alert", "report"]
    assert window["quarantined"] == 0
    # land's floor on the same files: a row per topic's stats (the stats kinds' records are per
    # subscription), per /metrics line (its samples and comments) and per policy line
    envelopes = (landing["topic-stats"]["records"] + landing["internal-stats"]["records"]) // SUBS
    assert window["floor"]["rows"] > envelopes + landing["metrics"]["records"] + landing["policies"]["records"]
    assert window["land/floor"] == round(stages["land"]["seconds"] / window["floor"]["seconds"], 2)
    land = stages["land"]["tables"]
    for table, kind in (
        ("bronze_topic_stats", "topic-stats"),
        ("bronze_internal_stats", "internal-stats"),
        ("bronze_policies", "policies"),
    ):
        assert land[table] == landing[kind]["records"], table
    # /metrics: build reads pulsar_out_messages_total, one sample per partition and minute; the
    # other samples are counted, not landed
    assert land["bronze_metrics"] == PARTITIONS * MINUTES
    assert window["metrics_samples_not_landed"] == landing["metrics"]["records"] - PARTITIONS * MINUTES
    assert land["quarantine"] == 0
    assert stages["land"]["rows_in"] == sum(k["records"] for k in landing.values())
    silver = stages["build silver"]["tables"]
    assert silver["cursor_snapshots"] == PARTITIONS * SUBS * MINUTES
    assert stages["validate bronze"]["rows_in"] == stages["build silver"]["rows_in"] == stages["land"]["rows_out"]
    assert stages["build gold"]["rows_in"] == stages["build silver"]["rows_out"] > 0
    gold = stages["build gold"]["tables"]
    assert gold["cursor_ranges"] == silver["cursor_snapshots"]
    assert gold["hole_alerts"] >= 1  # the cursor near or over the cap
    for s in stages.values():
        assert s["seconds"] > 0 and s["jvm_rss_mb"] > 0 and s["jvm_heap_peak_mb"] > 0
    assert stages["land"]["mb_per_second_per_core"] > 0
    days = results["large_day"]["projection"]["days"]
    assert [(d["partitions"], d["cores"]) for d in days] == [(PARTITIONS, results["environment"]["cores"]), (50_000, 16), (50_000, 64)]
    assert days[1]["hours"] == 4 * days[2]["hours"] or abs(days[1]["hours"] - 4 * days[2]["hours"]) < 0.05
    assert json.loads(out.read_text()) == results


def test_summary_shows_the_large_day():
    def stage(seconds):
        return {
            "rows_in": 1000,
            "rows_out": 900,
            "seconds": seconds,
            "rows_per_second_per_core": 250,
            "jvm_rss_mb": 800.0,
            "jvm_heap_peak_mb": 300.0,
            "python_driver_rss_mb": 100.0,
        }

    # land grows by 0.1 s a minute of data, build silver is all fixed cost.
    windows = [
        {
            "minutes": m,
            "generate_seconds": 1.0,
            "landing_mb": 10.0 * m,
            "total_seconds": 4.0 + 0.1 * m,
            "peak_jvm_rss_mb": 800.0 + m,
            "peak_jvm_heap_peak_mb": 300.0,
            "peak_python_driver_rss_mb": 100.0,
            "stages": {"land": {**stage(2.0 + 0.1 * m), "mb_per_second_per_core": 2.5}, "build silver": stage(2.0)},
            "floor": {**stage(1.0), "mb_per_second_per_core": 10.0 * m / 1.0 / 2},
            "land/floor": round(2.0 + 0.1 * m, 2),
        }
        for m in (15, 30)
    ]
    projection = bench.project_day(windows, 2000, 2, large.MINUTES)
    results = {
        "sizes": [],
        "large_day": {
            "partitions": 2000,
            "windows": windows,
            "projection": projection,
            "memory_by_rows": [
                {"bronze_rows": 900, "jvm_rss_mb": w["peak_jvm_rss_mb"], "jvm_heap_peak_mb": 300.0, "python_driver_rss_mb": 100.0} for w in windows
            ],
        },
    }
    # 4 s fixed + 0.1 s per minute of data: 4 + 144 s for the day at 2,000 partitions on 2 cores;
    # x 25 partitions x 2/16 (2/64) cores for 50,000 partitions.
    assert (projection["fixed_seconds"], projection["seconds_per_minute_of_data"]) == (4.0, 0.1)
    assert [d["hours"] for d in projection["days"]] == [round(148 / 3600, 2), round((4 + 144 * 25 / 8) / 3600, 2), round((4 + 144 * 25 / 32) / 3600, 2)]
    day_mb = 10.0 * large.MINUTES  # 10 MB a minute at 2,000 partitions
    assert [d["landing_gb"] for d in projection["days"]] == [round(day_mb / 1024, 1)] + [round(day_mb * 25 / 1024, 1)] * 2
    # From one window, everything is scaled.
    (alone,) = bench.project_day(windows[1:], 2000, 2, large.MINUTES)["days"][:1]
    assert alone["hours"] == round(7.0 * 48 / 3600, 2)
    targets = bench.targets(results)
    assert targets["large day: projected hours for 50,000 partitions on 16 cores"] == projection["days"][1]["hours"]
    assert targets["large day: peak JVM RSS MB per window (15, 30 min)"] == "815, 830"
    assert targets["large day, 30 min (300.0 MB): land MB/s per core, and its floor's"] == "2.5, 150.0"
    assert targets["large day, 30 min: land/floor"] == 5.0
    text = bench.markdown({**results, "targets": targets})
    assert "| land | 1,000 | 900 | 5.0 | 250 | 2.5 | 800 | 300 |" in text
    assert "First 15 minutes: 150.0 MB generated" in text
    assert "the difference of the first 15 and 30 minutes (4.0 s fixed, 0.1 s per minute of data" in text
    assert "50,000 partitions on 64 cores" in text
