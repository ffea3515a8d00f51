"""`brokerlens land` on real-format fixtures: bronze rows, quarantine reasons, idempotence."""

from __future__ import annotations

import pytest

import json
import shutil
import time
from datetime import date

from landing_helpers import FIXTURES, install_fixtures, rows

from brokerlens.land import dispatch, metrics
from brokerlens.land.bronze import land_day, land_kind, survey_day
from brokerlens.land.settings import LandSettings
from brokerlens.platform.tables import read_table

DAY = date(2026, 11, 21)
BRONZE = ["bronze_topic_stats", "bronze_internal_stats", "bronze_dispatch", "bronze_producer_stats", "bronze_policies", "bronze_metrics"]

# Every deliberately bad record of the fixtures: (kind, file, line) -> reason.
EXPECTED_QUARANTINE = {
    ("dispatch", "dispatch/late.jsonl", 1): "malformed-json",
    ("dispatch", "dispatch/late.jsonl", 2): "missing-field",
    ("dispatch", "dispatch/late.jsonl", 3): "wrong-type",
    ("dispatch", "dispatch/late.jsonl", 4): "negative-counter",
    ("dispatch", "dispatch/late.jsonl", 5): "outside-day",
    ("dispatch", "dispatch/late.jsonl", 6): "unknown-enum",
    ("dispatch", "dispatch/late.jsonl", 8): "duplicate",
    ("internal-stats", "internal-stats/bad-cursors.json", None): ["missing-field", "wrong-type"],
    ("metrics", "metrics/broker-1.prom", 12): "negative-counter",
    ("metrics", "metrics/broker-1.prom", 13): "wrong-type",
    ("metrics", "metrics/broker-1.prom", 14): "malformed-line",
    ("metrics", "metrics/broker-1.prom", 15): "unknown-enum",
    ("metrics", "metrics/broker-1.prom", 16): "duplicate",
    ("metrics", "metrics/broker-1.prom", 17): "outside-day",
    ("metrics", "metrics/headerless.prom", None): "missing-field",
    ("policies", "policies/policies.jsonl", 5): "unknown-enum",
    ("policies", "policies/policies.jsonl", 6): "wrong-type",
    ("policies", "policies/policies.jsonl", 7): "outside-day",
    ("policies", "policies/policies.jsonl", 8): "missing-field",
    ("producer-stats", "producer-stats/orders-app.jsonl", 3): "unknown-enum",
    ("producer-stats", "producer-stats/orders-app.jsonl", 4): "missing-field",
    ("producer-stats", "producer-stats/orders-app.jsonl", 5): "negative-counter",
    ("topic-stats", "topic-stats/bad-malformed.json", None): "malformed-json",
    ("topic-stats", "topic-stats/bad-missing.json", None): "missing-field",
    ("topic-stats", "topic-stats/bad-outside.json", None): "outside-day",
    ("topic-stats", "topic-stats/bad-subs.json", None): ["negative-counter", "unknown-enum"],
    ("topic-stats", "topic-stats/bad-wrongtype.json", None): "wrong-type",
    ("topic-stats", "topic-stats/binary.json", None): "unreadable-file",
    # payments.retry.json holds an exact copy of payments.json's first envelope.
    ("topic-stats", "topic-stats/payments.retry.json", None): "duplicate",
}


def check_every_job_is_in_the_callers_group(sc, ungrouped_before: set[int]) -> None:
    """Land's jobs, those of its pool threads too, ran under the caller's job group."""
    deadline = time.monotonic() + 10  # the status tracker hears of jobs through the listener bus
    while True:
        grouped = sc.statusTracker().getJobIdsForGroup("land-under-test")
        ungrouped = set(sc.statusTracker().getJobIdsForGroup()) - ungrouped_before
        if (grouped and not ungrouped) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(grouped) > 6 and not ungrouped, (len(grouped), sorted(ungrouped))


@pytest.mark.slow
def test_land_fixture_day(spark, every_metric_family, settings):
    """One landing of the fixture day (landing is the slow part), every assertion on it."""
    install_fixtures(settings, "2026-11-21")
    # Under a job group: every job of the stage's threads is in it (in_parallel hands the
    # caller's down, as it hands a Spark Connect client's tags, by which a killed task interrupts them).
    sc = spark.sparkContext
    ungrouped_before = set(sc.statusTracker().getJobIdsForGroup())
    sc.setJobGroup("land-under-test", "land")
    try:
        landed = land_day(spark, DAY, settings)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    check_every_job_is_in_the_callers_group(sc, ungrouped_before)
    check_quarantine_reasons_for_every_bad_record(spark, landed, settings)
    check_dispatch_rows_keep_real_line_numbers(spark, settings)
    check_stats_rows_per_partition_and_subscription(spark, settings)
    check_internal_stats_seed_004_cursor(spark, settings)
    check_policies_producers_and_metrics(spark, settings)
    check_landing_twice_gives_identical_tables(spark, settings)
    check_a_kind_without_files_empties_its_partition(spark, settings)


