"""``brokerlens demo-data``: a realistic day of landing files in Pulsar's own formats.

Layout (DESIGN.md "Landing formats", schemas/landing/README.md): ``<landing>/<day>/<kind>/...``
plus ``_demo_manifest.json`` listing the deliberately bad records and what the day should show.
Everything derives from (day, scale, seed): the same inputs give byte-identical files.
"""

from __future__ import annotations

import json
import shutil
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from brokerlens.platform.settings import Settings
from brokerlens.platform.stage import StageFailed, StageResult

from . import bad
from .cluster import CLUSTER, Cluster, SubSpec, TopicSpec, build_cluster
from .cursors import Cursor, layout_ledgers, ledger_list
from .dispatch import Demand, DispatchScopes, LimitSchedule, simulate_dispatch, write_dispatch_files

DAY = 86400
SNAPSHOTS = 300 + 600 * np.arange(144)  # topic stats every 10 minutes, 00:05 … 23:55
INTERNAL = SNAPSHOTS[17::18]  # internal stats every 3 hours, 02:55 … 23:55
METRICS = SNAPSHOTS[5::6]  # /metrics scrapes every hour, 00:55 … 23:55
CAP = 10_000
RANGE_BYTES = 26  # serialized bytes per range (≈ 5 MB at 200,000 ranges, seed 004)
MANIFEST = "_demo_manifest.json"
KINDS = ("topic-stats", "internal-stats", "dispatch", "producer-stats", "policies", "metrics")


def dumps(obj) -> str:
    # Jackson's compact output, as the admin REST API returns it.
    return json.dumps(obj, separators=(",", ":"))


def iso(day: date, second: float, millis: bool = False) -> str:
    t = datetime(day.year, day.month, day.day, tzinfo=timezone.utc) + timedelta(seconds=float(second))
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond // 1000:03d}" if millis else "") + "Z"


def hhmm(second: int) -> str:
    return f"{second // 3600:02d}{second % 3600 // 60:02d}"


def safe(name: str) -> str:
    return name.replace("persistent://", "").replace("/", "_").replace(":", "_")


