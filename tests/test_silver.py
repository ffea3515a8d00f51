"""Silver tables from landed fixtures: dispatch intervals (with a counter reset), cursor
snapshots (seed 004), producer snapshots, rate limits (precedence, a limit in force since the
day before, a removal and mid-day changes), and a rebuild that changes nothing."""

from __future__ import annotations

import pytest

import json
from datetime import date, datetime

from landing_helpers import FIXTURES, install_fixtures, rows

from brokerlens.land.bronze import land_day
from brokerlens.platform.frames import empty_frame
from brokerlens.platform.tables import read_table
from brokerlens.silver.build import build_silver

DAY = date(2026, 11, 21)
SILVER = ["dispatch_intervals", "cursor_snapshots", "producer_snapshots", "rate_limits"]
P0 = "persistent://acme/ns1/orders-partition-0"
P1 = "persistent://acme/ns1/orders-partition-1"


def at(hour: int, minute: int = 0, day: int = 21) -> datetime:
    return datetime(2026, 11, day, hour, minute)


def expected_counter_deltas(topic: str) -> list[tuple[datetime, int, bool]]:
    """(interval start, messages, reset) from the fixture files, computed here directly."""
    snaps = []
    for path in sorted((FIXTURES / "2026-11-21/topic-stats").glob("orders-*.json")):
        doc = json.loads(path.read_text())
        taken = datetime.fromisoformat(doc["collected_at"].replace("Z", ""))
        snaps.append((taken, doc["stats"]["partitions"][topic]["subscriptions"]["s1"]["msgOutCounter"]))
    snaps.sort()
    out = []
    for (t0, c0), (_, c1) in zip(snaps, snaps[1:]):
        out.append((t0, c1 if c1 < c0 else c1 - c0, c1 < c0))
    return out