def check_quarantine_reasons_for_every_bad_record(spark, landed, settings):
    got: dict = {}
    for r in read_table("quarantine", settings=settings, spark=spark).collect():
        assert (r["day"], r["stage"]) == (DAY, "land")
        key = (r["kind"], r["source_file"].removeprefix("2026-11-21/"), r["line"])
        got.setdefault(key, []).append(r["reason"])
    expected = {k: sorted(v if isinstance(v, list) else [v]) for k, v in EXPECTED_QUARANTINE.items()}
    assert {k: sorted(v) for k, v in got.items()} == expected
    # The run summary counts per kind and reason.
    assert landed.metrics["quarantined"] == sum(len(v) for v in expected.values())
    assert "quarantined dispatch: malformed-json 1" in landed.lines
    assert "quarantined topic-stats: unreadable-file 1" in landed.lines


def check_dispatch_rows_keep_real_line_numbers(spark, settings):
    lines = (FIXTURES / "2026-11-21/dispatch/broker-1.jsonl").read_text().splitlines()
    got = rows(read_table("bronze_dispatch", settings=settings, spark=spark), "source_file", "line")
    assert [(r["source_file"], r["line"]) for r in got] == [("2026-11-21/dispatch/broker-1.jsonl", i + 1) for i in range(len(lines))]
    for r, text in zip(got, lines):
        record = json.loads(text)
        assert (r["level"], r["msgs"], r["bytes"], r["entries"], r["redelivered_msgs"]) == (
            record["level"],
            record["msgs"],
            record["bytes"],
            record["entries"],
            record["redelivered_msgs"],
        )
        assert r["topic"] == record.get("topic") and r["subscription"] == record.get("subscription")


def check_stats_rows_per_partition_and_subscription(spark, settings):
    stats = rows(read_table("bronze_topic_stats", settings=settings, spark=spark), "topic", "collected_at", "subscription")
    orders = [r for r in stats if r["partitioned_topic"] == "persistent://acme/ns1/orders"]
    # Three partitioned snapshots of two partitions with one subscription each.
    assert len(orders) == 6
    for r in orders:
        envelope = json.loads((FIXTURES / r["source_file"]).read_text())
        part = envelope["stats"]["partitions"][r["topic"]]
        sub = part["subscriptions"]["s1"]
        assert (r["subscription_type"], r["msg_out_counter"], r["topic_msg_out_counter"]) == (sub["type"], sub["msgOutCounter"], part["msgOutCounter"])
        assert r["non_contiguous_deleted_messages_ranges_serialized_size"] == sub["nonContiguousDeletedMessagesRangesSerializedSize"]
        assert r["consumers"] == len(sub["consumers"]) and r["publishers"] == len(part["publishers"])
        assert json.loads(r["subscription_json"])["msgBacklog"] == sub["msgBacklog"]
        # PIP-406 counters (Pulsar 4.0+) where the snapshot has them, null where it does not.
        assert (r["dispatch_throttled_msg_events_by_subscription_limit"], r["dispatch_throttled_bytes_events_by_broker_limit"]) == (
            sub.get("dispatchThrottledMsgEventsBySubscriptionLimit"),
            sub.get("dispatchThrottledBytesEventsByBrokerLimit"),
        )
    throttled = [r["dispatch_throttled_msg_events_by_subscription_limit"] for r in orders if r["topic"].endswith("-0")]
    assert throttled == [None, 3, 7]
    payments = [r for r in stats if r["topic"] == "persistent://acme/ns1/payments"]
    assert [r["msg_out_counter"] for r in payments] == [300, 420]  # the copy landed once
    idle = [r for r in stats if r["topic"].endswith("/idle")]
    assert len(idle) == 1 and idle[0]["subscription"] is None


def check_internal_stats_seed_004_cursor(spark, settings):
    cursor = [
        r
        for r in rows(read_table("bronze_internal_stats", settings=settings, spark=spark), "topic")
        if r["topic"] == "persistent://acme/ns1/orders-partition-0"
    ]
    assert len(cursor) == 1
    c = cursor[0]
    assert (c["cursor"], c["mark_delete_position"], c["individually_deleted_messages"]) == ("s1", "1:2", "[(1:4..1:6], (1:7..1:8]]")
    assert c["total_non_contiguous_deleted_messages_range"] == 2
    assert c["ledger_entries"] == {1: 10, 2: 0} and c["current_ledger_id"] == 2 and c["current_ledger_entries"] == 7