class Day:
    """Everything simulated for one day, kept per topic partition × subscription."""

    def __init__(self, day: date, scale: float, seed: int):
        self.day, self.scale, self.seed = day, scale, seed
        self.cluster: Cluster = build_cluster(scale, seed)
        self.rng = np.random.Generator(np.random.PCG64([seed, 2]))
        # Partitions: (topic, index, name, broker).
        self.partitions = [(t, i, name, t.brokers[i]) for t in self.cluster.topics
                           for i, name in enumerate(t.partition_names())]
        self.exporter_partitions = [p for p in self.partitions if p[3] in self.cluster.exporter_brokers]
        n_bins = len(SNAPSHOTS)
        self.published = {p[2]: np.zeros(n_bins) for p in self.partitions}  # messages per 10-min bin
        self.delivered = {}  # (partition, sub) → (msgs, bytes, redelivered) per bin
        self.entry_rate = {p[2]: p[0].entry_rate for p in self.partitions}

    # --- dispatch -----------------------------------------------------------------------
    def effective_limits(self, scopes: DispatchScopes, sub_keys, topic_keys) -> dict[str, LimitSchedule]:
        """Quota schedules per level: topic policy > namespace policy > broker config."""
        c = self.cluster
        times = sorted({0, *(p.at for p in c.policies)})

        def value(v):
            return float(v) if v > 0 else np.inf

        def resolve(at, kind_topic, kind_ns, broker_keys, topic: TopicSpec, broker):
            found = {}
            for p in c.policies:  # the latest record per (kind, scope) at or before `at`
                if p.at <= at and p.kind in (kind_topic, kind_ns):
                    found[(p.kind, p.scope)] = p.policy
            policy = found.get((kind_topic, topic.name)) or found.get((kind_ns, topic.ns))
            if policy is not None:
                return value(policy["dispatchThrottlingRateInMsg"]), value(policy["dispatchThrottlingRateInByte"])
            conf = c.broker_config[broker]
            return value(conf[broker_keys[0]]), value(conf[broker_keys[1]])

        changes = {"subscription": [], "topic": [], "broker": []}
        for at in times:
            sub_q = np.array([resolve(at, "topic-subscription-dispatch-rate", "namespace-subscription-dispatch-rate",
                                      ("dispatchThrottlingRatePerSubscriptionInMsg", "dispatchThrottlingRatePerSubscriptionInByte"),
                                      t, b) for t, b in sub_keys]).reshape(-1, 2)
            top_q = np.array([resolve(at, "topic-dispatch-rate", "namespace-dispatch-rate",
                                      ("dispatchThrottlingRatePerTopicInMsg", "dispatchThrottlingRatePerTopicInByte"),
                                      t, b) for t, b in topic_keys]).reshape(-1, 2)
            brk_q = np.array([(value(c.broker_config[b]["dispatchThrottlingRateInMsg"]),
                               value(c.broker_config[b]["dispatchThrottlingRateInByte"])) for b in scopes.brokers])
            for lvl, q in (("subscription", sub_q), ("topic", top_q), ("broker", brk_q)):
                changes[lvl].append((at, q[:, 0].copy(), q[:, 1].copy()))
        return {lvl: LimitSchedule(v) for lvl, v in changes.items()}

    def simulate_dispatch(self, out_dir: Path) -> tuple[list[Path], int, list[dict]]:
        parts = self.exporter_partitions
        if not parts:
            return [], 0, []
        brokers = sorted({p[3] for p in parts}, key=self.cluster.brokers.index)
        sub_rows = [(pi, s) for pi, p in enumerate(parts) for s in p[0].subs]
        topic_of = np.array([pi for pi, _ in sub_rows])
        topics = [p[0] for p in parts]
        scopes = DispatchScopes(
            brokers=brokers, topics=[p[2] for p in parts],
            topic_broker=np.array([brokers.index(p[3]) for p in parts]),
            subscriptions=[s.name for _, s in sub_rows], sub_topic=topic_of,
            batch_mean=np.array([topics[pi].batch_mean for pi, _ in sub_rows]),
            msg_bytes=np.array([topics[pi].msg_bytes for pi, _ in sub_rows]),
            # Entries per read: min(receiverQueueSize, dispatcherMaxReadBatchSize).
            read_entries=np.array([float(min(s.receiver_queue_size,
                                             self.cluster.broker_config[parts[pi][3]]["dispatcherMaxReadBatchSize"]))
                                   for pi, s in sub_rows]),
            consumer_rate=np.array([s.consumer_rate for _, s in sub_rows]))
        limits = self.effective_limits(scopes, [(topics[pi], parts[pi][3]) for pi, _ in sub_rows],
                                       [(p[0], p[3]) for p in parts])
        idle = np.array([t.idle_activity for t in topics])
        seed = self.seed

        def arrivals(start, stop):
            rng = np.random.Generator(np.random.PCG64([seed, 3, start]))
            n = stop - start
            active = rng.random((n, len(parts))) < idle
            entries = np.where(active, 1 + rng.poisson(1.0, (n, len(parts))), 0)
            secs = np.arange(start, stop)
            for j, t in enumerate(topics):
                for b_start, b_len, rate in t.bursts:
                    inside = (secs >= b_start) & (secs < b_start + b_len)
                    if inside.any():
                        entries[inside, j] += rng.poisson(rate, int(inside.sum()))
            msgs = entries * np.array([t.batch_mean for t in topics])
            bins = np.searchsorted(SNAPSHOTS, secs, side="right")
            for j, p in enumerate(parts):
                self.published[p[2]] += np.bincount(bins, weights=msgs[:, j], minlength=len(SNAPSHOTS) + 1)[:len(SNAPSHOTS)]
            return entries

        def outage(start, stop):
            secs = np.arange(start, stop)[:, None]
            mask = np.zeros((stop - start, len(sub_rows)), dtype=bool)
            for k, (_, s) in enumerate(sub_rows):
                for o_start, o_len in s.outages:
                    mask[:, k] |= ((secs >= o_start) & (secs < o_start + o_len))[:, 0]
            return mask

        redeliveries: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k, (_, s) in enumerate(sub_rows):
            for at, n in s.redeliveries:
                subs, msgs = redeliveries.get(at, (np.array([], dtype=int), np.array([])))
                redeliveries[at] = (np.append(subs, k), np.append(msgs, float(n)))
        totals = np.zeros((len(sub_rows), 3, len(SNAPSHOTS)))

        def accumulate(levels):
            rec = levels["subscription"]
            bins = np.searchsorted(SNAPSHOTS, rec["period"], side="right")
            keep = bins < len(SNAPSHOTS)
            for f, field in enumerate(("msgs", "bytes", "redelivered_msgs")):
                np.add.at(totals[:, f, :], (rec["sub"][keep], bins[keep]), rec[field][keep])

        chunks = simulate_dispatch(scopes, limits, Demand(arrivals, outage, redeliveries), DAY, self.seed)
        files, records = write_dispatch_files(self.day, CLUSTER, out_dir, scopes, chunks, on_chunk=accumulate)
        for k, (pi, s) in enumerate(sub_rows):
            self.delivered[(parts[pi][2], s.name)] = totals[k]
        # Cursor positions follow what was actually published on these partitions.
        for p in parts:
            self.entry_rate[p[2]] = max(0.05, self.published[p[2]].sum() / p[0].batch_mean / DAY)
        scope_list = [{"level": "broker", "broker": b} for b in brokers]
        scope_list += [{"level": "topic", "broker": p[3], "topic": p[2]} for p in parts]
        scope_list += [{"level": "subscription", "broker": parts[pi][3], "topic": parts[pi][2], "subscription": s.name}
                       for pi, s in sub_rows]
        return files, records, scope_list

    def counters_without_exporter(self) -> None:
        """Published and delivered per 10-minute bin for partitions without dispatch records."""
        diurnal = 0.6 + 0.4 * np.sin((SNAPSHOTS / DAY - 0.3) * 2 * np.pi)
        for t, i, name, broker in self.partitions:
            if broker in self.cluster.exporter_brokers:
                continue
            entries = self.rng.poisson(t.entry_rate * 600 * diurnal)
            self.published[name] = entries * t.batch_mean
            for s in t.subs:
                msgs = self.published[name] * (1 + 0.02 * self.rng.random(len(SNAPSHOTS)))
                redelivered = np.round(msgs * (0.01 if s.type in ("Shared", "Key_Shared") else 0.0))
                self.delivered[(name, s.name)] = np.stack(
                    [np.round(msgs), np.round(msgs * t.msg_bytes), redelivered])

    # --- cursors ------------------------------------------------------------------------
    def build_cursors(self) -> None:
        self.cursors, self.ledgers = {}, {}
        next_id = 1000 + int(self.rng.integers(0, 500))
        for t, i, name, broker in self.partitions:
            base = int(self.rng.integers(2_000_000, 9_000_000))
            v = self.entry_rate[name]
            cursors = {}
            for s in t.subs:
                plan = self.cluster.plan(t, s, i)
                plan.entries_per_second = v
                cursors[s.name] = Cursor(plan, base, self.rng)
            first = min(c.first_offset() for c in cursors.values())
            last = max(c.frontier(DAY) for c in cursors.values()) + 10
            self.ledgers[name] = layout_ledgers(first, last, v, next_id, self.rng)
            next_id = int(self.ledgers[name].ids[-1]) + 1
            self.cursors[name] = cursors