@pytest.mark.slow
def test_silver_tables(spark, settings):
    install_fixtures(settings, "2026-11-20", "2026-11-21")
    land_day(spark, date(2026, 11, 20), settings)
    land_day(spark, DAY, settings)
    build_silver(spark, DAY, settings)

    intervals = rows(read_table("dispatch_intervals", settings=settings, spark=spark), "level", "topic", "subscription", "interval_start")
    # Partition 0 has dispatch records: period grain only, exactly the landed records.
    dispatched = [json.loads(x) for x in (FIXTURES / "2026-11-21/dispatch/broker-1.jsonl").read_text().splitlines()]
    p0_subs = [r for r in intervals if r["topic"] == P0 and r["level"] == "subscription"]
    assert [(r["grain"], r["msgs"], r["entries"], r["redelivered_msgs"]) for r in p0_subs] == [
        ("period", d["msgs"], d["entries"], d["redelivered_msgs"]) for d in dispatched if d["level"] == "subscription"
    ]
    # Partition 1 only has counters: scrape grain, with the reload between 10:05 and 10:10.
    p1_subs = [r for r in intervals if r["topic"] == P1 and r["level"] == "subscription"]
    assert [(r["interval_start"], r["msgs"], r["counter_reset"]) for r in p1_subs] == expected_counter_deltas(P1)
    assert any(r["counter_reset"] for r in p1_subs)
    assert all(r["grain"] == "scrape" and r["interval_seconds"] == 300.0 and r["entries"] is None for r in p1_subs)
    brokers = [r for r in intervals if r["level"] == "broker"]
    assert [(r["msgs"], r["topic"]) for r in brokers] == [(d["msgs"], None) for d in dispatched if d["level"] == "broker"]

    cursors = rows(read_table("cursor_snapshots", settings=settings, spark=spark), "topic", "subscription", "snapshot_at")
    seed = [c for c in cursors if c["topic"] == P0 and c["ranges_source"] == "internal-stats"]
    assert len(seed) == 1
    c = seed[0]
    assert (c["mark_delete_position"], c["individually_deleted_messages"], c["ranges_reported"]) == ("1:2", "[(1:4..1:6], (1:7..1:8]]", 2)
    # Paired with the topic stats taken 2 s earlier; the current ledger counted by currentLedgerEntries.
    assert (c["subscription_type"], c["serialized_size_reported"], c["namespace"]) == ("Shared", 36, "acme/ns1")
    assert c["ledger_entries"] == {1: 10, 2: 7}
    assert c["snapshot_at"] == at(10, 0).replace(second=2)
    # Topic stats without internal stats stay, with the topic-stats range count.
    payments = [x for x in cursors if x["subscription"] == "audit"]
    assert [(x["ranges_reported"], x["ranges_source"], x["msg_delayed"]) for x in payments] == [(7, "topic-stats", 4), (9, "topic-stats", 6)]
    assert len([x for x in cursors if x["topic"] == P0]) == 3  # 10:00 paired, 10:05 and 10:10 alone

    producers = rows(read_table("producer_snapshots", settings=settings, spark=spark), "snapshot_at")
    assert [p["num_msgs_sent"] for p in producers] == [12000, 11000]
    p = producers[0]
    assert (p["topic"], p["partitions"], p["batching_max_messages"], p["memory_limit_bytes"]) == ("persistent://acme/ns1/orders", 2, 1000, 67108864)
    assert (p["num_batches_sent"], p["send_failed_queue_full"], p["compression_type"]) == (130, 3, "LZ4")

    limits = rows(read_table("rate_limits", settings=settings, spark=spark), "level", "topic", "valid_from")

    def timeline(level, topic=None):
        return [
            (r["valid_from"], r["valid_to"], r["msg_limit"], r["byte_limit"], r["period_seconds"], r["count_entries"], r["msg_source"])
            for r in limits
            if r["level"] == level and r["topic"] == topic
        ]

    end = at(0, day=22)
    # Topic level: namespace policy 10 msg/s, then the topic policy (5 msg, 2048 B per 2 s) from
    # noon; the broker's batch counting switches on at 18:00. Same for every partition.
    for topic in (P0, P1):
        assert timeline("topic", topic) == [
            (at(0), at(12), 10, None, 1, False, "namespace-policy"),
            (at(12), at(18), 5, 2048, 2, False, "topic-policy"),
            (at(18), end, 5, 2048, 2, True, "topic-policy"),
        ]
        # Subscription level: the topic policy of the day before holds until it is removed at
        # 06:00, then the broker default (20), then the dynamic config (40) from 18:00.
        assert timeline("subscription", topic) == [
            (at(0), at(6), 7, None, 1, False, "topic-policy"),
            (at(6), at(18), 20, None, 1, False, "broker-config"),
            (at(18), end, 40, None, 1, True, "broker-config"),
        ]
    broker = [r for r in limits if r["level"] == "broker"]
    # dispatchThrottlingRateInByte = 0 is unlimited (null).
    assert [(r["broker"], r["msg_limit"], r["byte_limit"]) for r in broker] == [("broker-1:8080", 100, None), ("broker-1:8080", 100, None)]

    # Rebuilding the day changes nothing (re-landing is covered by test_land).
    before = {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in SILVER}
    build_silver(spark, DAY, settings)
    assert {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in SILVER} == before


# ------------------------------------------------- a day of plain /metrics scrapes, two brokers

SCRAPE_DAY = date(2026, 11, 22)
SCRAPE_MS = 1795341600000  # 2026-11-22T10:00:00Z; one scrape a minute from there
# broker -> (partition, subscription, out messages per scrape, range counts per scrape)
SCRAPED = {
    "broker-1_8080": ("persistent://acme/ns1/orders-partition-0", "s1", [1000, 1600, 2500, 2600], [3, 5, 8, 13]),
    # broker-2 reloads the topic between the 3rd and 4th scrape: the counter restarts at 40.
    "broker-2_8080": ("persistent://acme/ns1/orders-partition-1", "s2", [5000, 5300, 5900, 40], [0, 0, 1, 1]),
}


