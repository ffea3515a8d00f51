"""Real Pulsar outputs (tests/fixtures/real/, see SOURCES.md) land as they are: the numbers an
operator reads off each file by eye come out of the bronze tables, nothing valid is quarantined,
and a truly malformed record still is, with its reason."""

from __future__ import annotations

import os
import shutil
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from landing_helpers import rows
from pyspark.sql import functions as F

from brokerlens.gold.holes.ranges import with_range_stats
from brokerlens.land.bronze import land_day
from brokerlens.platform.tables import read_table
from brokerlens.platform.frames import rows_frame

REAL = Path(__file__).parent / "fixtures" / "real"
DAY = date(2020, 3, 9)  # the day the Pulsar 2.5.0 /metrics dumps were taken
AT = "2020-03-09T17:25:00Z"

# fixture -> (landing kind, topic of the envelope)
STATS = {
    "v2-internal-stats-old-ranges.json": ("internal-stats", "persistent://test-tenant/ns1/tp1"),
    "v2-internal-stats-non-persistent.json": ("internal-stats", "non-persistent://public/default/np"),
    "v4.1-internal-stats.json": ("internal-stats", "persistent://public/default/pt-zgc-partition-1"),
    "v2-topic-stats-type-null.json": ("topic-stats", "persistent://my-tenant/my-namespace/my-topic"),
    "v2.7-topic-stats-chucked.json": ("topic-stats", "persistent://public/default/test"),
    "v4.1-topic-stats.json": ("topic-stats", "persistent://public/default/pt-zgc-partition-1"),
    "v4.0.7-topic-stats-type-none.json": ("topic-stats", "persistent://public/default/unloaded"),
    "v2-partitioned-stats-no-partitions.json": ("topic-stats", "persistent://public/default/parted"),
}
# Scrape files are named after the broker they came from (<host>_<port>[@<anything>].prom).
SCRAPES = {
    "standalone-v2.5.0-topics.prom": "standalone_8080@1.prom",
    "standalone-v2.5.0-topics-2.prom": "standalone_8080@2.prom",
    "standalone-v2.5.0-namespaces.prom": "standalone_8081.prom",
}


def install(settings) -> Path:
    root = settings.landing / DAY.isoformat()
    for name, (kind, topic) in STATS.items():
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        # Pulsar's output goes into the envelope verbatim, as text.
        envelope = f'{{"collected_at": "{AT}", "cluster": "standalone", "broker": "standalone:8080", "topic": "{topic}", "stats": {(REAL / name).read_text()}}}'
        (folder / name).write_text(envelope)
    (root / "metrics").mkdir()
    for name, target in SCRAPES.items():
        shutil.copyfile(REAL / name, root / "metrics" / target)
    (root / "policies").mkdir()
    shutil.copyfile(REAL / "policies-variants.jsonl", root / "policies" / "variants.jsonl")
    # Files saved by hand carry no header; those without sample timestamps are dated by the file.
    stamp = datetime(2020, 3, 9, 18, 0, tzinfo=timezone.utc).timestamp()
    for path in root.rglob("*.*"):
        os.utime(path, (stamp, stamp))
    return root


@pytest.mark.slow
def test_real_outputs_land(spark, every_metric_family, settings):
    install(settings)
    landed = land_day(spark, DAY, settings)

    # Only the one deliberately bad record (a policy text line that is no config) is quarantined.
    quarantine = rows(read_table("quarantine", settings=settings, spark=spark), "source_file", "line")
    assert [(q["source_file"], q["line"], q["reason"]) for q in quarantine] == [("2020-03-09/policies/variants.jsonl", 5, "wrong-type")]
    assert "not a config line" in quarantine[0]["detail"]
    assert landed.metrics["quarantined"] == 1

    check_internal_stats(spark, settings)
    check_topic_stats(spark, settings)
    check_metrics(spark, settings)
    check_policies(spark, settings)


def check_internal_stats(spark, settings):
    cursors = {(r["topic"], r["cursor"]): r for r in read_table("bronze_internal_stats", settings=settings, spark=spark).collect()}
    old = cursors[("persistent://test-tenant/ns1/tp1", "my-subscription")]
    assert (old["mark_delete_position"], old["read_position"], old["messages_consumed_counter"]) == ("324711539:3133", "324711539:3233", 20449501)
    # Pulsar 4.1 after a seek: entry -1 and a negative consumed counter are real values.
    seek = cursors[("persistent://public/default/pt-zgc-partition-1", "test_subscription")]
    assert (seek["mark_delete_position"], seek["read_position"], seek["messages_consumed_counter"]) == ("94:-1", "94:0", -1)
    assert seek["ledger_entries"] == {94: 10, 146: 0} and seek["current_ledger_id"] == 146
    assert cursors[("persistent://public/default/pt-zgc-partition-1", "taosx-test")]["mark_delete_position"] == "94:3"
    # A non-persistent topic has cursors without positions: landed, no holes to count.
    np = cursors[("non-persistent://public/default/np", "np-sub")]
    assert np["mark_delete_position"] is None and np["entries_added_counter"] == 120

    # The old `‥` separator with a trailing ", ]": two ranges, (3134..3136] + (3137..3140] = 2 + 3 entries.
    snap = rows_frame(
        spark,
        [("standalone", old["topic"], old["cursor"], datetime(2020, 3, 9, 17, 25), 10000, old["individually_deleted_messages"])],
        "cluster string, topic string, subscription string, snapshot_at timestamp, cap int, individually_deleted_messages string",
    ).withColumn("ledger_entries", F.create_map().cast("map<bigint,bigint>"))
    stats = with_range_stats(snap).first()
    assert stats["outline_ok"]
    assert (stats["ranges_parsed"], stats["bad_ranges"], stats["acked_entries"]) == (2, 0, 5)