def _sub_stats(day: Day, t: TopicSpec, s: SubSpec, name: str, k: int, second: int) -> dict:
    cursor = day.cursors[name][s.name]
    msgs, nbytes, redelivered = day.delivered[(name, s.name)]
    base = 10_000_000 + (hash_stable(name + s.name) % 5_000_000)
    out_counter, out_bytes = base + msgs[: k + 1].sum(), base * t.msg_bytes + nbytes[: k + 1].sum()
    reset = day.cluster.counter_resets.get(name)
    if reset is not None and second >= reset:
        after = SNAPSHOTS > reset
        # Counters restart at the reload; the bin holding it contributes the part after it.
        first_bin = int(np.argmax(after))
        share = (SNAPSHOTS[first_bin] - reset) / 600
        out_counter = msgs[first_bin] * share + msgs[first_bin + 1: k + 1].sum()
        out_bytes = nbytes[first_bin] * share + nbytes[first_bin + 1: k + 1].sum()
    ranges = cursor.count(second)
    holes = int(cursor.hole_lengths[:ranges].sum())
    unacked = int(holes * t.batch_mean) if s.type in ("Shared", "Key_Shared") else 0
    delayed = int(ranges * 0.9) if s.delayed else 0
    backlog = int(holes * t.batch_mean + day.rng.integers(0, 50))
    rate_out = float(msgs[k]) / 600
    consumers = []
    for c in range(s.consumers):
        consumers.append({
            "msgRateOut": round(rate_out / s.consumers, 3), "msgThroughputOut": round(nbytes[k] / 600 / s.consumers, 3),
            "bytesOutCounter": int(out_bytes // s.consumers), "msgOutCounter": int(out_counter // s.consumers),
            "msgRateRedeliver": round(redelivered[k] / 600 / s.consumers, 3), "messageAckRate": round(rate_out / s.consumers, 3),
            "chunkedMessageRate": 0.0, "consumerName": f"{s.name}-{c + 1}", "availablePermits": 1000 - int(day.rng.integers(0, 300)),
            "unackedMessages": unacked // s.consumers, "avgMessagesPerEntry": int(t.batch_mean),
            "blockedConsumerOnUnackedMsgs": False, "address": f"/10.0.{c + 4}.{hash_stable(s.name) % 200 + 20}:{40000 + c}",
            "connectedSince": iso(day.day, -86400 + 3600 * c, millis=True) if not (reset and second >= reset)
            else iso(day.day, reset + 2 + c, millis=True),
            "clientVersion": "Pulsar-Java-v3.3.2", "lastAckedTimestamp": 0, "lastConsumedTimestamp": 0,
            "lastConsumedFlowTimestamp": 0, "metadata": {}})
    stats = {
        "msgRateOut": round(rate_out, 3), "msgThroughputOut": round(nbytes[k] / 600, 3),
        "bytesOutCounter": int(out_bytes), "msgOutCounter": int(out_counter),
        "msgRateRedeliver": round(redelivered[k] / 600, 3), "messageAckRate": round(rate_out, 3),
        "chunkedMessageRate": 0, "msgBacklog": backlog, "backlogSize": int(backlog * t.msg_bytes),
        "earliestMsgPublishTimeInBacklog": 0, "msgBacklogNoDelayed": backlog - delayed,
        "blockedSubscriptionOnUnackedMsgs": False, "msgDelayed": delayed, "unackedMessages": unacked,
        "type": s.type, "msgRateExpired": 0.0, "totalMsgExpired": 0, "lastExpireTimestamp": 0,
        "lastConsumedFlowTimestamp": 0, "lastConsumedTimestamp": 0, "lastAckedTimestamp": 0,
        "lastMarkDeleteAdvancedTimestamp": 0, "consumers": consumers, "isDurable": True, "isReplicated": False,
        "allowOutOfOrderDelivery": False, "consumersAfterMarkDeletePosition": {},
        "nonContiguousDeletedMessagesRanges": ranges,
        "nonContiguousDeletedMessagesRangesSerializedSize": ranges * RANGE_BYTES + (16 if ranges else 0),
        "delayedMessageIndexSizeInBytes": delayed * 24, "subscriptionProperties": {},
        "filterProcessedMsgCount": 0, "filterAcceptedMsgCount": 0, "filterRejectedMsgCount": 0,
        "filterRescheduledMsgCount": 0, "replicated": False, "durable": True,
    }
    if s.type == "Key_Shared":
        stats["keySharedMode"] = "AUTO_SPLIT"
    return stats


def hash_stable(text: str) -> int:
    # Python's hash() is salted per process; files must not depend on it.
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def topic_stats(day: Day, t: TopicSpec, i: int, name: str, broker: str, k: int) -> dict:
    second = int(SNAPSHOTS[k])
    published = day.published[name]
    subs = {s.name: _sub_stats(day, t, s, name, k, second) for s in t.subs}
    in_counter = int(published[: k + 1].sum()) + 5_000_000
    reset = day.cluster.counter_resets.get(name)
    if reset is not None and second >= reset:
        in_counter = int(published[int(np.argmax(SNAPSHOTS > reset)): k + 1].sum())
    producers = [p for p in day.cluster.producers if p.topic is t]
    rate_in = float(published[k]) / 600
    publishers = [{
        "accessMode": "Shared", "msgRateIn": round(rate_in / max(len(producers), 1), 3),
        "msgThroughputIn": round(rate_in * t.msg_bytes / max(len(producers), 1), 3),
        "averageMsgSize": float(t.msg_bytes), "chunkedMessageRate": 0.0, "producerId": n,
        "supportsPartialProducer": False, "producerName": p.name,
        "address": f"/10.0.2.{hash_stable(p.name) % 200 + 20}:{50000 + n}",
        "connectedSince": iso(day.day, -40000, millis=True), "clientVersion": "Pulsar-Java-v3.3.2", "metadata": {},
    } for n, p in enumerate(producers)]
    return {
        "msgRateIn": round(rate_in, 3), "msgThroughputIn": round(rate_in * t.msg_bytes, 3),
        "msgRateOut": round(sum(s["msgRateOut"] for s in subs.values()), 3),
        "msgThroughputOut": round(sum(s["msgThroughputOut"] for s in subs.values()), 3),
        "bytesInCounter": int(in_counter * t.msg_bytes), "msgInCounter": in_counter,
        "bytesOutCounter": sum(s["bytesOutCounter"] for s in subs.values()),
        "msgOutCounter": sum(s["msgOutCounter"] for s in subs.values()),
        "averageMsgSize": float(t.msg_bytes), "msgChunkPublished": False,
        "storageSize": int(in_counter * t.msg_bytes // 3), "backlogSize": sum(s["backlogSize"] for s in subs.values()),
        "earliestMsgPublishTimeInBacklogs": 0, "offloadedStorageSize": 0, "lastOffloadLedgerId": 0,
        "lastOffloadSuccessTimeStamp": 0, "lastOffloadFailureTimeStamp": 0, "ongoingTxnCount": 0,
        "abortedTxnCount": 0, "committedTxnCount": 0, "publishers": publishers, "waitingPublishers": 0,
        "subscriptions": subs, "replication": {}, "deduplicationStatus": "Disabled",
        "nonContiguousDeletedMessagesRanges": sum(s["nonContiguousDeletedMessagesRanges"] for s in subs.values()),
        "nonContiguousDeletedMessagesRangesSerializedSize": sum(
            s["nonContiguousDeletedMessagesRangesSerializedSize"] for s in subs.values()),
        "delayedMessageIndexSizeInBytes": sum(s["delayedMessageIndexSizeInBytes"] for s in subs.values()),
        "compaction": {"lastCompactionRemovedEventCount": 0, "lastCompactionSucceedTimestamp": 0,
                       "lastCompactionFailedTimestamp": 0, "lastCompactionDurationTimeInMills": 0},
        "ownerBroker": broker, "topicEpoch": 0,
    }


def _sum_stats(parts: list[dict], n: int) -> dict:
    """PartitionedTopicStats: the partitions' stats summed, plus metadata and per-partition stats."""
    first = parts[0]
    total = {k: v for k, v in first.items() if k not in ("subscriptions", "publishers", "ownerBroker", "topicEpoch")}
    for key in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter", "msgInCounter",
                "bytesOutCounter", "msgOutCounter", "storageSize", "backlogSize",
                "nonContiguousDeletedMessagesRanges", "nonContiguousDeletedMessagesRangesSerializedSize",
                "delayedMessageIndexSizeInBytes"):
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
                array.add({"collected_at": iso(day.day, second), "cluster": CLUSTER, "broker": t.brokers[0],
                           "topic": t.name, "stats": body})
            else:
                for i, name in enumerate(names):
                    array.add({"collected_at": iso(day.day, second), "cluster": CLUSTER, "broker": t.brokers[i],
                               "topic": name, "stats": stats[i]})
        records += array.close()
    return len(SNAPSHOTS), records


def write_internal_stats(day: Day, out: Path) -> tuple[int, int, list[dict]]:
    records = 0
    spanning = []
    for second in INTERNAL:
        array = _EnvelopeArray(out / f"snapshot-{hhmm(int(second))}.json")
        for t, i, name, broker in day.partitions:
            ledgers = day.ledgers[name]
            cursors, states = {}, {}
            for s in t.subs:
                st = day.cursors[name][s.name].state(float(second), ledgers)
                states[s.name] = st
                cursors[s.name] = {
                    "markDeletePosition": st["mark"], "readPosition": st["read"], "waitingReadOp": st["ranges"] == 0,
                    "pendingReadOps": 0, "messagesConsumedCounter": int(day.delivered[(name, s.name)][0].sum()),
                    "cursorLedger": int(ledgers.ids[-1]) + 7, "cursorLedgerLastEntry": int(second) // 60,
                    "individuallyDeletedMessages": st["text"], "lastLedgerSwitchTimestamp": iso(day.day, 0, millis=True),
                    "state": "Open", "active": True, "numberOfEntriesSinceFirstNotAckedMessage":
                        int(day.cursors[name][s.name].frontier(float(second)) - st["mark_offset"]),
                    "totalNonContiguousDeletedMessagesRange": st["ranges"],
                    "subscriptionHavePendingRead": False, "subscriptionHavePendingReplayRead": False,
                    "properties": {}}
                if second == INTERNAL[-1] and st["ranges"] and _spans_ledgers(st["text"]):
                    spanning.append({"topic": name, "subscription": s.name})
            oldest = min(day.cursors[name][s].first_offset() for s in cursors)
            frontier = max(day.cursors[name][s].frontier(float(second)) for s in cursors)
            entry_bytes = t.batch_mean * t.msg_bytes
            ledger_info, current_entries, current_size = ledger_list(ledgers, oldest, frontier, entry_bytes)
            last_ledger = ledger_info[-1]["ledgerId"]
            stats = {
                "entriesAddedCounter": int(frontier - ledgers.starts[0]), "numberOfEntries": int(frontier - oldest),
                "totalSize": int((frontier - oldest) * entry_bytes), "currentLedgerEntries": current_entries,
                "currentLedgerSize": current_size, "lastLedgerCreatedTimestamp": iso(day.day, max(0, int(second) - 3000), millis=True),
                "waitingCursorsCount": sum(1 for c in cursors.values() if c["waitingReadOp"]),
                "pendingAddEntriesCount": 0, "lastConfirmedEntry": f"{last_ledger}:{current_entries - 1}",
                "state": "LedgerOpened", "ledgers": ledger_info, "cursors": cursors, "schemaLedgers": [],
                "compactedLedger": {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False},
            }
            array.add({"collected_at": iso(day.day, int(second)), "cluster": CLUSTER, "broker": broker,
                       "topic": name, "stats": stats})
        records += array.close()
    return len(INTERNAL), records, spanning


def _spans_ledgers(text: str) -> bool:
    # Cheap check on the final snapshot: a range whose two ends name different ledgers.
    for part in text[1:-1].split(", "):
        lo, hi = part[1:-1].split("..")
        if lo.split(":")[0] != hi.split(":")[0]:
            return True
    return False


def write_producer_stats(day: Day, out: Path) -> tuple[int, int]:
    records = 0
    for p in day.cluster.producers:
        t = p.topic
        names = t.partition_names()
        published = sum(day.published[n] for n in names)
        lines = []
        total_msgs = total_bytes = total_failed = 0
        rng = np.random.Generator(np.random.PCG64([day.seed, 4, hash_stable(p.name)]))
        n_parts = max(t.partitions, 1)
        batch_cap = min(p.config["batchingMaxMessages"], p.config["maxPendingMessages"] // 2 if p.issues == [
            "batching-max-messages-over-max-pending"] else p.config["batchingMaxMessages"])
        for k, second in enumerate(SNAPSHOTS):
            # The client's stats interval is 60 s: numbers are for the last minute.
            msgs = int(published[k] / 10)
            failed = {kind: int(rng.poisson(rate)) for kind, rate in p.send_failures.items()}
            n_failed = sum(failed.values())
            msg_bytes = msgs * t.msg_bytes
            compressed = int(msg_bytes * (0.45 if p.config["compressionType"] != "NONE" else 1.0))
            batches = 0 if msgs == 0 else (msgs if not p.config["batchingEnabled"] else
                                            max(1, int(msgs / min(batch_cap, max(1.0, t.batch_mean * 3)))))
            total_msgs += msgs
            total_bytes += compressed
            total_failed += n_failed
            slow = "memory-limit-too-small" in p.issues
            lat = float(rng.uniform(2.0, 4.0)) * (6 if slow else 1)
            pending = int(p.config["maxPendingMessages"] * (0.98 if slow or p.issues[:1] == ["batching-max-messages-over-max-pending"]
                                                            else rng.uniform(0.02, 0.2)))
            stats = {
                "numMsgsSent": msgs, "numBytesSent": compressed, "numSendFailed": n_failed, "numAcksReceived": msgs,
                "sendMsgsRate": round(msgs / 60, 3), "sendBytesRate": round(compressed / 60, 3),
                "sendLatencyMillis50pct": round(lat, 3), "sendLatencyMillis75pct": round(lat * 1.3, 3),
                "sendLatencyMillis95pct": round(lat * 2.4, 3), "sendLatencyMillis99pct": round(lat * 4, 3),
                "sendLatencyMillis999pct": round(lat * 12, 3), "sendLatencyMillisMax": round(lat * 25, 3),
                "totalMsgsSent": total_msgs, "totalBytesSent": total_bytes, "totalSendFailed": total_failed,
                "totalAcksReceived": total_msgs, "pendingQueueSize": pending,
            }
            if t.partitions:
                weights = np.ones(n_parts)
                weights[0] += p.skew * n_parts
                weights /= weights.sum()
                stats["partitionStats"] = {n: {"sendMsgsRate": round(msgs / 60 * w, 3)} for n, w in zip(names, weights)}
            rec = {"collected_at": iso(day.day, int(second)), "cluster": CLUSTER, "topic": t.name,
                   "producer_name": p.name, "partitions": t.partitions, "config": p.config,
                   "client": {"memoryLimitBytes": p.memory_limit}, "stats": stats,
                   "extra": {"numBatchesSent": batches, "uncompressedBytesSent": int(msg_bytes),
                             "sendFailedByKind": {"ProducerQueueIsFullError": failed.get("ProducerQueueIsFullError", 0),
                                                  "MemoryBufferIsFullError": 0, "TimeoutException": 0}}}
            lines.append(dumps(rec))
        (out / f"{p.name}.jsonl").write_text("\n".join(lines) + "\n")
        records += len(lines)
    return len(day.cluster.producers), records