def check_policies_producers_and_metrics(spark, settings):
    policies = {r["line"]: r for r in rows(read_table("bronze_policies", settings=settings, spark=spark), "line")}
    assert set(policies) == {1, 2, 3, 4}
    assert policies[2]["dispatch_throttling_rate_in_msg"] == 5 and policies[2]["rate_period_in_second"] == 2
    assert policies[3]["removed"] and policies[3]["namespace"] == "acme/ns1"
    assert policies[4]["broker_config"] == {"dispatchThrottlingRatePerSubscriptionInMsg": "40", "dispatchThrottlingOnBatchMessageEnabled": "true"}
    producers = rows(read_table("bronze_producer_stats", settings=settings, spark=spark), "line")
    assert [p["num_msgs_sent"] for p in producers] == [12000, 11000]
    assert producers[0]["partition_send_msgs_rate"] == {"persistent://acme/ns1/orders-partition-0": 120.0, "persistent://acme/ns1/orders-partition-1": 80.0}
    assert producers[0]["config"]["compressionType"] == "LZ4"
    metrics = {r["line"]: r for r in rows(read_table("bronze_metrics", settings=settings, spark=spark), "line")}
    assert set(metrics) == {4, 5, 7, 9, 10, 11}
    assert metrics[4]["metric_type"] == "counter" and metrics[4]["value"] == 1000.0
    assert metrics[4]["sample_timestamp"].isoformat().startswith("2026-11-21T10:00:00")
    assert metrics[9]["metric_type"] == "histogram" and metrics[9]["labels"]["le"] == "+Inf"
    assert metrics[11]["labels"]["note"] == 'a "quoted" value, with comma' and metrics[11]["value"] == 1.5e7
    assert metrics[7]["labels"]["subscription"] == "s1"


def check_landing_twice_gives_identical_tables(spark, settings):
    before = {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in [*BRONZE, "quarantine"]}
    land_day(spark, DAY, settings)
    after = {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in [*BRONZE, "quarantine"]}
    assert before == after


def check_a_kind_without_files_empties_its_partition(spark, settings):
    """The day landed again after its dispatch files went: no dispatch rows or quarantine rows
    are left of them, and every other table is as it was."""
    tables = [*BRONZE, "quarantine"]
    before = {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in tables}
    shutil.rmtree(settings.landing / "2026-11-21" / "dispatch")
    landed = land_day(spark, DAY, settings)
    after = {t: rows(read_table(t, settings=settings, spark=spark), *read_table(t, settings=settings, spark=spark).columns) for t in tables}
    assert before["bronze_dispatch"] and after["bronze_dispatch"] == []
    assert after["quarantine"] == [r for r in before["quarantine"] if r["kind"] != "dispatch"] != before["quarantine"]
    assert {t: after[t] for t in BRONZE if t != "bronze_dispatch"} == {t: before[t] for t in BRONZE if t != "bronze_dispatch"}
    assert "dispatch: 0 files seen, 0 read, 0 rows, 0 quarantined" in landed.lines


@pytest.mark.slow
def test_line_numbers_across_file_blocks(spark, settings):
    """A file split into many Spark blocks still gets its real line numbers."""
    folder = settings.landing / "2026-11-21" / "dispatch"
    folder.mkdir(parents=True)
    record = {"period_start": "2026-11-21T10:00:00Z", "period_seconds": 1, "level": "broker", "cluster": "c1", "broker": "b:8080", "msgs": 1, "bytes": 1}
    lines = [json.dumps(record | {"period_start": f"2026-11-21T10:{i // 60:02d}:{i % 60:02d}Z", "msgs": i}) for i in range(3000)]
    lines[1499] = "{broken"
    (folder / "big.jsonl").write_text("\n".join(lines) + "\n")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16384")
    try:
        good, bad, parsed, _ = land_kind(spark, dispatch, DAY, settings)
        assert [(r["line"], r["reason"]) for r in bad.collect()] == [(1500, "malformed-json")]
        got = good.select("line", "msgs").collect()
        parsed.unpersist()
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert sorted((r["line"], r["msgs"]) for r in got) == [(i + 1, i) for i in range(3000) if i != 1499]


def test_every_table_is_read_or_says_why_it_is_kept():
    """`brokerlens tables` lists no table that nothing reads: each is read by a stage (its name
    passed to a reading function) or its description says why it is kept."""
    import re
    from pathlib import Path

    from brokerlens.platform.schemas import table_schemas

    package = Path(__file__).resolve().parents[1] / "spark" / "brokerlens"
    source = "\n".join(p.read_text() for p in package.rglob("*.py"))
    unread = [
        name
        for name, schema in table_schemas().items()
        if not re.search(r'(read_table|bronze|day_rows)\((spark,\s*)?"%s"' % name, source) and "Kept for" not in schema.description
    ]
    assert unread == []


