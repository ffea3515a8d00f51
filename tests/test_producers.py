"""Producer lint and health (seed 003) and publish-rate conformance (seed 001)."""

from __future__ import annotations

import pytest

import json
from datetime import date, datetime, timedelta

from brokerlens.gold.producers.build import build_producers
from brokerlens.gold.producers.config import configurations, with_config_hash
from brokerlens.gold.producers.health import broker_view, health
from brokerlens.gold.producers.lint import lint
from brokerlens.platform.schemas import table_schema
from brokerlens.gold.producers.settings import ProducerSettings, PublishRateLimit
from brokerlens.platform.frames import rows_frame

DAY = date(2026, 11, 21)
T0 = datetime(2026, 11, 21, 10, 0, 0)
TOPIC = "persistent://shop/orders/created"

# A configuration that follows seed 003: 8 partitions, 1,000 pending per partition, batches of
# half that, across-partitions = 1,000 x 8, 64 MiB of memory for 1,000 x 8 x 1 KB.
GOOD = dict(
    partitions=8,
    batching_enabled=True,
    batching_max_messages=500,
    batching_max_bytes=131072,
    batching_max_publish_delay_micros=1000,
    batching_partition_switch_frequency=1,
    max_pending_messages=1000,
    max_pending_messages_across_partitions=8000,
    memory_limit_bytes=64 * 1024 * 1024,
    block_if_queue_full=True,
    send_timeout_ms=30000,
    compression_type="LZ4",
    message_routing_mode="RoundRobinPartition",
)


def snapshot(minute=0, producer="app-1", **fields):
    row = {c: None for c in table_schema("producer_snapshots").column_names}
    row.update(
        day=DAY,
        snapshot_at=T0 + timedelta(minutes=minute),
        cluster="c1",
        topic=TOPIC,
        producer_name=producer,
        num_msgs_sent=60000,
        num_bytes_sent=30_000_000,
        uncompressed_bytes_sent=60_000_000,
        num_send_failed=0,
        num_acks_received=60000,
        source_file="producer-stats/a.jsonl",
        **GOOD,
    )
    row.update(fields)
    return row


def frame(spark, table, rows):
    schema = table_schema(table)
    return rows_frame(spark, [tuple(r[c] for c in schema.column_names) for r in rows], schema.struct)


def lint_rows(spark, *rows):
    snaps = frame(spark, "producer_snapshots", rows).transform(with_config_hash)
    return lint(configurations(snaps)).collect()


def by_rule(rows):
    return {r.rule: r for r in rows}


def test_good_configurations_have_no_findings(spark):
    rows = [
        snapshot(0),
        snapshot(1, producer="app-2", partitions=0, max_pending_messages_across_partitions=None),
        # SinglePartition does not switch partitions: the switch frequency does not matter.
        snapshot(2, producer="app-3", message_routing_mode="SinglePartition", batching_partition_switch_frequency=10),
        # Failing fast is fine when nothing failed.
        snapshot(3, producer="app-4", block_if_queue_full=False),
        # Batching off: the batching rules do not apply.
        snapshot(4, producer="app-5", batching_enabled=False, batching_max_messages=5000, batching_partition_switch_frequency=10),
    ]
    assert lint_rows(spark, *rows) == []