def write_policies(day: Day, out: Path) -> tuple[int, int, list[dict]]:
    c = day.cluster
    broker_lines = [dumps({"effective_at": iso(day.day, 0), "cluster": CLUSTER, "kind": "broker-config",
                           "broker": b, "policy": c.broker_config[b]}) for b in c.brokers]
    (out / "broker-config.jsonl").write_text("\n".join(broker_lines) + "\n")
    lines, changes = [], []
    for p in sorted(c.policies, key=lambda p: (p.at, p.kind, p.scope)):
        scope_key = "topic" if p.kind.startswith("topic") else "namespace"
        rec = {"effective_at": iso(day.day, p.at), "cluster": CLUSTER, "kind": p.kind, scope_key: p.scope,
               "policy": p.policy}
        lines.append(dumps(rec))
        changes.append({k: v for k, v in rec.items() if k != "cluster"})
    (out / "dispatch-rate.jsonl").write_text("\n".join(lines) + "\n")
    return 2, len(broker_lines) + len(lines), changes


METRIC_HELP = {
    "pulsar_rate_in": "gauge", "pulsar_rate_out": "gauge", "pulsar_throughput_in": "gauge",
    "pulsar_throughput_out": "gauge", "pulsar_storage_size": "gauge", "pulsar_msg_backlog": "gauge",
    "pulsar_in_messages_total": "counter", "pulsar_out_messages_total": "counter",
    "pulsar_subscription_back_log": "gauge", "pulsar_subscription_msg_rate_out": "gauge",
    "pulsar_subscription_msg_throughput_out": "gauge", "pulsar_subscription_msg_rate_redeliver": "gauge",
    "pulsar_subscription_unacked_messages": "gauge", "pulsar_subscription_delayed": "gauge",
    "pulsar_subscription_consumers_count": "gauge",
}


