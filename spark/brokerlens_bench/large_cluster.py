"""A large cluster's day for `make bench` generated column-wise.

P topic partitions (partitioned topics of 4 partitions over 10 brokers) x 3 subscriptions
(Shared, Failover, Key_Shared, 2 consumers each), written as `brokerlens demo-data` writes
them (schemas/landing/README.md) with the demo's field sets (``brokerlens.sources.demo.stats``):

* ``topic-stats`` and ``metrics`` every 60 s, ``internal-stats`` every 5 min: one file per
  broker and collection;
* ``policies``: each broker's broker.conf and a subscription dispatch rate per namespace.

The demo simulates objects one by one; here the whole cluster is numpy arrays per minute,
turned into JSON by templates (one per envelope, made once from the demo's field sets with a
marker in each varying field) %-formatted row by row. Everything derives from (day,
partitions, seed); the first minutes of the day are the same whatever window is written.

Cursors: a hole (1 or 2 unacked entries) every ``gap`` entries behind the read position, the
oldest from before the day, up to ``max_ranges`` ranges. Failover subscriptions ack
cumulatively (no holes); one Shared cursor in 500 is near or over the 10,000-range cap."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import numpy as np

from brokerlens.sources.demo.cursors import (
    HOLE_GAP,
    LEDGER_ROLLOVER_SECONDS,
    MAX_ENTRIES_PER_LEDGER,
)
from brokerlens.sources.demo.schedule import DAY
from brokerlens.sources.demo.stats import (
    serialized_size,
)

CLUSTER = "large"
BROKERS = 10
PARTITIONS_PER_TOPIC = 4
NAMESPACES = 20  # 5 tenants x 4 namespaces
SUBSCRIPTIONS = (("shared", "Shared"), ("failover", "Failover"), ("key-shared", "Key_Shared"))
FAILOVER = 1  # its index: cumulative acks, no holes, no unacked messages
CONSUMERS = 2  # per subscription
STATS_EVERY, INTERNAL_EVERY = 60, 300  # seconds; /metrics is scraped with the topic stats
MINUTES = DAY // 60
CAP = 10_000  # managedLedgerMaxUnackedRangesToPersist
KINDS = ("topic-stats", "internal-stats", "metrics", "policies")
# The demo's /metrics series (METRIC_HELP) from the stats fields they report, per level.
TOPIC_SERIES = {
    "pulsar_rate_in": "msgRateIn",
    "pulsar_rate_out": "msgRateOut",
    "pulsar_throughput_in": "msgThroughputIn",
    "pulsar_throughput_out": "msgThroughputOut",
    "pulsar_storage_size": "storageSize",
    "pulsar_msg_backlog": "msgBacklog",
    "pulsar_in_messages_total": "msgInCounter",
    "pulsar_out_messages_total": "msgOutCounter",
}
SUBSCRIPTION_SERIES = {
    "pulsar_subscription_back_log": "msgBacklog",
    "pulsar_subscription_msg_rate_out": "msgRateOut",
    "pulsar_subscription_msg_throughput_out": "msgThroughputOut",
    "pulsar_subscription_msg_rate_redeliver": "msgRateRedeliver",
    "pulsar_subscription_unacked_messages": "unackedMessages",
    "pulsar_subscription_delayed": "msgDelayed",
    "pulsar_subscription_consumers_count": "consumers",
}
# Subscription fields its consumers share equally.
PER_CONSUMER = ("msgRateOut", "messageAckRate", "msgThroughputOut", "msgOutCounter", "bytesOutCounter", "msgRateRedeliver", "unackedMessages")


def broker_name(b: int) -> str:
    return f"broker-{b + 1}.{CLUSTER}:8080"


# ----------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """The day per partition (P) and cursor (P x S); offsets count a partition's entries."""

    names: list[str]  # topic partitions
    namespaces: list[str]  # per partition
    rate: np.ndarray  # entries per second
    batch: np.ndarray  # messages per entry
    msg_bytes: np.ndarray
    added: np.ndarray  # (P, MINUTES + 1): entries added by 23:59 of the day before, 00:00, 00:01, ...
    lag: np.ndarray  # (P, S): entries a subscription reads behind the last one added
    ack_lag: np.ndarray  # (P, S): entries a cursor without holes acks behind its read position
    first_hole: np.ndarray  # (P, S): offset of the oldest unacked entry
    hole_len: np.ndarray  # (P, S)
    gap: np.ndarray  # (P, S): entries from one hole to the next
    max_ranges: np.ndarray  # (P, S)
    redelivery: np.ndarray  # (P, S): share of messages delivered again
    out_base: np.ndarray  # (P, S): msgOutCounter at 00:00
    in_base: np.ndarray  # (P,): msgInCounter at 00:00
    per_ledger: np.ndarray  # (P,): entries per ledger (rolled over by entries or by time)
    ledger_start: np.ndarray  # (P,): offset of ledger 0's first entry

    def ledger_id(self, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        # BookKeeper ids are cluster-wide: increasing per topic, not consecutive.
        return 1000 + k * len(self.names) + p

    def locate(self, p: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ledger index, entry id) of entry offsets of partitions ``p``."""
        return np.divmod(offset - self.ledger_start[p], self.per_ledger[p])

    def positions(self, p: np.ndarray, offset: np.ndarray) -> list[str]:
        """``"ledgerId:entryId"`` JSON strings."""
        k, entry = self.locate(p, offset)
        return [f'"{ledger}:{e}"' for ledger, e in zip(self.ledger_id(p, k).tolist(), entry.tolist())]

    def cursors_at(self, minute: int) -> dict[str, np.ndarray]:
        """Last entry read, range count and mark-delete offset of every cursor at a minute (-1 … 1439)."""
        read = self.added[:, minute + 1, None] - 1 - self.lag
        ranges = np.clip((read - self.first_hole - self.hole_len) // self.gap + 1, 0, self.max_ranges)
        # Without a hole behind it, a cursor acks up to ack_lag (≥ a hole's length) behind its reads.
        return {"read": read, "ranges": ranges, "mark": np.where(ranges > 0, self.first_hole - 1, read - self.ack_lag)}


def plan_cluster(day: date, partitions: int, seed: int = 0) -> Cluster:
    rng = np.random.default_rng([seed, day.toordinal(), partitions])
    P, S = partitions, len(SUBSCRIPTIONS)
    topic = np.arange(P) // PARTITIONS_PER_TOPIC
    namespaces = [f"tenant-{n // 4 + 1}/ns-{n % 4 + 1}" for n in (topic % NAMESPACES).tolist()]
    names = [f"persistent://{namespaces[p]}/events-{topic[p]:05d}-partition-{p % PARTITIONS_PER_TOPIC}" for p in range(P)]
    rate = rng.uniform(0.5, 10.0, P)
    seconds = np.arange(-1, MINUTES) * 60
    diurnal = 0.6 + 0.4 * np.sin((seconds / DAY - 0.3) * 2 * np.pi)
    per_minute = rng.poisson(rate[:, None] * 60 * diurnal[None, :])
    lag, ack_lag, hole_len = rng.integers(0, 20, (P, S)), rng.integers(2, 10, (P, S)), rng.integers(1, 3, (P, S))
    # Ranges at 00:00 (holes left from the day before) and at most, per subscription of SUBSCRIPTIONS.
    end = np.stack([rng.integers(0, 100, P), np.zeros(P, np.int64), rng.integers(0, 300, P)], axis=1)
    start = end // 10
    capped = rng.choice(P, size=max(1, P // 500), replace=False)
    start[capped, 0] = rng.integers(CAP - 1000, CAP + 1000, len(capped))
    end[capped, 0] = start[capped, 0] + 2000
    gap = np.maximum(HOLE_GAP, per_minute[:, 1:].sum(axis=1)[:, None] // np.maximum(end - start, 1))
    before = np.concatenate([np.zeros((P, 1), np.int64), np.cumsum(per_minute, axis=1)[:, :MINUTES]], axis=1)
    added = rng.integers(50_000_000, 90_000_000, P)[:, None] + before
    read0 = added[:, 1, None] - 1 - lag
    first_hole = read0 - hole_len - (start - 1) * gap - gap // 2  # `start` ranges behind at 00:00
    oldest = np.minimum(first_hole - 1, read0 - ack_lag).min(axis=1)
    per_ledger = np.clip(rate * LEDGER_ROLLOVER_SECONDS, 1000, MAX_ENTRIES_PER_LEDGER).astype(np.int64)
    return Cluster(
        names=names,
        namespaces=namespaces,
        rate=rate,
        batch=rng.choice([1, 5, 10, 20], P),
        msg_bytes=rng.choice([256, 512, 1024, 2048], P),
        added=added,
        lag=lag,
        ack_lag=ack_lag,
        first_hole=first_hole,
        hole_len=hole_len,
        gap=gap,
        max_ranges=end,
        redelivery=np.where(np.arange(S) == FAILOVER, 0.0, rng.uniform(0.0, 0.02, (P, S))),
        out_base=rng.integers(0, 10_000_000, (P, S)),
        in_base=rng.integers(10_000_000, 50_000_000, P),
        per_ledger=per_ledger,
        ledger_start=oldest - rng.integers(1, per_ledger),
    )


def snapshot(c: Cluster, minute: int) -> tuple[dict, dict, dict]:
    """(SubscriptionStats fields (P, S), TopicStats fields (P,), cursors) at ``minute``; rates
    over the minute before it. Counters start from the day's first snapshot."""
    now, before, first = c.cursors_at(minute), c.cursors_at(minute - 1), c.cursors_at(0)
    size, batch = c.msg_bytes[:, None], c.batch[:, None]

    def delivered(cursors: dict) -> tuple[np.ndarray, np.ndarray]:
        consumed = (cursors["read"] - first["read"]) * batch
        again = np.floor(consumed * c.redelivery).astype(np.int64)
        return consumed + again, again  # msgOutCounter counts redeliveries too

    out, again = delivered(now)
    out_before, again_before = delivered(before)
    holes = now["ranges"] * c.hole_len
    backlog = (c.added[:, minute + 1, None] - 1 - now["read"] + holes) * batch
    rate_out = np.round((out - out_before) / STATS_EVERY, 3)
    sub = {
        "msgRateOut": rate_out,
        "messageAckRate": rate_out,
        "msgThroughputOut": np.round(rate_out * size, 3),
        "msgOutCounter": c.out_base + out,
        "bytesOutCounter": (c.out_base + out) * size,
        "msgRateRedeliver": np.round((again - again_before) / STATS_EVERY, 3),
        "unackedMessages": np.where(np.arange(len(SUBSCRIPTIONS)) == FAILOVER, 0, holes * batch),
        "msgBacklog": backlog,
        "msgBacklogNoDelayed": backlog,
        "backlogSize": backlog * size,
        "msgDelayed": np.zeros_like(backlog),
        "nonContiguousDeletedMessagesRanges": now["ranges"],
        "nonContiguousDeletedMessagesRangesSerializedSize": serialized_size(now["ranges"]),
        "consumers": np.full_like(backlog, CONSUMERS),
    }
    msg_in = c.in_base + (c.added[:, minute + 1] - c.added[:, 1]) * c.batch
    rate_in = np.round((c.added[:, minute + 1] - c.added[:, minute]) * c.batch / STATS_EVERY, 3)
    topic = {
        key: np.round(sub[key].sum(axis=1), 3)
        for key in (
            "msgRateOut",
            "msgThroughputOut",
            "msgOutCounter",
            "bytesOutCounter",
            "backlogSize",
            "msgBacklog",
            "nonContiguousDeletedMessagesRanges",
            "nonContiguousDeletedMessagesRangesSerializedSize",
        )
    }
    topic.update(
        msgRateIn=rate_in,
        msgThroughputIn=np.round(rate_in * c.msg_bytes, 3),
        msgInCounter=msg_in,
        bytesInCounter=msg_in * c.msg_bytes,
        storageSize=msg_in * c.msg_bytes // 3,
    )
    return sub, topic, now