def scrape_text(topic: str, sub: str, msgs: int, ranges: int, ms: int) -> str:
    """One /metrics page as Pulsar 2.x/3.x writes it, with the exposition quirks real brokers emit:
    `_total` families typed gauge, a family's second group without its # TYPE, a label set ending
    in `,}`, label sets changing within a family, NaN/+Inf/-Inf, HELP/TYPE without samples, a
    label-less sample and samples without timestamps. Bytes are 200 per message."""
    ledger = topic.removeprefix("persistent://").replace("acme/ns1/", "acme/ns1/persistent/")
    common = 'cluster="c1",namespace="acme/ns1"'
    return "\n".join(
        [
            "# HELP pulsar_version_info -",
            "# TYPE pulsar_version_info gauge",
            f'pulsar_version_info{{cluster="c1",version="3.0.7",commit="3b5fd0a",}} 1.0 {ms}',
            "# TYPE jvm_memory_bytes_used gauge",
            'jvm_memory_bytes_used{cluster="c1",area="heap"} 2.5E8',
            "# TYPE pulsar_out_messages_total gauge",
            f'pulsar_out_messages_total{{{common},topic="{topic}"}} {msgs}.0 {ms}',
            f'pulsar_out_messages_total{{{common},topic="{topic}",subscription="{sub}"}} {msgs} {ms}',
            "# TYPE pulsar_out_bytes_total gauge",
            f'pulsar_out_bytes_total{{{common},topic="{topic}"}} {msgs * 200}.0 {ms}',
            "# HELP pulsar_unused_family nothing is reported under this name",
            "# TYPE pulsar_unused_family gauge",
            "# TYPE pulsar_broker_publish_latency summary",
            'pulsar_broker_publish_latency{cluster="c1",quantile="0.99"} NaN',
            'pulsar_broker_publish_latency_bucket{cluster="c1",le="+Inf"} -Inf',
            "process_start_time_seconds 1.7E9",
            # The same family again, for the subscription, without a # TYPE line.
            f'pulsar_out_bytes_total{{{common},topic="{topic}",subscription="{sub}"}} {msgs * 200} {ms}',
            "# TYPE brk_ml_cursor_nonContiguousDeletedMessagesRange gauge",
            f'brk_ml_cursor_nonContiguousDeletedMessagesRange{{cluster="c1",namespace="acme/ns1",ledger_name="{ledger}",cursor_name="{sub}"}} {ranges} {ms}',
            "",
        ]
    )


