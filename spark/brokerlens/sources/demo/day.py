"""The simulated day behind ``brokerlens demo-data``: the cluster, its dispatch under the
effective quotas, what was published and delivered, and every cursor; the writers of each kind
read it."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np

from .cluster import CLUSTER, Cluster, TopicSpec, build_cluster
from .cursors import Cursor, layout_ledgers
from .dispatch import Demand, DispatchScopes, LimitSchedule, simulate_dispatch, write_dispatch_files
from .schedule import DAY, SNAPSHOTS


class Day:
    """Everything simulated for one day, kept per topic partition × subscription."""

    def __init__(self, day: date, scale: float, seed: int):
        self.day, self.scale, self.seed = day, scale, seed
        self.cluster: Cluster = build_cluster(scale, seed)
        self.rng = np.random.Generator(np.random.PCG64([seed, 2]))
        # Partitions: (topic, index, name, broker).
        self.partitions = [(t, i, name, t.brokers[i]) for t in self.cluster.topics for i, name in enumerate(t.partition_names())]
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
            sub_q = np.array(
                [
                    resolve(
                        at,
                        "topic-subscription-dispatch-rate",
                        "namespace-subscription-dispatch-rate",
                        ("dispatchThrottlingRatePerSubscriptionInMsg", "dispatchThrottlingRatePerSubscriptionInByte"),
                        t,
                        b,
                    )
                    for t, b in sub_keys
                ]
            ).reshape(-1, 2)
            top_q = np.array(
                [
                    resolve(
                        at,
                        "topic-dispatch-rate",
                        "namespace-dispatch-rate",
                        ("dispatchThrottlingRatePerTopicInMsg", "dispatchThrottlingRatePerTopicInByte"),
                        t,
                        b,
                    )
                    for t, b in topic_keys
                ]
            ).reshape(-1, 2)
            brk_q = np.array(
                [(value(c.broker_config[b]["dispatchThrottlingRateInMsg"]), value(c.broker_config[b]["dispatchThrottlingRateInByte"])) for b in scopes.brokers]
            )
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
            brokers=brokers,
            topics=[p[2] for p in parts],
            topic_broker=np.array([brokers.index(p[3]) for p in parts]),
            subscriptions=[s.name for _, s in sub_rows],
            sub_topic=topic_of,
            batch_mean=np.array([topics[pi].batch_mean for pi, _ in sub_rows]),
            msg_bytes=np.array([topics[pi].msg_bytes for pi, _ in sub_rows]),
            # Entries per read: min(receiverQueueSize, dispatcherMaxReadBatchSize).
            read_entries=np.array(
                [float(min(s.receiver_queue_size, self.cluster.broker_config[parts[pi][3]]["dispatcherMaxReadBatchSize"])) for pi, s in sub_rows]
            ),
            consumer_rate=np.array([s.consumer_rate for _, s in sub_rows]),
        )
        limits = self.effective_limits(scopes, [(topics[pi], parts[pi][3]) for pi, _ in sub_rows], [(p[0], p[3]) for p in parts])
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
                self.published[p[2]] += np.bincount(bins, weights=msgs[:, j], minlength=len(SNAPSHOTS) + 1)[: len(SNAPSHOTS)]
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
        scope_list += [{"level": "subscription", "broker": parts[pi][3], "topic": parts[pi][2], "subscription": s.name} for pi, s in sub_rows]
        return files, records, scope_list

    def counters_without_exporter(self) -> None:
        """Published and delivered per 10-minute bin for partitions without dispatch records."""
        diurnal = 0.6 + 0.4 * np.sin((SNAPSHOTS / DAY - 0.3) * 2 * np.pi)
        for t, _i, name, broker in self.partitions:
            if broker in self.cluster.exporter_brokers:
                continue
            entries = self.rng.poisson(t.entry_rate * 600 * diurnal)
            self.published[name] = entries * t.batch_mean
            for s in t.subs:
                msgs = self.published[name] * (1 + 0.02 * self.rng.random(len(SNAPSHOTS)))
                redelivered = np.round(msgs * (0.01 if s.type in ("Shared", "Key_Shared") else 0.0))
                self.delivered[(name, s.name)] = np.stack([np.round(msgs), np.round(msgs * t.msg_bytes), redelivered])

    # --- cursors ------------------------------------------------------------------------
    def build_cursors(self) -> None:
        self.cursors, self.ledgers = {}, {}
        next_id = 1000 + int(self.rng.integers(0, 500))
        for t, i, name, _broker in self.partitions:
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