def check_topic_stats(spark, settings):
    subs = {(r["topic"], r["subscription"]): r for r in read_table("bronze_topic_stats", settings=settings, spark=spark).collect()}
    doc = subs[("persistent://my-tenant/my-namespace/my-topic", "my-topic_subscription")]
    assert (doc["msg_backlog"], doc["subscription_type"], doc["publishers"], doc["consumers"]) == (116632, None, 1, 0)
    v27 = subs[("persistent://public/default/test", "pulsar-elasticsearch-sync-rs")]
    assert (v27["msg_out_counter"], v27["bytes_out_counter"], v27["subscription_type"], v27["consumers"]) == (1000, 69616, "Shared", 1)
    assert (v27["topic_msg_in_counter"], v27["topic_bytes_in_counter"]) == (1040, 120336)
    v41 = subs[("persistent://public/default/pt-zgc-partition-1", "test_subscription")]
    assert (v41["msg_out_counter"], v41["bytes_out_counter"], v41["subscription_type"], v41["msg_backlog"]) == (60, 7560, "Failover", 1)
    assert (v41["topic_msg_out_counter"], v41["topic_bytes_out_counter"], v41["partitioned_topic"]) == (69, 8694, "persistent://public/default/pt-zgc")
    # A subscription without a dispatcher says "type": "None" (4.0.7 after an unload): no type, landed.
    unloaded = subs[("persistent://public/default/unloaded", "holes")]
    assert (unloaded["subscription_type"], unloaded["msg_backlog"], unloaded["msg_out_counter"], unloaded["consumers"]) == (None, 16, 0, 0)
    # partitioned-stats with an empty `partitions` and no `metadata`: one row for the topic;
    # numbers in scientific notation (8.0E2 = 800, 2.4E4 = 24000, 4.0E2 = 400).
    parted = subs[("persistent://public/default/parted", "sub-a")]
    assert (parted["msg_out_counter"], parted["bytes_out_counter"], parted["msg_backlog"], parted["topic_msg_in_counter"]) == (800, 24000, 400, 1200)
    assert parted["msg_rate_out"] == 1.0e-4 and parted["subscription_type"] == "Key_Shared" and parted["consumers"] == 1


def check_metrics(spark, settings):
    metrics = read_table("bronze_metrics", settings=settings, spark=spark)
    assert metrics.select("cluster").distinct().collect()[0]["cluster"] == "standalone"
    by_file = {r["source_file"]: r["n"] for r in metrics.groupBy("source_file").agg(F.count("*").alias("n")).collect()}
    # Every sample line of each dump landed (the files' non-comment lines, counted here).
    for name, target in SCRAPES.items():
        samples = [line for line in (REAL / name).read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert by_file[f"2020-03-09/metrics/{target}"] == len(samples), name
    dev1 = (
        metrics.where((F.col("metric") == "pulsar_subscription_msg_rate_out") & (F.col("labels")["subscription"] == "dev-dev-1-sub-2"))
        .orderBy("collected_at")
        .collect()
    )
    first = dev1[0]
    assert (first["value"], first["broker"], first["metric_type"]) == (25.013, "standalone:8080", "gauge")
    # 1583774714170 ms = 2020-03-09T17:25:14.170Z
    assert first["collected_at"] == datetime(2020, 3, 9, 17, 25, 14, 170000)
    # A second appearance of a family carries no # TYPE line: still typed by the first.
    rate_out = metrics.where((F.col("metric") == "pulsar_rate_out") & (F.col("source_file").endswith("@2.prom")))
    assert {r["metric_type"] for r in rate_out.collect()} == {"gauge"}
    # A sample without a timestamp takes the file's latest sample time (1583774714171 ms).
    latency = metrics.where((F.col("metric") == "pulsar_broker_publish_latency") & F.col("source_file").endswith("@1.prom")).first()
    assert latency["sample_timestamp"] is None and latency["collected_at"] == datetime(2020, 3, 9, 17, 25, 14, 171000)
    nan = metrics.where(F.col("metric") == "zk_write_latency").first()
    assert nan["value"] != nan["value"]  # NaN


def check_policies(spark, settings):
    policies = {r["line"]: r for r in read_table("bronze_policies", settings=settings, spark=spark).collect()}
    assert set(policies) == {1, 2, 3, 4}
    # Pulsar 1.x DispatchRate names; effective_at with an offset (10:00+01:00 = 09:00Z).
    assert (policies[1]["dispatch_throttling_rate_in_msg"], policies[1]["dispatch_throttling_rate_in_byte"]) == (1000, 1048576)
    assert policies[1]["effective_at"] == datetime(2020, 3, 9, 9, 0)
    assert policies[2]["broker_config"]["dispatchThrottlingRatePerSubscriptionInMsg"] == "200"
    assert policies[2]["effective_at"] == datetime(2020, 3, 9, 9, 0, 0, 500000)
    # `name value` and `name:value` lines as pulsar-admin prints them.
    assert policies[3]["broker_config"] == {"dispatchThrottlingRatePerTopicInMsg": "500", "dispatchThrottlingOnBatchMessageEnabled": "true"}
    assert policies[3]["effective_at"] == datetime(2020, 3, 9, 9, 1, 0, 123456)  # nanoseconds cut to micros
    assert policies[4]["broker_config"] == {"dispatchThrottlingRateInMsg": "3000", "ratePeriodInSecond": "2"}
    assert policies[4]["effective_at"] == datetime(2020, 3, 9, 9, 2, 0, 120000)  # 2-digit fraction
