"""Topic stats (TopicStats / PartitionedTopicStats, subscriptions with their consumers) and
internal stats (PersistentTopicInternalStats: ledgers and cursors with individuallyDeletedMessages)
as the demo's collector writes them, one JSON array of envelopes per collection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .cluster import CLUSTER, SubSpec, TopicSpec
from .cursors import ledger_list
from .schedule import INTERNAL, SNAPSHOTS, dumps, fill, hash_stable, hhmm, iso

if TYPE_CHECKING:
    from .day import Day

RANGE_BYTES = 26  # serialized bytes per range (≈ 5 MB at 200,000 ranges)

# The fields of each stats object in the admin API's order, with the values the demo's cluster
# never varies (transactions, offload, compaction, ...); None marks a field each snapshot sets.
# Kept as compact tables, a few fields a line, as the admin API lists them.
# fmt: off
CONSUMER_FIELDS = {
    "msgRateOut": None, "msgThroughputOut": None, "bytesOutCounter": None, "msgOutCounter": None,
    "msgRateRedeliver": None, "messageAckRate": None, "chunkedMessageRate": 0.0, "consumerName": None,
    "availablePermits": None, "unackedMessages": None, "avgMessagesPerEntry": None,
    "blockedConsumerOnUnackedMsgs": False, "address": None, "connectedSince": None,
    "clientVersion": "Pulsar-Java-v3.3.2", "lastAckedTimestamp": 0, "lastConsumedTimestamp": 0,
    "lastConsumedFlowTimestamp": 0, "metadata": {}}
SUBSCRIPTION_FIELDS = {
    "msgRateOut": None, "msgThroughputOut": None, "bytesOutCounter": None, "msgOutCounter": None,
    "msgRateRedeliver": None, "messageAckRate": None, "chunkedMessageRate": 0, "msgBacklog": None,
    "backlogSize": None, "earliestMsgPublishTimeInBacklog": 0, "msgBacklogNoDelayed": None,
    "blockedSubscriptionOnUnackedMsgs": False, "msgDelayed": None, "unackedMessages": None, "type": None,
    "msgRateExpired": 0.0, "totalMsgExpired": 0, "lastExpireTimestamp": 0, "lastConsumedFlowTimestamp": 0,
    "lastConsumedTimestamp": 0, "lastAckedTimestamp": 0, "lastMarkDeleteAdvancedTimestamp": 0,
    "consumers": None, "isDurable": True, "isReplicated": False, "allowOutOfOrderDelivery": False,
    "consumersAfterMarkDeletePosition": {}, "nonContiguousDeletedMessagesRanges": None,
    "nonContiguousDeletedMessagesRangesSerializedSize": None, "delayedMessageIndexSizeInBytes": None,
    "subscriptionProperties": {}, "filterProcessedMsgCount": 0, "filterAcceptedMsgCount": 0,
    "filterRejectedMsgCount": 0, "filterRescheduledMsgCount": 0, "replicated": False, "durable": True}
PUBLISHER_FIELDS = {
    "accessMode": "Shared", "msgRateIn": None, "msgThroughputIn": None, "averageMsgSize": None,
    "chunkedMessageRate": 0.0, "producerId": None, "supportsPartialProducer": False, "producerName": None,
    "address": None, "connectedSince": None, "clientVersion": "Pulsar-Java-v3.3.2", "metadata": {}}
TOPIC_FIELDS = {
    "msgRateIn": None, "msgThroughputIn": None, "msgRateOut": None, "msgThroughputOut": None,
    "bytesInCounter": None, "msgInCounter": None, "bytesOutCounter": None, "msgOutCounter": None,
    "averageMsgSize": None, "msgChunkPublished": False, "storageSize": None, "backlogSize": None,
    "earliestMsgPublishTimeInBacklogs": 0, "offloadedStorageSize": 0, "lastOffloadLedgerId": 0,
    "lastOffloadSuccessTimeStamp": 0, "lastOffloadFailureTimeStamp": 0, "ongoingTxnCount": 0,
    "abortedTxnCount": 0, "committedTxnCount": 0, "publishers": None, "waitingPublishers": 0,
    "subscriptions": None, "replication": {}, "deduplicationStatus": "Disabled",
    "nonContiguousDeletedMessagesRanges": None, "nonContiguousDeletedMessagesRangesSerializedSize": None,
    "delayedMessageIndexSizeInBytes": None,
    "compaction": {"lastCompactionRemovedEventCount": 0, "lastCompactionSucceedTimestamp": 0,
                   "lastCompactionFailedTimestamp": 0, "lastCompactionDurationTimeInMills": 0},
    "ownerBroker": None, "topicEpoch": 0}
CURSOR_FIELDS = {
    "markDeletePosition": None, "readPosition": None, "waitingReadOp": None, "pendingReadOps": 0,
    "messagesConsumedCounter": None, "cursorLedger": None, "cursorLedgerLastEntry": None,
    "individuallyDeletedMessages": None, "lastLedgerSwitchTimestamp": None, "state": "Open", "active": True,
    "numberOfEntriesSinceFirstNotAckedMessage": None, "totalNonContiguousDeletedMessagesRange": None,
    "subscriptionHavePendingRead": False, "subscriptionHavePendingReplayRead": False, "properties": {}}
MANAGED_LEDGER_FIELDS = {
    "entriesAddedCounter": None, "numberOfEntries": None, "totalSize": None, "currentLedgerEntries": None,
    "currentLedgerSize": None, "lastLedgerCreatedTimestamp": None, "waitingCursorsCount": None,
    "pendingAddEntriesCount": 0, "lastConfirmedEntry": None, "state": "LedgerOpened", "ledgers": None,
    "cursors": None, "schemaLedgers": [],
    "compactedLedger": {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False}}
# fmt: on


def serialized_size(ranges):
    """nonContiguousDeletedMessagesRangesSerializedSize for a range count (int or array)."""
    return ranges * RANGE_BYTES + (ranges > 0) * 16


def _sub_stats(day: Day, t: TopicSpec, s: SubSpec, name: str, k: int, second: int) -> dict:
    cursor = day.cursors[name][s.name]
    msgs, nbytes, redelivered = day.delivered[(name, s.name)]
    base = 10_000_000 + (hash_stable(name + s.name) % 5_000_000)
    out_counter, out_bytes = base + msgs[: k + 1].sum(), base * t.msg_bytes + nbytes[: k + 1].sum()
    reset = day.cluster.counter_resets.get(name)
    if reset is not None and second >= reset:
        after = reset < SNAPSHOTS
        # Counters restart at the reload; the bin holding it contributes the part after it.
        first_bin = int(np.argmax(after))
        share = (SNAPSHOTS[first_bin] - reset) / 600
        out_counter = msgs[first_bin] * share + msgs[first_bin + 1 : k + 1].sum()
        out_bytes = nbytes[first_bin] * share + nbytes[first_bin + 1 : k + 1].sum()
    ranges = cursor.count(second)
    holes = int(cursor.hole_lengths[:ranges].sum())
    unacked = int(holes * t.batch_mean) if s.type in ("Shared", "Key_Shared") else 0
    delayed = int(ranges * 0.9) if s.delayed else 0
    backlog = int(holes * t.batch_mean + day.rng.integers(0, 50))
    rate_out = float(msgs[k]) / 600
    consumers = []
    for c in range(s.consumers):
        consumers.append(
            fill(
                CONSUMER_FIELDS,
                msgRateOut=round(rate_out / s.consumers, 3),
                msgThroughputOut=round(nbytes[k] / 600 / s.consumers, 3),
                bytesOutCounter=int(out_bytes // s.consumers),
                msgOutCounter=int(out_counter // s.consumers),
                msgRateRedeliver=round(redelivered[k] / 600 / s.consumers, 3),
                messageAckRate=round(rate_out / s.consumers, 3),
                consumerName=f"{s.name}-{c + 1}",
                availablePermits=1000 - int(day.rng.integers(0, 300)),
                unackedMessages=unacked // s.consumers,
                avgMessagesPerEntry=int(t.batch_mean),
                address=f"/10.0.{c + 4}.{hash_stable(s.name) % 200 + 20}:{40000 + c}",
                connectedSince=iso(day.day, -86400 + 3600 * c, millis=True) if not (reset and second >= reset) else iso(day.day, reset + 2 + c, millis=True),
            )
        )
    stats = fill(
        SUBSCRIPTION_FIELDS,
        msgRateOut=round(rate_out, 3),
        msgThroughputOut=round(nbytes[k] / 600, 3),
        bytesOutCounter=int(out_bytes),
        msgOutCounter=int(out_counter),
        msgRateRedeliver=round(redelivered[k] / 600, 3),
        messageAckRate=round(rate_out, 3),
        msgBacklog=backlog,
        backlogSize=int(backlog * t.msg_bytes),
        msgBacklogNoDelayed=backlog - delayed,
        msgDelayed=delayed,
        unackedMessages=unacked,
        type=s.type,
        consumers=consumers,
        nonContiguousDeletedMessagesRanges=ranges,
        nonContiguousDeletedMessagesRangesSerializedSize=serialized_size(ranges),
        delayedMessageIndexSizeInBytes=delayed * 24,
    )
    if s.type == "Key_Shared":
        stats["keySharedMode"] = "AUTO_SPLIT"
    return stats


def topic_stats(day: Day, t: TopicSpec, i: int, name: str, broker: str, k: int) -> dict:
    second = int(SNAPSHOTS[k])
    published = day.published[name]
    subs = {s.name: _sub_stats(day, t, s, name, k, second) for s in t.subs}
    in_counter = int(published[: k + 1].sum()) + 5_000_000
    reset = day.cluster.counter_resets.get(name)
    if reset is not None and second >= reset:
        in_counter = int(published[int(np.argmax(reset < SNAPSHOTS)) : k + 1].sum())
    producers = [p for p in day.cluster.producers if p.topic is t]
    rate_in = float(published[k]) / 600
    publishers = [
        fill(
            PUBLISHER_FIELDS,
            msgRateIn=round(rate_in / max(len(producers), 1), 3),
            msgThroughputIn=round(rate_in * t.msg_bytes / max(len(producers), 1), 3),
            averageMsgSize=float(t.msg_bytes),
            producerId=n,
            producerName=p.name,
            address=f"/10.0.2.{hash_stable(p.name) % 200 + 20}:{50000 + n}",
            connectedSince=iso(day.day, -40000, millis=True),
        )
        for n, p in enumerate(producers)
    ]
    return fill(
        TOPIC_FIELDS,
        msgRateIn=round(rate_in, 3),
        msgThroughputIn=round(rate_in * t.msg_bytes, 3),
        msgRateOut=round(sum(s["msgRateOut"] for s in subs.values()), 3),
        msgThroughputOut=round(sum(s["msgThroughputOut"] for s in subs.values()), 3),
        bytesInCounter=int(in_counter * t.msg_bytes),
        msgInCounter=in_counter,
        bytesOutCounter=sum(s["bytesOutCounter"] for s in subs.values()),
        msgOutCounter=sum(s["msgOutCounter"] for s in subs.values()),
        averageMsgSize=float(t.msg_bytes),
        storageSize=int(in_counter * t.msg_bytes // 3),
        backlogSize=sum(s["backlogSize"] for s in subs.values()),
        publishers=publishers,
        subscriptions=subs,
        nonContiguousDeletedMessagesRanges=sum(s["nonContiguousDeletedMessagesRanges"] for s in subs.values()),
        nonContiguousDeletedMessagesRangesSerializedSize=sum(s["nonContiguousDeletedMessagesRangesSerializedSize"] for s in subs.values()),
        delayedMessageIndexSizeInBytes=sum(s["delayedMessageIndexSizeInBytes"] for s in subs.values()),
        ownerBroker=broker,
    )


def _sum_stats(parts: list[dict], n: int) -> dict:
    """PartitionedTopicStats: the partitions' stats summed, plus metadata and per-partition stats."""
    first = parts[0]
    total = {k: v for k, v in first.items() if k not in ("subscriptions", "publishers", "ownerBroker", "topicEpoch")}
    for key in (
        "msgRateIn",
        "msgThroughputIn",
        "msgRateOut",
        "msgThroughputOut",
        "bytesInCounter",
        "msgInCounter",
        "bytesOutCounter",
        "msgOutCounter",
        "storageSize",
        "backlogSize",
        "nonContiguousDeletedMessagesRanges",
        "nonContiguousDeletedMessagesRangesSerializedSize",
        "delayedMessageIndexSizeInBytes",
    ):
        total[key] = round(sum(p[key] for p in parts), 3) if isinstance(first[key], float) else sum(p[key] for p in parts)
    subs = {}
    for name in first["subscriptions"]:
        merged = dict(first["subscriptions"][name])
        for key, value in merged.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "lastExpireTimestamp":
                merged[key] = sum(p["subscriptions"][name][key] for p in parts)
        merged["consumers"] = [c for p in parts for c in p["subscriptions"][name]["consumers"]]
        subs[name] = merged
    total["publishers"] = [pub for p in parts for pub in p["publishers"]]
    total["subscriptions"] = subs
    total["metadata"] = {"partitions": n, "deleted": False}
    return total