def test_seed_example_batch_never_fills(spark):
    # Seed 003: maxPendingMessages 500 with batchingMaxMessages 1000 -> a batch never fills by count.
    found = by_rule(lint_rows(spark, snapshot(max_pending_messages=500, max_pending_messages_across_partitions=4000, batching_max_messages=1000)))
    rule = found["batch-never-fills-by-count"]
    assert (rule.severity, rule.setting, rule.configured, rule.bound) == ("error", "batchingMaxMessages", "1000", 500)
    assert rule.suggested == str(500 // 2)
    assert "batch-above-half-pending" not in found  # the stronger finding only


def test_each_rule_with_its_numbers(spark):
    rows = [
        snapshot(producer="half", batching_max_messages=600),
        snapshot(producer="across", max_pending_messages_across_partitions=4000, batching_max_messages=200),
        snapshot(producer="memory", memory_limit_bytes=2_000_000),
        snapshot(producer="bytes", batching_max_bytes=2 * 1024 * 1024),
        snapshot(producer="switch", batching_partition_switch_frequency=None),
        snapshot(producer="fails", block_if_queue_full=False, num_send_failed=7, send_failed_queue_full=5, send_failed_memory_full=2, send_failed_timeout=0),
    ]
    found = {(r.producer_name, r.rule): r for r in lint_rows(spark, *rows)}
    assert set(found) == {
        ("half", "batch-above-half-pending"),
        ("across", "pending-capped-across-partitions"),
        ("memory", "memory-limit-below-pending"),
        ("memory", "batch-bytes-above-bound"),
        ("bytes", "batch-bytes-above-bound"),
        ("switch", "partition-switch-frequency"),
        ("fails", "queue-full-fails-fast"),
    }
    half = found[("half", "batch-above-half-pending")]
    assert (half.configured, half.bound, half.suggested) == ("600", 1000 / 2, "500")
    across = found[("across", "pending-capped-across-partitions")]
    assert (across.bound, across.suggested, across.effective_max_pending_messages) == (4000 // 8, str(1000 * 8), 500)
    # 1 KB per message uncompressed (60 MB / 60,000 messages): 1,000 pending x 8 partitions x 1,000 B.
    memory = found[("memory", "memory-limit-below-pending")]
    assert memory.avg_msg_bytes == 60_000_000 / 60000
    assert (memory.bound, memory.suggested) == (1000 * 8 * 1000.0, str(1000 * 8 * 1000))
    assert found[("memory", "batch-bytes-above-bound")].bound == min(2_000_000 // 8 // 2, 1048576)
    assert found[("bytes", "batch-bytes-above-bound")].bound == 1048576
    switch = found[("switch", "partition-switch-frequency")]
    assert (switch.configured, switch.suggested) == ("10", "1")  # Pulsar's default is 10
    fails = found[("fails", "queue-full-fails-fast")]
    assert fails.send_failed == 7 and "5 ProducerQueueIsFullError" in fails.message


def test_configuration_change_is_linted_separately(spark):
    rows = [snapshot(0), snapshot(1), snapshot(2, batching_max_messages=1500)]
    (row,) = lint_rows(spark, *rows)
    assert row.rule == "batch-never-fills-by-count" and row.snapshots == 1
    assert row.first_seen == row.last_seen == T0 + timedelta(minutes=2)


def seed_template(message_bytes: int, partitions: int, max_pending: int) -> dict:
    """Seed 003, section 3.2.3, literally (its memoryLimit is in MB in the batchingMaxBytes line)."""
    max_pending = min(max(max_pending, 1000), 2000)  # "generally between 1000 and 2000"
    memory_limit = max_pending * partitions * message_bytes
    memory_limit_mb = memory_limit / 1024 / 1024
    return {
        "template_max_pending_messages": max_pending,
        "template_max_pending_messages_across_partitions": max_pending * partitions,
        "template_memory_limit_bytes": memory_limit,
        "template_batching_max_messages": max_pending // 2,
        "template_batching_max_bytes": int(min(memory_limit_mb * 1024 * 1024 // partitions // 2, 1048576)),
        "template_batching_partition_switch_frequency": 1,
    }


TEMPLATE_CASES = [(2048, 8, 500), (4096, 8, 1000), (300, 3, 1500), (1000, 1, 3000), (512, 16, 0)]


def test_seed_template(spark):
    rows = [
        snapshot(producer=str(case), partitions=partitions, max_pending_messages=max_pending, num_msgs_sent=1000, uncompressed_bytes_sent=1000 * message_bytes)
        for case, (message_bytes, partitions, max_pending) in enumerate(TEMPLATE_CASES)
    ]
    snaps = frame(spark, "producer_snapshots", rows).transform(with_config_hash)
    got = {int(r.producer_name): r for r in configurations(snaps).collect()}
    for case, args in enumerate(TEMPLATE_CASES):
        expected = seed_template(*args)
        assert {k: got[case][k] for k in expected} == expected, args


def test_health_numbers(spark):
    rates = lambda *r: {f"{TOPIC}-partition-{i}": v for i, v in enumerate(r)}  # noqa: E731
    rows = [
        snapshot(
            0,
            partitions=4,
            num_batches_sent=120,
            pending_queue_size=3900,
            send_latency_ms_p50=2.0,
            num_acks_received=1000,
            send_latency_ms_p99=9.0,
            send_latency_ms_max=30.0,
            partition_msg_rates=rates(10.0, 10.0, 20.0, 0.0),
            num_send_failed=4,
            send_failed_queue_full=3,
            send_failed_memory_full=0,
            send_failed_timeout=0,
        ),
        snapshot(
            1,
            partitions=4,
            num_batches_sent=None,
            pending_queue_size=100,
            send_latency_ms_p50=4.0,
            num_acks_received=3000,
            send_latency_ms_p99=12.0,
            send_latency_ms_max=25.0,
            partition_msg_rates=rates(10.0, 10.0, 20.0),
            num_send_failed=2,
            uncompressed_bytes_sent=None,
        ),
    ]
    snaps = frame(spark, "producer_snapshots", rows).transform(with_config_hash)
    brokers = broker_view(frame(spark, "bronze_topic_stats", []))
    findings = lint(configurations(snaps))
    (h,) = health(snaps, findings, brokers, ProducerSettings()).collect()
    assert (h.snapshots, h.configurations, h.partitions) == (2, 1, 4)
    assert h.msgs_per_batch == 60000 / 120 and h.batch_fill_ratio == 60000 / 120 / 500
    # Limit: 1,000 per partition x 4 partitions (stats sum the partitions); 90 % of 4,000 = 3,600.
    assert h.effective_max_pending_messages == 1000 and h.pending_saturation_share == 0.5
    assert (h.send_failed, h.send_failed_queue_full, h.send_failed_other) == (6, 3, 4 - 3)
    assert h.send_latency_ms_p50_avg == (2.0 * 1000 + 4.0 * 3000) / 4000
    assert (h.send_latency_ms_p99_max, h.send_latency_ms_max) == (12.0, 30.0)
    assert h.compression_ratio == 60_000_000 / 30_000_000
    # Day sums per partition 20, 20, 40, 0: max 40 over mean 80 / 4.
    assert h.partition_skew == 40 / (80 / 4)
    assert h.broker_msg_rate_in is None and h.lint_findings == 0


def topic_stats_row(minute, partition, publishers):
    row = {c: None for c in table_schema("bronze_topic_stats").column_names}
    row.update(
        day=DAY,
        collected_at=T0 + timedelta(minutes=minute),
        cluster="c1",
        topic=f"{TOPIC}-partition-{partition}",
        partitioned_topic=TOPIC,
        publishers_json=json.dumps(publishers),
        source_file="topic-stats/x.json",
        ingested_at=T0,
    )
    return row


@pytest.mark.slow
def test_build_producers_writes_the_tables(spark, settings):
    from brokerlens.platform.tables import read_table, write_table

    settings.producers.publish_rate_limits = [
        PublishRateLimit(scope="shop/orders", msgs="100,10s"),
        PublishRateLimit(scope=TOPIC, bytes="100KB,10s"),
    ]
    rows = [
        *(snapshot(m, partitions=0, num_msgs_sent=n, num_bytes_sent=n * 500, uncompressed_bytes_sent=n * 1000) for m, n in ((0, 1000), (1, 0), (2, 600))),
        snapshot(0, producer="bad", max_pending_messages=500, batching_max_messages=1000),
    ]
    write_table(frame(spark, "producer_snapshots", rows), "producer_snapshots", mode="replace", partitions=[{"day": DAY}], settings=settings)
    stats = [
        topic_stats_row(
            m,
            p,
            [
                {"producerName": "app-1", "msgRateIn": 10.0 * (p + 1) + m, "averageMsgSize": 500.0},
                {"producerName": "bad", "msgRateIn": 1.0, "averageMsgSize": 100.0},
            ],
        )
        for m in (0, 1)
        for p in (0, 1)
    ]
    stats.append(dict(stats[0], subscription="s2"))  # the same topic row again, for another subscription
    write_table(frame(spark, "bronze_topic_stats", stats), "bronze_topic_stats", mode="replace", partitions=[{"day": DAY}], settings=settings)

    for _ in range(2):  # a re-run replaces the day
        result = build_producers(spark, DAY, settings)
    lint = read_table("producer_lint", settings=settings, spark=spark).collect()
    assert result.metrics["producer_lint_rows"] == 1
    assert [(r.producer_name, r.rule) for r in lint] == [("bad", "batch-never-fills-by-count")]
    health = {r.producer_name: r for r in read_table("producer_health", settings=settings, spark=spark).collect()}
    assert health["bad"].lint_findings == 1 and health["app-1"].lint_findings == 0
    # Per collection: partitions summed (10 + 20, then 11 + 21); averaged over the day.
    assert health["app-1"].broker_msg_rate_in == ((10 + 20) + (11 + 21)) / 2
    assert health["app-1"].broker_average_msg_size == 500.0

    conf = read_table("publish_rate_conformance", settings=settings, spark=spark).where("producer_name = 'app-1'").collect()
    msgs = sorted((r for r in conf if r.dimension == "msgs"), key=lambda r: r.interval_start)
    # "100,10s": r = 10/s, b = 100; 60-second intervals from a full bucket.
    assert [(r.rate, r.burst, r.peak_allowed, r.limit_source) for r in msgs[:1]] == [(10.0, 100.0, 110.0, "settings")]
    deficit1 = max(0, 1000 - 10 * 60)  # 400 over the window: 300 beyond the bucket
    assert [r.delayed for r in msgs] == [deficit1 - 100, 0.0, 0.0]
    assert [r.allowed for r in msgs] == [1000 - (deficit1 - 100), deficit1 - 100, 600.0]
    assert [r.throttled for r in msgs] == [True, False, False]
    (bytes_first, *_) = sorted((r for r in conf if r.dimension == "bytes"), key=lambda r: r.interval_start)
    assert (bytes_first.rate, bytes_first.burst, bytes_first.limit_text) == (10240.0, 102400.0, "100KB,10s")


# Silver column for each ProducerConfigurationData key the demo writes.
CONFIG_COLUMNS = {
    "batchingEnabled": "batching_enabled",
    "batchingMaxMessages": "batching_max_messages",
    "batchingMaxBytes": "batching_max_bytes",
    "batchingMaxPublishDelayMicros": "batching_max_publish_delay_micros",
    "batchingPartitionSwitchFrequencyByPublishDelay": "batching_partition_switch_frequency",
    "maxPendingMessages": "max_pending_messages",
    "maxPendingMessagesAcrossPartitions": "max_pending_messages_across_partitions",
    "blockIfQueueFull": "block_if_queue_full",
    "sendTimeoutMs": "send_timeout_ms",
    "compressionType": "compression_type",
    "messageRoutingMode": "message_routing_mode",
}
# The demo's names for the problems it plants → the rule that must find each.
DEMO_ISSUES = {
    "batching-max-messages-over-max-pending": "batch-never-fills-by-count",
    "memory-limit-too-small": "memory-limit-below-pending",
    "batching-max-bytes-too-large": "batch-bytes-above-bound",
    "partition-switch-frequency": "partition-switch-frequency",
    "block-if-queue-full-false-with-send-failures": "queue-full-fails-fast",
}


def test_demo_producers(spark):
    """The demo cluster's producers: every deliberately bad one is found, no good one is."""
    from brokerlens.sources.demo.cluster import build_cluster

    cluster = build_cluster(1.0, 1)
    rows = []
    for p in cluster.producers:
        msgs, failed = 6000, 4 if p.send_failures else 0
        rows.append(
            snapshot(
                producer=p.name,
                topic=p.topic.name,
                partitions=p.topic.partitions,
                memory_limit_bytes=p.memory_limit,
                num_msgs_sent=msgs,
                uncompressed_bytes_sent=int(msgs * p.topic.msg_bytes),
                num_bytes_sent=int(msgs * p.topic.msg_bytes * 0.45),
                num_send_failed=failed,
                send_failed_queue_full=failed,
                **{CONFIG_COLUMNS[k]: v for k, v in p.config.items()},
            )
        )
    found: dict[str, set[str]] = {}
    for r in lint_rows(spark, *rows):
        found.setdefault(r.producer_name, set()).add(r.rule)
    bad = {p.name: p.issues for p in cluster.producers if p.issues}
    assert set(found) == set(bad)
    for name, issues in bad.items():
        assert {DEMO_ISSUES[i] for i in issues} <= found[name], name