@pytest.mark.slow
def test_metrics_land_the_analytics_families_and_count_the_rest(spark, settings):
    """By default only the /metrics families build reads land; the others are counted, not
    checked; a line that is no sample is quarantined whatever it holds; land.metric_families
    adds families by pattern (the fixture day's broker-1.prom and headerless.prom)."""
    install_fixtures(settings, "2026-11-21")
    files = survey_day(DAY, settings)["metrics"]

    def landed(land: LandSettings) -> tuple[dict, dict, int]:
        good, bad, parsed, not_landed = land_kind(spark, metrics, DAY, settings.model_copy(update={"land": land}), files)
        try:
            rows = {(r["source_file"].removeprefix("2026-11-21/metrics/"), r["line"]): r["metric"] for r in good.collect()}
            reasons = {(r["source_file"].removeprefix("2026-11-21/metrics/"), r["line"]): r["reason"] for r in bad.collect()}
        finally:
            parsed.unpersist()
        return rows, reasons, not_landed

    rows, reasons, not_landed = landed(LandSettings())
    assert rows == {("broker-1.prom", 4): "pulsar_out_messages_total", ("broker-1.prom", 5): "pulsar_out_messages_total"}
    # Lines 13 (a value that is no number) and 17 (outside the day) are samples of another
    # family, and headerless.prom's only sample (`up 1`, no cluster) too: counted, not judged.
    assert reasons == {
        ("broker-1.prom", 12): "negative-counter",
        ("broker-1.prom", 14): "malformed-line",
        ("broker-1.prom", 15): "unknown-enum",
        ("broker-1.prom", 16): "duplicate",
    }
    assert not_landed == 7  # lines 7, 9, 10, 11, 13, 17 and `up 1`

    rows, reasons, not_landed = landed(LandSettings(metric_families=["pulsar_subscription_*"]))
    assert set(rows) == {("broker-1.prom", 4), ("broker-1.prom", 5), ("broker-1.prom", 7)}
    assert reasons[("broker-1.prom", 13)] == "wrong-type" and reasons[("broker-1.prom", 17)] == "outside-day"
    assert not_landed == 4  # pulsar_storage_write_latency_bucket and _sum, jvm_memory_direct_bytes_used, up


def test_metric_family_patterns_must_not_be_empty():
    with pytest.raises(ValueError, match="empty pattern"):
        LandSettings(metric_families=[" "])


@pytest.mark.slow
def test_envelope_copies_are_looked_for_in_the_parsed_rows_and_judged_exactly(spark, settings):
    """Envelopes are parsed without the duplicate check; only when two parsed envelopes hold the
    same text (has_copies) is the kind parsed again with it: the copy is then quarantined as
    mark_duplicates judges it, within a file and across files. A file that is no JSON has no
    envelope text and is never a copy."""
    from brokerlens.land import topic_stats
    from brokerlens.land.envelope import has_copies
    from brokerlens.land.files import read_whole

    def envelope(topic: str) -> dict:
        subscription = {"msgOutCounter": 5, "type": "Shared"}
        return {"collected_at": "2026-11-21T10:00:00Z", "cluster": "c1", "broker": "b1:8080", "topic": topic, "stats": {"subscriptions": {"s": subscription}}}

    folder = settings.landing / DAY.isoformat() / "topic-stats"
    folder.mkdir(parents=True)
    a, b = envelope("persistent://t/n/a"), envelope("persistent://t/n/b")
    (folder / "first.json").write_text(json.dumps([a, b]))
    (folder / "broken.json").write_text("{not json")
    (folder / "other.json").write_text(json.dumps([envelope("persistent://t/n/c")]))
    (folder / "broken-too.json").write_text("[1,")

    def copies() -> bool:
        parsed = topic_stats.parse(read_whole(spark, survey_day(DAY, settings)["topic-stats"].read), DAY, duplicates=False)
        return has_copies(parsed)

    def quarantined() -> list[tuple[str, str, str]]:
        landed = land_kind(spark, topic_stats, DAY, settings)
        try:
            return sorted((r["source_file"].removeprefix(f"{DAY}/topic-stats/"), r["reason"], r["detail"]) for r in landed.bad.collect())
        finally:
            landed.parsed.unpersist()

    assert not copies()
    assert [q[:2] for q in quarantined()] == [("broken-too.json", "malformed-json"), ("broken.json", "malformed-json")]
    (folder / "later.json").write_text(json.dumps([b, b]))  # a copy across files, then within one
    assert copies()
    assert [q for q in quarantined() if q[1] == "duplicate"] == [
        ("later.json", "duplicate", f"{where}exact copy of {DAY}/topic-stats/first.json:2") for where in ("", "record 2: ")
    ]