class _EnvelopeArray:
    """One collection's envelopes as a JSON array, written as they are made (bounded memory)."""

    def __init__(self, path: Path):
        self.file = path.open("w")
        self.count = 0

    def add(self, envelope: dict) -> None:
        self.file.write(("[" if self.count == 0 else ",") + dumps(envelope))
        self.count += 1

    def close(self) -> int:
        self.file.write(("]" if self.count else "[]") + "\n")
        self.file.close()
        return self.count


def write_topic_stats(day: Day, out: Path) -> tuple[int, int]:
    """One file per collection (every 10 minutes) with every topic's stats, like `collect` writes."""
    records = 0
    for k, second in enumerate(SNAPSHOTS):
        array = _EnvelopeArray(out / f"snapshot-{hhmm(int(second))}.json")
        for t in day.cluster.topics:
            names = t.partition_names()
            stats = [topic_stats(day, t, i, name, t.brokers[i], k) for i, name in enumerate(names)]
            if t.stats_shape == "partitioned":
                body = _sum_stats(stats, t.partitions)
                body["partitions"] = dict(zip(names, stats))
                array.add({"collected_at": iso(day.day, second), "cluster": CLUSTER, "broker": t.brokers[0], "topic": t.name, "stats": body})
            else:
                for i, name in enumerate(names):
                    array.add({"collected_at": iso(day.day, second), "cluster": CLUSTER, "broker": t.brokers[i], "topic": name, "stats": stats[i]})
        records += array.close()
    return len(SNAPSHOTS), records