def write_metrics(day: Day, out: Path) -> tuple[int, int]:
    files = 0
    for second in METRICS:
        k = int(np.searchsorted(SNAPSHOTS, second))
        samples: dict[str, dict[str, list[str]]] = {}
        for t, i, name, broker in day.partitions:
            st = topic_stats(day, t, i, name, broker, k)
            labels = f'cluster="{CLUSTER}",namespace="{t.ns}",topic="{name}"'
            rows = samples.setdefault(broker, {m: [] for m in METRIC_HELP})
            for metric, value in (("pulsar_rate_in", st["msgRateIn"]), ("pulsar_rate_out", st["msgRateOut"]),
                                  ("pulsar_throughput_in", st["msgThroughputIn"]),
                                  ("pulsar_throughput_out", st["msgThroughputOut"]),
                                  ("pulsar_storage_size", st["storageSize"]),
                                  ("pulsar_msg_backlog", sum(s["msgBacklog"] for s in st["subscriptions"].values())),
                                  ("pulsar_in_messages_total", st["msgInCounter"]),
                                  ("pulsar_out_messages_total", st["msgOutCounter"])):
                rows[metric].append(f"{metric}{{{labels}}} {float(value)}")
            for sub, s in st["subscriptions"].items():
                sl = f'{labels},subscription="{sub}"'
                for metric, value in (("pulsar_subscription_back_log", s["msgBacklog"]),
                                      ("pulsar_subscription_msg_rate_out", s["msgRateOut"]),
                                      ("pulsar_subscription_msg_throughput_out", s["msgThroughputOut"]),
                                      ("pulsar_subscription_msg_rate_redeliver", s["msgRateRedeliver"]),
                                      ("pulsar_subscription_unacked_messages", s["unackedMessages"]),
                                      ("pulsar_subscription_delayed", s["msgDelayed"]),
                                      ("pulsar_subscription_consumers_count", len(s["consumers"]))):
                    rows[metric].append(f"{metric}{{{sl}}} {float(value)}")
        for broker, rows in samples.items():
            head = dumps({"collected_at": iso(day.day, int(second)), "cluster": CLUSTER, "broker": broker})
            text = [f"# brokerlens: {head}"]
            for metric, kind in METRIC_HELP.items():
                text.append(f"# TYPE {metric} {kind}")
                text += rows[metric]
            (out / f"{safe(broker)}-{hhmm(int(second))}.prom").write_text("\n".join(text) + "\n")
            files += 1
    return files, files


