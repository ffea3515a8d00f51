"""A large cluster's day for `make bench` (issue 16, target 4), generated column-wise.

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
cumulatively (no holes); one Shared cursor in 500 is near or over the 10,000-range cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from brokerlens.sources.demo.cluster import broker_config, dispatch_rate
from brokerlens.sources.demo.cursors import (
    HOLE_GAP, LEDGER_FIELDS, LEDGER_ROLLOVER_SECONDS, MAX_ENTRIES_PER_LEDGER, range_texts,
)
from brokerlens.sources.demo.metrics import METRIC_HELP, safe
from brokerlens.sources.demo.schedule import DAY, dumps, fill, hhmm, iso
from brokerlens.sources.demo.stats import (
    CONSUMER_FIELDS, CURSOR_FIELDS, MANAGED_LEDGER_FIELDS, PUBLISHER_FIELDS, SUBSCRIPTION_FIELDS,
    TOPIC_FIELDS, serialized_size,
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
    "pulsar_rate_in": "msgRateIn", "pulsar_rate_out": "msgRateOut", "pulsar_throughput_in": "msgThroughputIn",
    "pulsar_throughput_out": "msgThroughputOut", "pulsar_storage_size": "storageSize",
    "pulsar_msg_backlog": "msgBacklog", "pulsar_in_messages_total": "msgInCounter",
    "pulsar_out_messages_total": "msgOutCounter",
}
SUBSCRIPTION_SERIES = {
    "pulsar_subscription_back_log": "msgBacklog", "pulsar_subscription_msg_rate_out": "msgRateOut",
    "pulsar_subscription_msg_throughput_out": "msgThroughputOut",
    "pulsar_subscription_msg_rate_redeliver": "msgRateRedeliver",
    "pulsar_subscription_unacked_messages": "unackedMessages", "pulsar_subscription_delayed": "msgDelayed",
    "pulsar_subscription_consumers_count": "consumers",
}
# Subscription fields its consumers share equally.
PER_CONSUMER = ("msgRateOut", "messageAckRate", "msgThroughputOut", "msgOutCounter", "bytesOutCounter",
                "msgRateRedeliver", "unackedMessages")


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
        names=names, namespaces=namespaces, rate=rate, batch=rng.choice([1, 5, 10, 20], P),
        msg_bytes=rng.choice([256, 512, 1024, 2048], P), added=added,
        lag=lag, ack_lag=ack_lag, first_hole=first_hole, hole_len=hole_len, gap=gap, max_ranges=end,
        redelivery=np.where(np.arange(S) == FAILOVER, 0.0, rng.uniform(0.0, 0.02, (P, S))),
        out_base=rng.integers(0, 10_000_000, (P, S)), in_base=rng.integers(10_000_000, 50_000_000, P),
        per_ledger=per_ledger, ledger_start=oldest - rng.integers(1, per_ledger),
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
        "msgRateOut": rate_out, "messageAckRate": rate_out, "msgThroughputOut": np.round(rate_out * size, 3),
        "msgOutCounter": c.out_base + out, "bytesOutCounter": (c.out_base + out) * size,
        "msgRateRedeliver": np.round((again - again_before) / STATS_EVERY, 3),
        "unackedMessages": np.where(np.arange(len(SUBSCRIPTIONS)) == FAILOVER, 0, holes * batch),
        "msgBacklog": backlog, "msgBacklogNoDelayed": backlog, "backlogSize": backlog * size, "msgDelayed": np.zeros_like(backlog),
        "nonContiguousDeletedMessagesRanges": now["ranges"],
        "nonContiguousDeletedMessagesRangesSerializedSize": serialized_size(now["ranges"]),
        "consumers": np.full_like(backlog, CONSUMERS),
    }
    msg_in = c.in_base + (c.added[:, minute + 1] - c.added[:, 1]) * c.batch
    rate_in = np.round((c.added[:, minute + 1] - c.added[:, minute]) * c.batch / STATS_EVERY, 3)
    topic = {key: np.round(sub[key].sum(axis=1), 3) for key in (
        "msgRateOut", "msgThroughputOut", "msgOutCounter", "bytesOutCounter", "backlogSize", "msgBacklog",
        "nonContiguousDeletedMessagesRanges", "nonContiguousDeletedMessagesRangesSerializedSize")}
    topic.update(msgRateIn=rate_in, msgThroughputIn=np.round(rate_in * c.msg_bytes, 3), msgInCounter=msg_in,
                 bytesInCounter=msg_in * c.msg_bytes, storageSize=msg_in * c.msg_bytes // 3)
    return sub, topic, now


# ------------------------------------------------------------------------------- templates


class Template:
    """An envelope as JSON text with a ``%s`` for each varying field, %-formatted per row.

    Made from an object whose varying values are ``slot(name)`` markers; ``render`` takes the
    values as JSON text (numbers through ``tolist``, strings through ``quoted``) by slot name.
    """

    _SLOT = re.compile(r'"@([\w.]+)@"')

    def __init__(self, obj):
        text = dumps(obj).replace("%", "%%")
        self.slots = self._SLOT.findall(text)
        self.text = self._SLOT.sub("%s", text)

    def render(self, columns: dict[str, list]) -> list[str]:
        return [self.text % row for row in zip(*(columns[name] for name in self.slots))]


def slot(name: str) -> str:
    return f"@{name}@"


def quoted(values) -> list[str]:
    return [dumps(v) for v in values]


def slots(fields: dict, prefix: str, **constants) -> dict:
    """``fields`` with a slot ``prefix + field`` in each varying field not given as a constant."""
    return fill(fields, **{k: constants.get(k, slot(prefix + k)) for k, v in fields.items() if v is None})


def envelope(stats: dict) -> Template:
    return Template({"collected_at": slot("collected_at"), "cluster": CLUSTER, "broker": slot("broker"),
                     "topic": slot("topic"), "stats": stats})


def stats_template(day: date) -> Template:
    """One partition's TopicStats: 3 subscriptions of 2 consumers, 1 producer."""
    subs = {}
    for s, (name, kind) in enumerate(SUBSCRIPTIONS):
        consumers = [slots(CONSUMER_FIELDS, f"s{s}c.", consumerName=f"{name}-{n + 1}",
                           address=f"/10.0.{n + 4}.{20 + s}:{40000 + n}", connectedSince=iso(day, -86400 + 3600 * n, millis=True))
                     for n in range(CONSUMERS)]
        subs[name] = slots(SUBSCRIPTION_FIELDS, f"s{s}.", type=kind, consumers=consumers, delayedMessageIndexSizeInBytes=0)
        if kind == "Key_Shared":
            subs[name]["keySharedMode"] = "AUTO_SPLIT"
    publisher = slots(PUBLISHER_FIELDS, "pub.", producerId=0, address="/10.0.2.20:50000",
                      connectedSince=iso(day, -40000, millis=True))
    return envelope(slots(TOPIC_FIELDS, "", publishers=[publisher], subscriptions=subs, delayedMessageIndexSizeInBytes=0))


