"""Per-period dispatch throttling the way Pulsar's dispatchers and DispatchRateLimiter behave.

Each throttling period (``ratePeriodInSecond``, 1 s here) a subscription's dispatcher issues reads
while it has backlog, consumer permits and limiter allowance. A read asks for
``min(receiverQueueSize, dispatcherMaxReadBatchSize)`` *entries*, capped by the remaining
message permits (compared with the entry count, as Pulsar does) and by remaining bytes over the
average entry size; every entry is a whole batch, so one read can deliver far more messages than
the remaining quota. Limiters are charged after dispatch (``tryDispatchPermit``), so a period
can overshoot; the excess is debt carried into the following periods:
``allowed = max(0, q - debt_in)``, ``debt_out = max(0, debt_in + delivered - q)``.
Subscription, topic (per partition) and broker limiters hold at once; all subscriptions of a
topic/broker read against the same remaining quota concurrently, another source of overshoot.

Vectorised across scopes; the Python loop runs over periods only (and skips periods in which
nothing is pending and no debt is outstanding, where nothing can change).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Reads per period per dispatcher: a dispatcher re-reads as soon as a read completes; a handful
# of reads per second is what a throttled dispatcher manages before the limiter stops it.
MAX_READS_PER_PERIOD = 6


@dataclass
class DispatchScopes:
    """Subscriptions (one per topic partition and subscription) and the limiters they share."""

    brokers: list[str]
    topics: list[str]  # topic partitions
    topic_broker: np.ndarray  # int, per topic: index into brokers
    subscriptions: list[str]  # per sub scope: subscription name
    sub_topic: np.ndarray  # int, per sub scope: index into topics
    batch_mean: np.ndarray  # messages per entry (batch), per sub scope's topic
    msg_bytes: np.ndarray  # average message size, bytes
    read_entries: np.ndarray  # min(receiverQueueSize, dispatcherMaxReadBatchSize), entries
    consumer_rate: np.ndarray  # messages a sub's consumers take per period (permits refill)

    @property
    def n_subs(self) -> int:
        return len(self.subscriptions)


@dataclass
class LimitSchedule:
    """Quota per period for one level: arrays (msgs, bytes) per limiter, changing at given periods.

    ``changes`` is a sorted list of ``(period_index, msg_quota, byte_quota)``; quotas are float
    arrays with ``np.inf`` for unlimited (Pulsar's value <= 0).
    """

    changes: list[tuple[int, np.ndarray, np.ndarray]]

    def at(self, period: int) -> tuple[np.ndarray, np.ndarray]:
        current = self.changes[0]
        for change in self.changes:
            if change[0] > period:
                break
            current = change
        return current[1], current[2]


@dataclass
class Demand:
    """What arrives for dispatch: per topic partition entries per period, plus consumer outages.

    ``arrivals(start, stop)`` returns an int array (periods × topics) of entries published.
    ``outage(start, stop)`` returns a bool array (periods × subs): consumers disconnected.
    ``redeliveries`` maps period → (sub indexes, messages) put back for replay (ack timeout,
    consumer disconnect).
    """

    arrivals: Callable[[int, int], np.ndarray]
    outage: Callable[[int, int], np.ndarray]
    redeliveries: dict[int, tuple[np.ndarray, np.ndarray]]


def simulate_dispatch(
    scopes: DispatchScopes,
    limits: dict[str, LimitSchedule],
    demand: Demand,
    periods: int,
    seed: int,
    chunk_periods: int = 3600,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield per chunk of periods the subscription-level records as arrays.

    Each yielded dict has ``period`` (index), ``sub`` (scope index), ``msgs``, ``bytes``,
    ``entries``, ``redelivered_msgs`` for every sub scope and period with something dispatched.
    Topic and broker records are their sums (see :func:`level_records`).
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    n, n_topics, n_brokers = scopes.n_subs, len(scopes.topics), len(scopes.brokers)
    sub_topic = scopes.sub_topic
    # All limiters in one array: subscription limiters, then topic, then broker; message quotas
    # in the first half, byte quotas in the second. Each sub is charged on its three limiters.
    n_lim = n + n_topics + n_brokers
    lim_of_sub = np.stack([np.arange(n), n + sub_topic, n + n_topics + scopes.topic_broker[sub_topic]], axis=1)
    charge_index = np.concatenate([lim_of_sub.ravel(), lim_of_sub.ravel() + n_lim])
    debt = np.zeros(2 * n_lim)
    backlog = np.zeros(n)  # messages waiting per sub
    replay = np.zeros(n)  # of which to be redelivered
    entry_bytes = scopes.batch_mean * scopes.msg_bytes
    quota_cache: dict[tuple, np.ndarray] = {}

    def quota(t: int) -> np.ndarray:
        parts = [limits[lvl].at(t) for lvl in ("subscription", "topic", "broker")]
        key = tuple(id(a) for pair in parts for a in pair)
        if key not in quota_cache:
            quota_cache[key] = np.concatenate([p[0] for p in parts] + [p[1] for p in parts])
        return quota_cache[key]

    def charged(msgs: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        weights = np.concatenate([np.repeat(msgs, 3), np.repeat(nbytes, 3)])
        return np.bincount(charge_index, weights=weights, minlength=2 * n_lim)

    for chunk_start in range(0, periods, chunk_periods):
        chunk_stop = min(periods, chunk_start + chunk_periods)
        arrivals = demand.arrivals(chunk_start, chunk_stop)
        outage = demand.outage(chunk_start, chunk_stop)
        busy = arrivals.any(axis=1) | outage.any(axis=1)
        out: dict[str, list[np.ndarray]] = {k: [] for k in ("period", "sub", "msgs", "bytes", "entries", "redelivered_msgs")}
        for t in range(chunk_start, chunk_stop):
            row = t - chunk_start
            if t in demand.redeliveries:
                subs, msgs = demand.redeliveries[t]
                backlog[subs] += msgs
                replay[subs] += msgs
            if not busy[row] and not backlog.any() and not debt.any():
                continue
            # Every sub of a partition receives each published entry.
            backlog += arrivals[row][sub_topic] * scopes.batch_mean
            q = quota(t)
            permits = np.where(outage[row], 0.0, scopes.consumer_rate)
            msgs = np.zeros(n)
            nbytes = np.zeros(n)
            entries = np.zeros(n)
            redelivered = np.zeros(n)
            for _ in range(MAX_READS_PER_PERIOD):
                # Remaining allowance per sub: the tightest of its three limiters, all read
                # concurrently against what was left before this round of reads.
                rem = (q - debt - charged(msgs, nbytes)) if msgs.any() else (q - debt)
                rem_msgs = rem[:n_lim][lim_of_sub].min(axis=1)
                rem_bytes = rem[n_lim:][lim_of_sub].min(axis=1)
                can = (backlog > 0) & (permits > 0) & (rem_msgs > 0) & (rem_bytes > 0)
                if not can.any():
                    break
                want = np.minimum(np.minimum(scopes.read_entries, np.ceil(backlog / scopes.batch_mean)), np.ceil(permits / scopes.batch_mean))
                want = np.minimum(want, np.ceil(rem_msgs))  # message permits compared with entries
                want = np.minimum(want, np.ceil(rem_bytes / entry_bytes))
                got_entries = np.where(can, want, 0.0)
                # Batch sizes vary per read around the topic's mean.
                per_entry = np.maximum(1.0, scopes.batch_mean * rng.uniform(0.6, 1.4, n))
                got = np.minimum(np.round(got_entries * per_entry), backlog)
                got_entries = np.minimum(got_entries, got)
                from_replay = np.minimum(got, replay)
                msgs += got
                nbytes += np.round(got * scopes.msg_bytes * rng.uniform(0.8, 1.2, n))
                entries += got_entries
                redelivered += from_replay
                backlog -= got
                replay -= from_replay
                permits -= got
            if msgs.any():
                debt = np.maximum(0.0, debt + charged(msgs, nbytes) - q)
                hit = np.flatnonzero(msgs)
                out["period"].append(np.full(hit.size, t, dtype=np.int64))
                out["sub"].append(hit)
                out["msgs"].append(msgs[hit].astype(np.int64))
                out["bytes"].append(nbytes[hit].astype(np.int64))
                out["entries"].append(entries[hit].astype(np.int64))
                out["redelivered_msgs"].append(redelivered[hit].astype(np.int64))
            else:
                debt = np.maximum(0.0, debt - q)
        if out["period"]:
            yield {k: np.concatenate(v) for k, v in out.items()}


def level_records(scopes: DispatchScopes, rec: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Subscription records plus their sums per topic partition and per broker, per period."""
    result = {"subscription": {**rec, "topic": scopes.sub_topic[rec["sub"]]}}
    for level, key in (("topic", scopes.sub_topic[rec["sub"]]), ("broker", scopes.topic_broker[scopes.sub_topic[rec["sub"]]])):
        # One group per (period, scope): periods are < 2**40, scope indexes < 2**23.
        group = rec["period"] * (1 << 23) + key
        uniq, inverse = np.unique(group, return_inverse=True)
        sums = {f: np.bincount(inverse, weights=rec[f], minlength=uniq.size).astype(np.int64) for f in ("msgs", "bytes", "entries", "redelivered_msgs")}
        result[level] = {"period": uniq >> 23, ("topic" if level == "topic" else "broker"): uniq & ((1 << 23) - 1), **sums}
    return result


@lru_cache(maxsize=4)
def _iso_seconds(day: date, periods: int, period_seconds: int = 1) -> pa.Array:
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
    stamps = np.datetime64(start.replace(tzinfo=None), "s") + np.arange(periods) * period_seconds
    return pa.array(np.datetime_as_string(stamps, unit="s").astype(object) + "Z")


def format_jsonl(day: date, cluster: str, scopes: DispatchScopes, levels: dict, period_seconds: int = 1) -> bytes:
    """Dispatch records of one chunk as JSONL bytes, ordered by period then level (no row loop)."""
    periods = _iso_seconds(day, 86400 // period_seconds, period_seconds)
    brokers = pa.array(scopes.brokers)
    topics = pa.array(scopes.topics)
    subs = pa.array(scopes.subscriptions)
    parts, order_keys = [], []
    for rank, level in enumerate(("broker", "topic", "subscription")):
        rec = levels[level]
        broker_idx = rec["broker"] if level == "broker" else scopes.topic_broker[rec["topic"]]
        pieces = [
            '{"period_start":"',
            periods.take(pa.array(rec["period"])),
            f'","period_seconds":{period_seconds},"level":"{level}","cluster":"{cluster}","broker":"',
            brokers.take(pa.array(broker_idx)),
        ]
        if level != "broker":
            pieces += ['","topic":"', topics.take(pa.array(rec["topic"]))]
        if level == "subscription":
            pieces += ['","subscription":"', subs.take(pa.array(rec["sub"]))]
        for i, field in enumerate(("msgs", "bytes", "entries", "redelivered_msgs")):
            pieces += [('",' if i == 0 else ",") + f'"{field}":', pc.cast(pa.array(rec[field]), pa.string())]
        pieces.append("}\n")
        parts.append(pc.binary_join_element_wise(*pieces, ""))
        order_keys.append(rec["period"] * 4 + rank)
    lines = pa.chunked_array(parts).combine_chunks() if parts else pa.array([], pa.string())
    order = np.argsort(np.concatenate(order_keys), kind="stable")
    return _concat(lines.take(pa.array(order)))


def _concat(lines: pa.Array) -> bytes:
    """The bytes of a string array's values back to back (each value already ends in a newline)."""
    lines = pc.cast(lines, pa.large_string()) if lines.type == pa.string() and len(lines) > 0 else lines
    if len(lines) == 0:
        return b""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
    return lines.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]


def write_dispatch_files(
    day: date,
    cluster: str,
    out_dir: Path,
    scopes: DispatchScopes,
    chunks: Iterator[dict[str, np.ndarray]],
    on_chunk=None,
) -> tuple[list[Path], int]:
    """Stream hourly chunks to ``<out_dir>/<broker>-<HH>.jsonl`` files; returns (files, records).

    ``on_chunk(levels)`` sees every chunk's records (e.g. to accumulate counters for topic stats).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files, records = [], 0
    broker_of_sub = scopes.topic_broker[scopes.sub_topic]
    for rec in chunks:
        levels = level_records(scopes, rec)
        if on_chunk is not None:
            on_chunk(levels)
        first = int(rec["period"].min())
        for b, broker in enumerate(scopes.brokers):
            mask = broker_of_sub[rec["sub"]] == b
            if not mask.any():
                continue
            sub_rec = {k: v[mask] for k, v in rec.items()}
            per_broker = level_records(scopes, sub_rec)
            data = format_jsonl(day, cluster, scopes, per_broker)
            path = out_dir / f"{broker.replace(':', '_')}-{first // 3600:02d}.jsonl"
            path.write_bytes(data)
            files.append(path)
            records += data.count(b"\n")
    return files, records


def big_dispatch_series(
    day: date,
    out_dir: Path,
    n_subscriptions: int = 10_000,
    subs_per_topic: int = 4,
    topics_per_broker: int = 50,
    activity: float = 0.2,
    seed: int = 7,
    cluster: str = "bench",
) -> tuple[list[Path], int]:
    """Write a large day of throttled dispatch JSONL quickly, for benchmarks.

    ``n_subscriptions`` subscription scopes over topic partitions (``subs_per_topic`` each) on
    brokers (``topics_per_broker`` partitions each); ``activity`` is the fraction of periods in
    which a partition receives entries. Limits: 100 msg/s per subscription, 300 msg/s per
    partition, 5,000 msg/s per broker, with a change at noon. Output is about 200 bytes per
    record; records ≈ n_subscriptions × 86,400 × activity × 1.35 (plus topic and broker levels).
    Returns (files, records).
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    n_topics = max(1, n_subscriptions // subs_per_topic)
    n_brokers = max(1, -(-n_topics // topics_per_broker))
    brokers = [f"broker-{b + 1}:8080" for b in range(n_brokers)]
    topics = [f"persistent://bench/ns-{t % 97}/topic-{t}-partition-{t % 4}" for t in range(n_topics)]
    sub_topic = np.arange(n_subscriptions) % n_topics
    scopes = DispatchScopes(
        brokers=brokers,
        topics=topics,
        topic_broker=np.arange(n_topics) % n_brokers,
        subscriptions=[f"sub-{s // n_topics}" for s in range(n_subscriptions)],
        sub_topic=sub_topic,
        batch_mean=rng.choice([1.0, 4.0, 10.0], n_topics)[sub_topic],
        msg_bytes=rng.choice([200.0, 1024.0, 4096.0], n_topics)[sub_topic],
        read_entries=np.full(n_subscriptions, 100.0),
        consumer_rate=np.full(n_subscriptions, 2000.0),
    )

    def flat(value, size):
        return np.full(size, float(value))

    limits = {
        "subscription": LimitSchedule(
            [(0, flat(100, n_subscriptions), flat(np.inf, n_subscriptions)), (43200, flat(80, n_subscriptions), flat(np.inf, n_subscriptions))]
        ),
        "topic": LimitSchedule([(0, flat(300, n_topics), flat(np.inf, n_topics))]),
        "broker": LimitSchedule([(0, flat(5000, n_brokers), flat(np.inf, n_brokers))]),
    }
    arrival_rng = np.random.Generator(np.random.PCG64(seed + 1))
    rate = arrival_rng.uniform(1, 30, n_topics)

    def arrivals(start, stop):
        active = arrival_rng.random((stop - start, n_topics)) < activity
        return np.where(active, arrival_rng.poisson(rate, (stop - start, n_topics)), 0)

    def outage(start, stop):
        return np.zeros((stop - start, n_subscriptions), dtype=bool)

    demand = Demand(arrivals=arrivals, outage=outage, redeliveries={})
    chunks = simulate_dispatch(scopes, limits, demand, 86400, seed)
    return write_dispatch_files(day, cluster, out_dir, scopes, chunks)