def generate_day(day: date, settings: Settings, scale: float = 1.0, seed: int = 7) -> StageResult:
    """Write ``<landing>/<day>/<kind>/...`` for all six kinds and ``_demo_manifest.json``."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    root = settings.landing / day.isoformat()
    if root.exists():
        if not (root / MANIFEST).is_file():
            # Never delete collected data: only a day demo-data wrote is replaced.
            raise StageFailed(f"{root} holds landing files that demo-data did not write; "
                              "choose another day or remove them first")
        shutil.rmtree(root)  # a re-run replaces the day: same seed, same files
    dirs = {kind: root / kind for kind in KINDS}
    for d in dirs.values():
        d.mkdir(parents=True)
    # Marks the day as demo-data's from the start, so a run killed half-way can be replaced.
    (root / MANIFEST).write_text(json.dumps({"format": bad.MANIFEST_FORMAT, "complete": False}) + "\n")
    sim = Day(day, scale, seed)
    counts: dict[str, dict[str, int]] = {}
    dispatch_files, dispatch_records, dispatch_scopes = sim.simulate_dispatch(dirs["dispatch"])
    counts["dispatch"] = {"files": len(dispatch_files), "records": dispatch_records}
    sim.counters_without_exporter()
    sim.build_cursors()
    f, r = write_topic_stats(sim, dirs["topic-stats"])
    counts["topic-stats"] = {"files": f, "records": r}
    f, r, spanning = write_internal_stats(sim, dirs["internal-stats"])
    counts["internal-stats"] = {"files": f, "records": r}
    f, r = write_producer_stats(sim, dirs["producer-stats"])
    counts["producer-stats"] = {"files": f, "records": r}
    f, r, policy_changes = write_policies(sim, dirs["policies"])
    counts["policies"] = {"files": f, "records": r}
    f, r = write_metrics(sim, dirs["metrics"])
    counts["metrics"] = {"files": f, "records": r}
    bad_records = bad.sprinkle(root, settings.landing, day, CLUSTER)
    manifest = bad.manifest(sim, day, scale, seed, counts, bad_records, dispatch_scopes, policy_changes, spanning)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    result = StageResult(stage="demo-data", day=day)
    result.metrics.update({"files": sum(c["files"] for c in counts.values()),
                           "records": sum(c["records"] for c in counts.values()),
                           "bad_records": len(bad_records), "bytes": size})
    result.lines.append(f"landing: {root}")
    result.lines += [f"{kind}: {c['files']} files, {c['records']} records" for kind, c in counts.items()]
    exp = manifest["expectations"]
    result.lines.append(f"over cap: {len(exp['subscriptions_over_cap'])}, near cap: {len(exp['subscriptions_near_cap'])}, "
                        f"bad producers: {len(exp['bad_producers'])}, deliberately bad records: {len(bad_records)}")
    return result