def internal_template(day: date) -> Template:
    """One partition's PersistentTopicInternalStats: its ledgers and a cursor per subscription."""
    cursors = {name: slots(CURSOR_FIELDS, f"k{s}.", lastLedgerSwitchTimestamp=iso(day, 0, millis=True))
               for s, (name, _) in enumerate(SUBSCRIPTIONS)}
    return envelope(slots(MANAGED_LEDGER_FIELDS, "", cursors=cursors))


LEDGER = Template(slots(LEDGER_FIELDS, ""))


def partition_columns(c: Cluster) -> dict[str, list]:
    """The slots that stay the same all day."""
    cols = {"topic": quoted(c.names), "broker": quoted(broker_name(p % BROKERS) for p in range(len(c.names)))}
    cols["ownerBroker"] = cols["broker"]
    cols["averageMsgSize"] = cols["pub.averageMsgSize"] = c.msg_bytes.astype(float).tolist()
    cols["pub.producerName"] = quoted(f"{name.rsplit('/', 1)[1]}-producer" for name in c.names)
    for s in range(len(SUBSCRIPTIONS)):
        cols[f"s{s}c.avgMessagesPerEntry"] = c.batch.tolist()
        cols[f"s{s}c.availablePermits"] = (1000 - c.lag[:, s]).tolist()
        cols[f"k{s}.cursorLedger"] = (10**9 + np.arange(len(c.names)) * len(SUBSCRIPTIONS) + s).tolist()
    return cols


def stats_columns(sub: dict, topic: dict) -> dict[str, list]:
    cols = {key: values.tolist() for key, values in topic.items()}
    cols["pub.msgRateIn"], cols["pub.msgThroughputIn"] = cols["msgRateIn"], cols["msgThroughputIn"]
    for s in range(len(SUBSCRIPTIONS)):
        for key, values in sub.items():
            cols[f"s{s}.{key}"] = values[:, s].tolist()
        for key in PER_CONSUMER:
            values = sub[key][:, s]
            share = np.round(values / CONSUMERS, 3) if values.dtype.kind == "f" else values // CONSUMERS
            cols[f"s{s}c.{key}"] = share.tolist()
    return cols


def expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, index within its group) of every element of groups of ``counts`` elements."""
    group = np.repeat(np.arange(len(counts)), counts)
    return group, np.arange(len(group)) - (np.cumsum(counts) - counts)[group]


def grouped(texts: list[str], counts: np.ndarray, sep: str) -> list[str]:
    """A JSON-like list per group: ``[a<sep>b]``."""
    ends = np.cumsum(counts).tolist()
    return ["[" + sep.join(texts[a:b]) + "]" for a, b in zip([0, *ends[:-1]], ends)]


def deleted_ranges(c: Cluster, cursors: dict) -> list[str]:
    """individuallyDeletedMessages of every cursor (partition-major): the acked entries between
    holes, ``(last entry of a hole..entry before the next hole]``, the last range up to the read position."""
    S = len(SUBSCRIPTIONS)
    ranges = cursors["ranges"].ravel()
    cursor, j = expand(ranges)
    p, first, length, gap = cursor // S, c.first_hole.ravel()[cursor], c.hole_len.ravel()[cursor], c.gap.ravel()[cursor]
    hole = first + j * gap
    upper = np.where(j == ranges[cursor] - 1, cursors["read"].ravel()[cursor], hole + gap - 1)
    (lo_k, lo_entry), (hi_k, hi_entry) = c.locate(p, hole + length - 1), c.locate(p, upper)
    return grouped(range_texts(c.ledger_id(p, lo_k), lo_entry, c.ledger_id(p, hi_k), hi_entry), ranges, ", ")


def ledger_lists(c: Cluster, oldest: np.ndarray, current: np.ndarray, entry_bytes: np.ndarray) -> list[str]:
    """``ledgers`` from the one holding the oldest mark-delete position to the one being written
    (listed with 0 entries, as Pulsar does)."""
    p, i = expand(current - oldest + 1)
    k = oldest[p] + i
    entries = np.where(k < current[p], c.per_ledger[p], 0)
    texts = LEDGER.render({"ledgerId": c.ledger_id(p, k).tolist(), "entries": entries.tolist(),
                           "size": (entries * entry_bytes[p]).tolist()})
    return grouped(texts, current - oldest + 1, ",")


def internal_columns(c: Cluster, day: date, minute: int, sub: dict, cursors: dict) -> dict[str, list]:
    p = np.arange(len(c.names))
    read, ranges, mark = cursors["read"], cursors["ranges"], cursors["mark"]
    texts = deleted_ranges(c, cursors)
    cols = {}
    for s in range(len(SUBSCRIPTIONS)):
        cols.update({
            f"k{s}.markDeletePosition": c.positions(p, mark[:, s]), f"k{s}.readPosition": c.positions(p, read[:, s] + 1),
            f"k{s}.waitingReadOp": np.where(ranges[:, s] == 0, "true", "false").tolist(),
            f"k{s}.messagesConsumedCounter": sub["msgOutCounter"][:, s].tolist(), f"k{s}.cursorLedgerLastEntry": [minute] * len(p),
            f"k{s}.individuallyDeletedMessages": quoted(texts[s::len(SUBSCRIPTIONS)]),
            f"k{s}.numberOfEntriesSinceFirstNotAckedMessage": (read[:, s] - mark[:, s]).tolist(),
            f"k{s}.totalNonContiguousDeletedMessagesRange": ranges[:, s].tolist(),
        })
    last = c.added[:, minute + 1] - 1
    current, entry = c.locate(p, last)
    oldest = mark.min(axis=1)
    entry_bytes = c.batch * c.msg_bytes
    opened = minute * STATS_EVERY - (entry + 1) / c.rate
    cols.update(
        entriesAddedCounter=(last - c.ledger_start + 1).tolist(), numberOfEntries=(last - oldest).tolist(),
        totalSize=((last - oldest) * entry_bytes).tolist(), currentLedgerEntries=(entry + 1).tolist(),
        currentLedgerSize=((entry + 1) * entry_bytes).tolist(),
        lastLedgerCreatedTimestamp=quoted(iso(day, t, millis=True) for t in opened.tolist()),
        waitingCursorsCount=(ranges == 0).sum(axis=1).tolist(), lastConfirmedEntry=c.positions(p, last),
        ledgers=ledger_lists(c, c.locate(p, oldest)[0], current, entry_bytes),
    )
    return cols


# ---------------------------------------------------------------------------------- writing


def metric_prefixes(c: Cluster) -> list[dict[str, list[str]]]:
    """Per broker and series, ``name{labels} `` of each of its samples (partition-major)."""
    out = []
    for b in range(min(len(c.names), BROKERS)):
        mine = range(b, len(c.names), BROKERS)
        topic = [f'cluster="{CLUSTER}",namespace="{c.namespaces[p]}",topic="{c.names[p]}"' for p in mine]
        sub = [f'{labels},subscription="{name}"' for labels in topic for name, _ in SUBSCRIPTIONS]
        out.append({metric: [f"{metric}{{{labels}}} " for labels in (topic if metric in TOPIC_SERIES else sub)]
                    for metric in METRIC_HELP})
    return out


def metrics_text(day: date, second: int, b: int, prefixes: dict[str, list[str]], sub: dict, topic: dict) -> str:
    """One broker's /metrics scrape, the demo's series with its `# brokerlens:` header."""
    head = dumps({"collected_at": iso(day, second), "cluster": CLUSTER, "broker": broker_name(b)})
    lines = [f"# brokerlens: {head}"]
    for metric, kind in METRIC_HELP.items():
        values = topic[TOPIC_SERIES[metric]] if metric in TOPIC_SERIES else sub[SUBSCRIPTION_SERIES[metric]]
        lines.append(f"# TYPE {metric} {kind}")
        lines += map(str.__add__, prefixes[metric], map(str, values[b::BROKERS].astype(float).ravel().tolist()))
    return "\n".join(lines) + "\n"


def policy_lines(c: Cluster, day: date) -> dict[str, list[str]]:
    """broker.conf of each broker (no broker-wide limit) and a subscription limit per namespace."""
    at = iso(day, 0)
    return {
        "broker-config.jsonl": [dumps({"effective_at": at, "cluster": CLUSTER, "kind": "broker-config",
                                       "broker": broker_name(b), "policy": broker_config(0)}) for b in range(BROKERS)],
        "dispatch-rate.jsonl": [dumps({"effective_at": at, "cluster": CLUSTER, "kind": "namespace-subscription-dispatch-rate",
                                       "namespace": ns, "policy": dispatch_rate(200 * (n % 5 + 1))})
                                for n, ns in enumerate(sorted(set(c.namespaces)))],
    }


def write_large_day(landing: Path, day: date, partitions: int = 2000, minutes: int = MINUTES,
                    seed: int = 0) -> dict[str, dict[str, int]]:
    """The first ``minutes`` of the day under ``<landing>/<day>/<kind>/``. Per kind: files,
    records (the bronze rows they make: per partition x subscription for stats, per sample for
    /metrics, per line for policies) and bytes."""
    c = plan_cluster(day, partitions, seed)
    root = landing / day.isoformat()
    counts = {kind: {"files": 0, "records": 0, "bytes": 0} for kind in KINDS}

    def write(kind: str, name: str, text: str, records: int) -> None:
        (root / kind).mkdir(parents=True, exist_ok=True)
        counts[kind]["bytes"] += (root / kind / name).write_text(text)  # ASCII: characters are bytes
        counts[kind]["files"] += 1
        counts[kind]["records"] += records

    for name, lines in policy_lines(c, day).items():
        write("policies", name, "\n".join(lines) + "\n", len(lines))
    templates = {"topic-stats": stats_template(day), "internal-stats": internal_template(day)}
    fixed, prefixes, S = partition_columns(c), metric_prefixes(c), len(SUBSCRIPTIONS)
    for minute in range(minutes):
        second = minute * STATS_EVERY
        sub, topic, cursors = snapshot(c, minute)
        columns = {"topic-stats": stats_columns(sub, topic)}
        if second % INTERNAL_EVERY == 0:
            columns["internal-stats"] = internal_columns(c, day, minute, sub, cursors)
        for kind, cols in columns.items():
            rows = templates[kind].render({**fixed, **cols, "collected_at": quoted([iso(day, second)]) * partitions})
            for b in range(len(prefixes)):
                mine = rows[b::BROKERS]
                write(kind, f"{safe(broker_name(b))}-{hhmm(second)}.json", "[" + ",".join(mine) + "]\n", len(mine) * S)
        for b, broker_prefixes in enumerate(prefixes):
            text = metrics_text(day, second, b, broker_prefixes, sub, topic)
            write("metrics", f"{safe(broker_name(b))}-{hhmm(second)}.prom", text, sum(map(len, broker_prefixes.values())))
    return counts
