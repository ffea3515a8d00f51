"""A large cluster's landing files: JSON templates made once from the demo's field sets,
%-formatted row by row, and ``write_large_day``."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import numpy as np

from brokerlens.sources.demo.cluster import broker_config, dispatch_rate
from brokerlens.sources.demo.cursors import (
    LEDGER_FIELDS,
    range_texts,
)
from brokerlens.sources.demo.metrics import METRIC_HELP, safe
from brokerlens.sources.demo.schedule import dumps, fill, hhmm, iso
from brokerlens.sources.demo.stats import (
    CONSUMER_FIELDS,
    CURSOR_FIELDS,
    MANAGED_LEDGER_FIELDS,
    PUBLISHER_FIELDS,
    SUBSCRIPTION_FIELDS,
    TOPIC_FIELDS,
)

from .large_cluster import (
    BROKERS,
    CLUSTER,
    CONSUMERS,
    INTERNAL_EVERY,
    KINDS,
    MINUTES,
    PER_CONSUMER,
    STATS_EVERY,
    SUBSCRIPTION_SERIES,
    SUBSCRIPTIONS,
    TOPIC_SERIES,
    Cluster,
    broker_name,
    plan_cluster,
    snapshot,
)


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
    return Template({"collected_at": slot("collected_at"), "cluster": CLUSTER, "broker": slot("broker"), "topic": slot("topic"), "stats": stats})


def stats_template(day: date) -> Template:
    """One partition's TopicStats: 3 subscriptions of 2 consumers, 1 producer."""
    subs = {}
    for s, (name, kind) in enumerate(SUBSCRIPTIONS):
        consumers = [
            slots(
                CONSUMER_FIELDS,
                f"s{s}c.",
                consumerName=f"{name}-{n + 1}",
                address=f"/10.0.{n + 4}.{20 + s}:{40000 + n}",
                connectedSince=iso(day, -86400 + 3600 * n, millis=True),
            )
            for n in range(CONSUMERS)
        ]
        subs[name] = slots(SUBSCRIPTION_FIELDS, f"s{s}.", type=kind, consumers=consumers, delayedMessageIndexSizeInBytes=0)
        if kind == "Key_Shared":
            subs[name]["keySharedMode"] = "AUTO_SPLIT"
    publisher = slots(PUBLISHER_FIELDS, "pub.", producerId=0, address="/10.0.2.20:50000", connectedSince=iso(day, -40000, millis=True))
    return envelope(slots(TOPIC_FIELDS, "", publishers=[publisher], subscriptions=subs, delayedMessageIndexSizeInBytes=0))


def internal_template(day: date) -> Template:
    """One partition's PersistentTopicInternalStats: its ledgers and a cursor per subscription."""
    cursors = {name: slots(CURSOR_FIELDS, f"k{s}.", lastLedgerSwitchTimestamp=iso(day, 0, millis=True)) for s, (name, _) in enumerate(SUBSCRIPTIONS)}
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
    texts = LEDGER.render({"ledgerId": c.ledger_id(p, k).tolist(), "entries": entries.tolist(), "size": (entries * entry_bytes[p]).tolist()})
    return grouped(texts, current - oldest + 1, ",")


def internal_columns(c: Cluster, day: date, minute: int, sub: dict, cursors: dict) -> dict[str, list]:
    p = np.arange(len(c.names))
    read, ranges, mark = cursors["read"], cursors["ranges"], cursors["mark"]
    texts = deleted_ranges(c, cursors)
    cols = {}
    for s in range(len(SUBSCRIPTIONS)):
        cols.update(
            {
                f"k{s}.markDeletePosition": c.positions(p, mark[:, s]),
                f"k{s}.readPosition": c.positions(p, read[:, s] + 1),
                f"k{s}.waitingReadOp": np.where(ranges[:, s] == 0, "true", "false").tolist(),
                f"k{s}.messagesConsumedCounter": sub["msgOutCounter"][:, s].tolist(),
                f"k{s}.cursorLedgerLastEntry": [minute] * len(p),
                f"k{s}.individuallyDeletedMessages": quoted(texts[s :: len(SUBSCRIPTIONS)]),
                f"k{s}.numberOfEntriesSinceFirstNotAckedMessage": (read[:, s] - mark[:, s]).tolist(),
                f"k{s}.totalNonContiguousDeletedMessagesRange": ranges[:, s].tolist(),
            }
        )
    last = c.added[:, minute + 1] - 1
    current, entry = c.locate(p, last)
    oldest = mark.min(axis=1)
    entry_bytes = c.batch * c.msg_bytes
    opened = minute * STATS_EVERY - (entry + 1) / c.rate
    cols.update(
        entriesAddedCounter=(last - c.ledger_start + 1).tolist(),
        numberOfEntries=(last - oldest).tolist(),
        totalSize=((last - oldest) * entry_bytes).tolist(),
        currentLedgerEntries=(entry + 1).tolist(),
        currentLedgerSize=((entry + 1) * entry_bytes).tolist(),
        lastLedgerCreatedTimestamp=quoted(iso(day, t, millis=True) for t in opened.tolist()),
        waitingCursorsCount=(ranges == 0).sum(axis=1).tolist(),
        lastConfirmedEntry=c.positions(p, last),
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
        out.append({metric: [f"{metric}{{{labels}}} " for labels in (topic if metric in TOPIC_SERIES else sub)] for metric in METRIC_HELP})
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
        "broker-config.jsonl": [
            dumps({"effective_at": at, "cluster": CLUSTER, "kind": "broker-config", "broker": broker_name(b), "policy": broker_config(0)})
            for b in range(BROKERS)
        ],
        "dispatch-rate.jsonl": [
            dumps(
                {
                    "effective_at": at,
                    "cluster": CLUSTER,
                    "kind": "namespace-subscription-dispatch-rate",
                    "namespace": ns,
                    "policy": dispatch_rate(200 * (n % 5 + 1)),
                }
            )
            for n, ns in enumerate(sorted(set(c.namespaces)))
        ],
    }


def write_large_day(landing: Path, day: date, partitions: int = 2000, minutes: int = MINUTES, seed: int = 0) -> dict[str, dict[str, int]]:
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