def write_internal_stats(day: Day, out: Path) -> tuple[int, int, list[dict]]:
    records = 0
    spanning = []
    for second in INTERNAL:
        array = _EnvelopeArray(out / f"snapshot-{hhmm(int(second))}.json")
        for t, _i, name, broker in day.partitions:
            ledgers = day.ledgers[name]
            cursors, states = {}, {}
            for s in t.subs:
                st = day.cursors[name][s.name].state(float(second), ledgers)
                states[s.name] = st
                cursors[s.name] = fill(
                    CURSOR_FIELDS,
                    markDeletePosition=st["mark"],
                    readPosition=st["read"],
                    waitingReadOp=st["ranges"] == 0,
                    messagesConsumedCounter=int(day.delivered[(name, s.name)][0].sum()),
                    cursorLedger=int(ledgers.ids[-1]) + 7,
                    cursorLedgerLastEntry=int(second) // 60,
                    individuallyDeletedMessages=st["text"],
                    lastLedgerSwitchTimestamp=iso(day.day, 0, millis=True),
                    numberOfEntriesSinceFirstNotAckedMessage=int(day.cursors[name][s.name].frontier(float(second)) - st["mark_offset"]),
                    totalNonContiguousDeletedMessagesRange=st["ranges"],
                )
                if second == INTERNAL[-1] and st["ranges"] and _spans_ledgers(st["text"]):
                    spanning.append({"topic": name, "subscription": s.name})
            oldest = min(day.cursors[name][s].first_offset() for s in cursors)
            frontier = max(day.cursors[name][s].frontier(float(second)) for s in cursors)
            entry_bytes = t.batch_mean * t.msg_bytes
            ledger_info, current_entries, current_size = ledger_list(ledgers, oldest, frontier, entry_bytes)
            last_ledger = ledger_info[-1]["ledgerId"]
            stats = fill(
                MANAGED_LEDGER_FIELDS,
                entriesAddedCounter=int(frontier - ledgers.starts[0]),
                numberOfEntries=int(frontier - oldest),
                totalSize=int((frontier - oldest) * entry_bytes),
                currentLedgerEntries=current_entries,
                currentLedgerSize=current_size,
                lastLedgerCreatedTimestamp=iso(day.day, max(0, int(second) - 3000), millis=True),
                waitingCursorsCount=sum(1 for c in cursors.values() if c["waitingReadOp"]),
                lastConfirmedEntry=f"{last_ledger}:{current_entries - 1}",
                ledgers=ledger_info,
                cursors=cursors,
            )
            array.add({"collected_at": iso(day.day, int(second)), "cluster": CLUSTER, "broker": broker, "topic": name, "stats": stats})
        records += array.close()
    return len(INTERNAL), records, spanning


def _spans_ledgers(text: str) -> bool:
    # Cheap check on the final snapshot: a range whose two ends name different ledgers.
    for part in text[1:-1].split(", "):
        lo, hi = part[1:-1].split("..")
        if lo.split(":")[0] != hi.split(":")[0]:
            return True
    return False
