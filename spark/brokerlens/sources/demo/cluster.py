"""The demo cluster: brokers, tenants, namespaces, topics, subscriptions, producers and policies.

A fixed scenario part exercises every behaviour the platform reports on (throttling with debt,
limits on three levels with a mid-day change and a topic policy over a namespace policy,
subscriptions near and over the unacked-range cap, producers with good and bad configurations,
a counter reset). A bulk part, sized by ``scale``, adds ordinary tenants and topics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cursors import CursorPlan

CLUSTER = "c1"
MIB = 1024 * 1024


@dataclass
class SubSpec:
    name: str
    type: str  # Exclusive, Shared, Failover, Key_Shared
    consumers: int = 1
    consumer_rate: float = 5000.0  # messages per second its consumers take
    ranges_end: dict[int, int] = field(default_factory=dict)  # partition index → ranges at 23:55
    power: float = 1.0
    outages: list[tuple[int, int]] = field(default_factory=list)  # (start second, seconds)
    redeliveries: list[tuple[int, int]] = field(default_factory=list)  # (second, messages)
    delayed: bool = False  # the topic carries delayed messages (deliverAt)
    receiver_queue_size: int = 1000  # consumer receiverQueueSize (client default 1000)


@dataclass
class TopicSpec:
    tenant: str
    namespace: str  # without tenant
    local: str
    partitions: int  # 0 = non-partitioned
    brokers: list[str]  # one per partition (one for a non-partitioned topic)
    batch_mean: float  # messages per entry
    msg_bytes: float
    entry_rate: float  # entries per second written (for positions and counters)
    subs: list[SubSpec]
    idle_activity: float = 0.006  # fraction of seconds with a publish outside bursts
    bursts: list[tuple[int, int, float]] = field(default_factory=list)  # (start, seconds, entries/s)
    stats_shape: str = "topic"  # "topic" (one stats per partition) or "partitioned" (partitioned-stats)

    @property
    def ns(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def name(self) -> str:
        return f"persistent://{self.ns}/{self.local}"

    def partition_names(self) -> list[str]:
        if self.partitions == 0:
            return [self.name]
        return [f"{self.name}-partition-{i}" for i in range(self.partitions)]


@dataclass
class ProducerSpec:
    name: str
    topic: TopicSpec
    config: dict
    memory_limit: int
    issues: list[str]  # rules this configuration breaks (empty for a good one)
    send_failures: dict[str, float] = field(default_factory=dict)  # exception class → per minute
    skew: float = 0.0  # partition skew from routing (0 = even)


@dataclass
class PolicySpec:
    at: int  # second of the day it takes effect
    kind: str
    scope: str  # namespace, topic or broker
    policy: dict | None


def dispatch_rate(msgs: int, nbytes: int = -1, period: int = 1) -> dict:
    # DispatchRateImpl as the admin API returns it.
    return {"dispatchThrottlingRateInMsg": msgs, "dispatchThrottlingRateInByte": nbytes, "relativeToPublishRate": False, "ratePeriodInSecond": period}


def producer_config(**overrides) -> dict:
    # ProducerConfigurationData keys, with the values the producer tuning template recommends.
    config = {
        "batchingEnabled": True,
        "batchingMaxMessages": 500,
        "batchingMaxBytes": 131072,
        "batchingMaxPublishDelayMicros": 1000,
        "batchingPartitionSwitchFrequencyByPublishDelay": 1,
        "maxPendingMessages": 1000,
        "maxPendingMessagesAcrossPartitions": 50000,
        "blockIfQueueFull": True,
        "sendTimeoutMs": 30000,
        "compressionType": "LZ4",
        "messageRoutingMode": "RoundRobinPartition",
    }
    config.update(overrides)
    return config


@dataclass
class Cluster:
    brokers: list[str]
    exporter_brokers: list[str]  # brokers whose dispatch exporter writes per-period records
    topics: list[TopicSpec]
    producers: list[ProducerSpec]
    policies: list[PolicySpec]
    broker_config: dict[str, dict]
    counter_resets: dict[str, int]  # topic partition → second of the day it was reloaded

    def plan(self, topic: TopicSpec, sub: SubSpec, partition: int) -> CursorPlan:
        end = sub.ranges_end.get(partition, 0)
        return CursorPlan(ranges_start=end // 10, ranges_end=end, power=sub.power, entries_per_second=topic.entry_rate)


def broker_config(broker_msg_limit: int) -> dict:
    """broker.conf keys (dynamic config) relevant to dispatch throttling and cursors."""
    return {
        "dispatchThrottlingRateInMsg": broker_msg_limit,
        "dispatchThrottlingRateInByte": 0,
        "dispatchThrottlingRatePerTopicInMsg": 0,
        "dispatchThrottlingRatePerTopicInByte": 0,
        "dispatchThrottlingRatePerSubscriptionInMsg": 0,
        "dispatchThrottlingRatePerSubscriptionInByte": 0,
        "dispatchThrottlingRatePerReplicatorInMsg": 0,
        "dispatchThrottlingRatePerReplicatorInByte": 0,
        "dispatchThrottlingRateRelativeToPublishRate": False,
        "dispatchThrottlingOnBatchMessageEnabled": False,
        "dispatchThrottlingOnNonBacklogConsumerEnabled": True,
        "preciseDispatcherFlowControl": False,
        "dispatcherMaxReadBatchSize": 100,
        "managedLedgerMaxUnackedRangesToPersist": 10000,
        "managedLedgerMaxEntriesPerLedger": 50000,
    }


def build_cluster(scale: float, seed: int) -> Cluster:
    rng = np.random.Generator(np.random.PCG64([seed, 1]))
    n_brokers = max(3, int(round(3 * scale)))
    brokers = [f"broker-{i + 1}:8080" for i in range(n_brokers)]
    b1, b2, b3 = brokers[:3]
    h = 3600
    topics = [
        TopicSpec(
            "acme",
            "orders",
            "orders",
            4,
            [b1, b2, b3, b1],
            batch_mean=8,
            msg_bytes=600,
            entry_rate=6,
            stats_shape="partitioned",
            bursts=[(2 * h, 600, 40.0), (9 * h + 1800, 900, 3.0), (19 * h, 300, 60.0)],
            subs=[
                SubSpec("fulfilment", "Shared", 3, 2000, {0: 120, 3: 80}, outages=[(9 * h + 1800, 900)], redeliveries=[(11 * h, 500)]),
                SubSpec("analytics", "Key_Shared", 2, 1500, {0: 300, 1: 250, 2: 280, 3: 310}, redeliveries=[(16 * h + 1800, 300)]),
                # A small receiver queue: reads of 20 entries, not dispatcherMaxReadBatchSize's 100.
                SubSpec("audit-log", "Failover", 2, 2000, receiver_queue_size=20),
            ],
        ),
        TopicSpec(
            "acme",
            "orders",
            "order-events",
            0,
            [b1],
            batch_mean=1,
            msg_bytes=2048,
            entry_rate=4,
            bursts=[(13 * h, 600, 250.0)],
            subs=[SubSpec("billing", "Shared", 2, 3000, {0: 40}), SubSpec("search-indexer", "Exclusive", 1, 3000, {0: 1500})],
        ),
        TopicSpec(
            "acme",
            "payments",
            "payments",
            2,
            [b2, b3],
            batch_mean=4,
            msg_bytes=1024,
            entry_rate=25,
            subs=[
                SubSpec("ledger-writer", "Key_Shared", 4, 800, {0: 24000, 1: 3200}, power=1.3),
                SubSpec("fraud-check", "Shared", 3, 600, {0: 9200, 1: 8400}, power=0.8),
            ],
        ),
        TopicSpec(
            "acme",
            "payments",
            "refunds-delayed",
            0,
            [b2],
            batch_mean=1,
            msg_bytes=800,
            entry_rate=12,
            subs=[SubSpec("refund-scheduler", "Shared", 2, 400, {0: 12500}, power=1.1, delayed=True)],
        ),
        TopicSpec(
            "globex",
            "telemetry",
            "metrics",
            3,
            [b1, b2, b3],
            batch_mean=20,
            msg_bytes=300,
            entry_rate=3,
            bursts=[(2 * h, 300, 30.0), (6 * h, 300, 30.0)],
            subs=[SubSpec("tsdb-sink", "Shared", 2, 6000, {0: 60, 1: 45, 2: 50}), SubSpec("alerting", "Failover", 2, 6000)],
        ),
        TopicSpec(
            "globex",
            "telemetry",
            "device-events",
            2,
            [b3, b2],
            batch_mean=10,
            msg_bytes=2048,
            entry_rate=15,
            subs=[SubSpec("enricher", "Key_Shared", 3, 900, {0: 6600, 1: 2000}, power=1.5)],
        ),
        TopicSpec("globex", "audit", "audit-trail", 0, [b3], batch_mean=50, msg_bytes=512, entry_rate=2, subs=[SubSpec("archiver", "Exclusive", 1, 5000)]),
    ]
    sub_types = ["Shared", "Failover", "Exclusive", "Key_Shared"]
    n_bulk = max(1, int(round(6 * scale)))
    for i in range(n_bulk):
        parts = int(rng.choice([0, 2]))
        count = max(parts, 1)
        tenant = f"tenant-{i % max(1, n_bulk // 3) + 1:02d}"
        t_brokers = [brokers[(i + p) % n_brokers] for p in range(count)]
        subs = [
            SubSpec(f"consumer-{k + 1}", str(rng.choice(sub_types)), int(rng.integers(1, 4)), 5000.0, {p: int(rng.integers(0, 400)) for p in range(count)})
            for k in range(int(rng.integers(1, 3)))
        ]
        topics.append(
            TopicSpec(
                tenant,
                f"ns-{i % 4 + 1}",
                f"events-{i + 1:03d}",
                parts,
                t_brokers,
                batch_mean=float(rng.choice([1, 5, 10])),
                msg_bytes=float(rng.choice([256, 1024])),
                entry_rate=float(rng.uniform(1, 5)),
                idle_activity=0.005,
                subs=subs,
                stats_shape="partitioned" if parts and i % 2 else "topic",
            )
        )
    by_local = {t.local: t for t in topics}
    producers = [
        ProducerSpec("orders-app-1", by_local["orders"], producer_config(), 64 * MIB, []),
        ProducerSpec("order-events-app", by_local["order-events"], producer_config(batchingEnabled=False), 64 * MIB, []),
        ProducerSpec(
            "payments-gateway",
            by_local["payments"],
            producer_config(maxPendingMessages=500, batchingMaxMessages=1000),
            64 * MIB,
            ["batching-max-messages-over-max-pending"],
        ),
        ProducerSpec(
            "telemetry-agent",
            by_local["device-events"],
            producer_config(maxPendingMessages=2000, maxPendingMessagesAcrossPartitions=4000),
            4 * MIB,
            ["memory-limit-too-small"],
        ),
        ProducerSpec(
            "audit-shipper",
            by_local["audit-trail"],
            producer_config(batchingMaxMessages=1000, batchingMaxBytes=4 * MIB),
            64 * MIB,
            ["batching-max-bytes-too-large"],
        ),
        ProducerSpec(
            "metrics-collector",
            by_local["metrics"],
            producer_config(batchingPartitionSwitchFrequencyByPublishDelay=10),
            64 * MIB,
            ["partition-switch-frequency"],
            skew=0.6,
        ),
        ProducerSpec(
            "refund-service",
            by_local["refunds-delayed"],
            producer_config(blockIfQueueFull=False, messageRoutingMode="SinglePartition"),
            64 * MIB,
            ["block-if-queue-full-false-with-send-failures"],
            send_failures={"ProducerQueueIsFullError": 4.0},
        ),
    ]
    producers += [ProducerSpec(f"{t.local}-producer", t, producer_config(), 64 * MIB, []) for t in topics[7:]]
    policies = [
        PolicySpec(0, "namespace-dispatch-rate", "acme/orders", dispatch_rate(800)),
        PolicySpec(0, "namespace-subscription-dispatch-rate", "acme/orders", dispatch_rate(200)),
        # Mid-day change of the namespace subscription limit.
        PolicySpec(12 * h, "namespace-subscription-dispatch-rate", "acme/orders", dispatch_rate(120)),
        # Topic policy over the namespace policy: message and byte limit on order-events.
        PolicySpec(0, "topic-dispatch-rate", by_local["order-events"].name, dispatch_rate(300, 262144)),
        # A topic subscription policy set in the morning and removed in the evening.
        PolicySpec(8 * h, "topic-subscription-dispatch-rate", by_local["orders"].name, dispatch_rate(80)),
        PolicySpec(18 * h, "topic-subscription-dispatch-rate", by_local["orders"].name, None),
        PolicySpec(0, "namespace-subscription-dispatch-rate", "globex/telemetry", dispatch_rate(400, MIB)),
    ]
    for ns in sorted({t.ns for t in topics[7:]}):
        policies.append(PolicySpec(0, "namespace-subscription-dispatch-rate", ns, dispatch_rate(int(rng.integers(1, 6)) * 100)))
    config = {b: broker_config(1500 if i == 0 else 0) for i, b in enumerate(brokers)}
    exporters = [b for i, b in enumerate(brokers) if i % 3 == 0]
    resets = {by_local["audit-trail"].name: 14 * h + 1200}
    return Cluster(brokers, exporters, topics, producers, policies, config, resets)