@pytest.mark.slow
def test_a_day_of_plain_scrapes_feeds_dispatch_and_ranges(spark, settings):
    folder = settings.landing / SCRAPE_DAY.isoformat() / "metrics"
    folder.mkdir(parents=True)
    for broker, (topic, sub, msgs, ranges) in SCRAPED.items():
        for i, (m, r) in enumerate(zip(msgs, ranges)):
            (folder / f"{broker}@{i}.prom").write_text(scrape_text(topic, sub, m, r, SCRAPE_MS + i * 60_000))
    landed = land_day(spark, SCRAPE_DAY, settings)
    assert landed.metrics["quarantined"] == 0
    # 10 samples a page, 4 pages, 2 brokers: the 6 of the families build reads land, the rest is counted.
    assert landed.metrics["metrics_rows"] == 2 * 4 * 6 and landed.metrics["metrics_samples_not_landed"] == 2 * 4 * 4
    build_silver(spark, SCRAPE_DAY, settings)

    intervals = rows(read_table("dispatch_intervals", settings=settings, spark=spark), "level", "topic", "subscription", "interval_start")
    assert {(r["grain"], r["source"], r["interval_seconds"]) for r in intervals} == {("scrape", "metrics-counters", 60.0)}
    got = [(r["level"], r["broker"], r["subscription"], r["interval_start"].minute, r["msgs"], r["bytes"], r["counter_reset"]) for r in intervals]
    assert got == [
        # broker-2's subscription: 5300-5000, 5900-5300, then the reset (40 after 5900: delta = 40).
        ("subscription", "broker-1:8080", "s1", 0, 600, 120000, False),
        ("subscription", "broker-1:8080", "s1", 1, 900, 180000, False),
        ("subscription", "broker-1:8080", "s1", 2, 100, 20000, False),
        ("subscription", "broker-2:8080", "s2", 0, 300, 60000, False),
        ("subscription", "broker-2:8080", "s2", 1, 600, 120000, False),
        ("subscription", "broker-2:8080", "s2", 2, 40, 8000, True),
        # Topic level: the same counters without the subscription label.
        ("topic", "broker-1:8080", None, 0, 600, 120000, False),
        ("topic", "broker-1:8080", None, 1, 900, 180000, False),
        ("topic", "broker-1:8080", None, 2, 100, 20000, False),
        ("topic", "broker-2:8080", None, 0, 300, 60000, False),
        ("topic", "broker-2:8080", None, 1, 600, 120000, False),
        ("topic", "broker-2:8080", None, 2, 40, 8000, True),
    ]
    snapshots = rows(read_table("cursor_snapshots", settings=settings, spark=spark), "topic", "snapshot_at")
    assert [(s["topic"], s["subscription"], s["broker"], s["ranges_reported"], s["ranges_source"]) for s in snapshots] == [
        (topic, sub, broker.replace("_", ":"), r, "metrics") for broker, (topic, sub, _, ranges) in SCRAPED.items() for r in ranges
    ]
    assert {s["namespace"] for s in snapshots} == {"acme/ns1"}


def test_each_cursor_pairs_with_the_nearest_stats_within_the_pairing_distance(spark):
    """Internal stats at 10:00:59.5, 10:05:00 and 10:09:00; topic stats 59.4 s after the first
    (the next minute: a pair across a minute's edge), 70 s after the second and at 10:08:00.5 and
    10:09:30 around the third. The first pairs; the second stands alone, and so does its stats
    snapshot; the third takes the nearer one (30 s), and the other (59.5 s) stands alone."""
    from dispatch_rows import frame

    from brokerlens.silver.cursors import cursor_snapshots

    def t(minute: int, seconds: float) -> datetime:
        return datetime(2026, 11, 21, 10, minute, int(seconds), int(round(seconds % 1 * 1e6)))

    common = {"day": DAY, "cluster": "c1", "broker": "b1", "topic": P0, "ingested_at": t(0, 0)}
    internal = frame(
        spark,
        "bronze_internal_stats",
        [
            common | {"collected_at": at_, "cursor": "s1", "total_non_contiguous_deleted_messages_range": n, "source_file": f"i{n}"}
            for n, at_ in enumerate([t(0, 59.5), t(5, 0), t(9, 0)])
        ],
    )
    stats = frame(
        spark,
        "bronze_topic_stats",
        [
            common | {"collected_at": at_, "subscription": "s1", "msg_backlog": b, "source_file": f"s{b}"}
            for b, at_ in [(10, t(1, 58.9)), (20, t(6, 10)), (30, t(8, 0.5)), (40, t(9, 30))]
        ],
    )
    metrics = empty_frame("bronze_metrics", spark)
    got = sorted((r["snapshot_at"], r["ranges_source"], r["ranges_reported"], r["msg_backlog"]) for r in cursor_snapshots(internal, stats, metrics).collect())
    assert got == [
        (t(0, 59.5), "internal-stats", 0, 10),
        (t(5, 0), "internal-stats", 1, None),
        (t(6, 10), "topic-stats", None, 20),
        (t(8, 0.5), "topic-stats", None, 30),
        (t(9, 0), "internal-stats", 2, 40),
    ]
