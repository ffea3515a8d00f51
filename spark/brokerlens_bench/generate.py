"""A day of one-second throttling periods at a given size, generated column-wise as
silver ``dispatch_intervals`` and ``rate_limits``, and written as Parquet input."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PERIODS_PER_DAY = 86_400  # ratePeriodInSecond = 1 (Pulsar's default)
SUBSCRIPTIONS_PER_PARTITION = 3
PARTITIONS_PER_BROKER = 4
PARTITIONS_PER_TOPIC = 4
# Partitions per size: 4 times more each step. Scopes = partitions x (3 subscriptions + the
# partition itself) + brokers; 86,400 one-second periods each.
DEFAULT_SIZES = (2, 8, 32)
CLUSTER = "bench"
SCOPE = ["level", "cluster", "broker", "topic", "subscription"]


@dataclass(frozen=True)
class Topology:
    partitions: int

    @property
    def brokers(self) -> int:
        return -(-self.partitions // PARTITIONS_PER_BROKER)

    @property
    def scopes(self) -> int:
        return self.partitions * (SUBSCRIPTIONS_PER_PARTITION + 1) + self.brokers

    @property
    def period_rows(self) -> int:
        return self.scopes * PERIODS_PER_DAY

    def topic(self, p: int) -> str:
        t, i = divmod(p, PARTITIONS_PER_TOPIC)
        return f"persistent://bench/ns{t % 4}/orders-{t}-partition-{i}"

    def broker(self, p: int) -> str:
        return f"broker-{p // PARTITIONS_PER_BROKER}.bench:8080"


def _day_start_us(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()) * 1_000_000


def _strings(values: list[str | None], index: np.ndarray) -> pa.Array:
    """A string column from a small dictionary and an index per row (no per-row Python)."""
    dictionary = pa.array(values, pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), dictionary).cast(pa.string())


def _const(value: str, n: int) -> pa.Array:
    return _strings([value], np.zeros(n, np.int32))


def generate_day(day: date, partitions: int, seed: int = 0, periods: int = PERIODS_PER_DAY) -> tuple[pa.Table, pa.Table]:
    """One day of silver ``dispatch_intervals`` (period grain) and ``rate_limits``.

    Subscriptions deliver below their quota most of the time, with gaps (idle seconds and
    idle stretches of up to an hour) and bursts over quota (batch entries, reads sized by
    ``dispatcherMaxReadBatchSize``); a partition's topic-level delivery is the sum of its
    subscriptions', a broker's the sum of its partitions'. Half the partitions change their
    subscription quota at a period start during the day; a third have a byte limit.
    Rows are ordered by scope, then period (the layout silver writes). ``periods``: the first
    periods of the day only (tests).
    """
    topo = Topology(partitions)
    rng = np.random.default_rng([seed, day.toordinal(), partitions])
    T = periods
    P, S = partitions, SUBSCRIPTIONS_PER_PARTITION
    n_sub = P * S
    t = np.arange(T)

    # Quotas per partition (subscription level); topic level 3 x that, broker 0.8 x its topics'.
    q_sub = rng.choice([100, 500, 1000, 2000], size=P)
    change_at = np.where(rng.random(P) < 0.5, rng.integers(T // 4, 3 * T // 4, size=P), PERIODS_PER_DAY)
    q_sub_after = np.where(change_at < T, q_sub * rng.choice([0.5, 2.0], size=P), q_sub).astype(np.int64)
    # Subscriptions of a partition read the same entries: one message size and batch size.
    part_size = rng.integers(100, 4000, size=P)
    avg_size = np.repeat(part_size, S)
    batch = np.repeat(rng.choice([1, 5, 20, 100], size=P), S)

    quota_per_sub = np.where(t[None, :] < change_at[:, None], q_sub[:, None], q_sub_after[:, None])
    quota_per_sub = np.repeat(quota_per_sub, S, axis=0)  # (n_sub, T)
    rate = quota_per_sub * rng.uniform(0.3, 0.9, size=(n_sub, 1))
    msgs = rng.poisson(rate)
    burst = rng.random((n_sub, T)) < 0.03
    msgs = np.where(burst, (quota_per_sub * rng.uniform(1.05, 3.0, size=(n_sub, T))).astype(np.int64), msgs)
    idle = rng.random((n_sub, T)) < 0.08
    starts = rng.integers(0, T, size=(n_sub, 2))
    lengths = rng.integers(T // 1440 + 1, T // 24 + 2, size=(n_sub, 2))  # 1 min to 1 h in a day
    for k in range(2):
        idle |= (t[None, :] >= starts[:, k : k + 1]) & (t[None, :] < starts[:, k : k + 1] + lengths[:, k : k + 1])
    msgs = np.where(idle, 0, msgs).astype(np.int64)
    entries = -(-msgs // batch[:, None])
    nbytes = (msgs * avg_size[:, None] * rng.lognormal(0.0, 0.1, size=(n_sub, T))).astype(np.int64)
    redelivered = rng.binomial(msgs, np.where(rng.random(n_sub) < 0.2, 0.02, 0.0)[:, None])
    del rate, burst, idle, quota_per_sub

    def up(a: np.ndarray, groups: int) -> np.ndarray:
        return a.reshape(groups, -1, T).sum(axis=1)

    broker_pad = topo.brokers * PARTITIONS_PER_BROKER - P  # last broker may hold fewer partitions

    def to_broker(a: np.ndarray) -> np.ndarray:
        return up(np.concatenate([a, np.zeros((broker_pad, T), np.int64)]), topo.brokers)

    levels = []
    for level, m, e, b, r in (
        ("subscription", msgs, entries, nbytes, redelivered),
        ("topic", up(msgs, P), up(entries, P), up(nbytes, P), up(redelivered, P)),
    ):
        levels.append((level, m, e, b, r))
    _, tm, te, tb, tr = levels[1]
    levels.append(("broker", to_broker(tm), to_broker(te), to_broker(tb), to_broker(tr)))

    names_broker = [topo.broker(p) for p in range(P)]
    names_topic = [topo.topic(p) for p in range(P)]
    day_us = _day_start_us(day)
    parts = []
    for level, m, e, b, r in levels:
        scope, period = np.nonzero(m > 0)  # an exporter has no record for an idle scope
        n = len(scope)
        if level == "subscription":
            part = scope // S
            broker, topic = _strings(names_broker, part), _strings(names_topic, part)
            subscription = _strings([f"sub-{k}" for k in range(S)], scope % S)
        elif level == "topic":
            broker, topic = _strings(names_broker, scope), _strings(names_topic, scope)
            subscription = pa.nulls(n, pa.string())
        else:
            broker = _strings([topo.broker(k * PARTITIONS_PER_BROKER) for k in range(topo.brokers)], scope)
            topic = subscription = pa.nulls(n, pa.string())
        parts.append(
            pa.table(
                {
                    "day": pa.array(np.full(n, day.toordinal() - date(1970, 1, 1).toordinal(), np.int32), pa.date32()),
                    "level": _const(level, n),
                    "cluster": _const(CLUSTER, n),
                    "broker": broker,
                    "topic": topic,
                    "subscription": subscription,
                    "interval_start": pa.array(day_us + period * 1_000_000, pa.timestamp("us", tz="UTC")),
                    "interval_seconds": pa.array(np.ones(n)),
                    "grain": _const("period", n),
                    "msgs": pa.array(m[scope, period]),
                    "bytes": pa.array(b[scope, period]),
                    "entries": pa.array(e[scope, period]),
                    "redelivered_msgs": pa.array(r[scope, period]),
                    "source": _const("dispatch", n),
                    "counter_reset": pa.array(np.zeros(n, bool)),
                }
            )
        )
    intervals = pa.concat_tables(parts)
    limits = _limits(day, topo, q_sub, q_sub_after, change_at, part_size, rng)
    return intervals, limits


def _limits(day, topo, q_sub, q_sub_after, change_at, part_size, rng) -> pa.Table:
    day_us = _day_start_us(day)
    end_us = day_us + PERIODS_PER_DAY * 1_000_000
    byte_limited = rng.random(topo.partitions) < 1 / 3
    rows: dict[str, list] = {k: [] for k in ("level", "broker", "topic", "valid_from", "valid_to", "msg_limit", "byte_limit", "msg_source", "byte_source")}

    def add(level, broker, topic, start, end, msg_limit, byte_limit, source):
        for key, value in zip(rows, (level, broker, topic, start, end, msg_limit, byte_limit, source, source if byte_limit is not None else "default")):
            rows[key].append(value)

    for p in range(topo.partitions):
        topic = topo.topic(p)
        q0, q1, at = int(q_sub[p]), int(q_sub_after[p]), int(change_at[p])
        byte0 = int(q0 * part_size[p] * 1.2) if byte_limited[p] else None
        if at < PERIODS_PER_DAY:
            add("subscription", None, topic, day_us, day_us + at * 1_000_000, q0, byte0, "namespace-policy")
            byte1 = int(q1 * part_size[p] * 1.2) if byte_limited[p] else None
            add("subscription", None, topic, day_us + at * 1_000_000, end_us, q1, byte1, "topic-policy")
        else:
            add("subscription", None, topic, day_us, end_us, q0, byte0, "namespace-policy")
        add("topic", None, topic, day_us, end_us, 3 * max(q0, q1), None, "broker-config")
    for b in range(topo.brokers):
        held = range(b * PARTITIONS_PER_BROKER, min(topo.partitions, (b + 1) * PARTITIONS_PER_BROKER))
        quota = int(0.8 * sum(3 * max(q_sub[p], q_sub_after[p]) for p in held))
        add("broker", topo.broker(b * PARTITIONS_PER_BROKER), None, day_us, end_us, quota, None, "broker-config")
    n = len(rows["level"])
    return pa.table(
        {
            "day": pa.array([day] * n, pa.date32()),
            "level": pa.array(rows["level"], pa.string()),
            "cluster": pa.array([CLUSTER] * n, pa.string()),
            "broker": pa.array(rows["broker"], pa.string()),
            "topic": pa.array(rows["topic"], pa.string()),
            "valid_from": pa.array(rows["valid_from"], pa.timestamp("us", tz="UTC")),
            "valid_to": pa.array(rows["valid_to"], pa.timestamp("us", tz="UTC")),
            "msg_limit": pa.array(rows["msg_limit"], pa.int64()),
            "byte_limit": pa.array(rows["byte_limit"], pa.int64()),
            "period_seconds": pa.array([1] * n, pa.int32()),
            "count_entries": pa.array([False] * n),
            "relative_to_publish_rate": pa.array([False] * n),
            "msg_source": pa.array(rows["msg_source"], pa.string()),
            "byte_source": pa.array(rows["byte_source"], pa.string()),
        }
    )


def write_input(folder: Path, day: date, partitions: int, files: int = 4, periods: int = PERIODS_PER_DAY) -> dict[str, list[str]]:
    """The generated day as Parquet: intervals split by scope into ``files`` files, and limits."""
    intervals, limits = generate_day(day, partitions, periods=periods)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[str]] = {"intervals": [], "limits": []}
    step = -(-intervals.num_rows // files)
    for i in range(files):
        path = folder / f"dispatch_intervals-{i}.parquet"
        pq.write_table(intervals.slice(i * step, step), path, compression="zstd", row_group_size=1 << 20)
        out["intervals"].append(str(path))
    path = folder / "rate_limits.parquet"
    pq.write_table(limits, path)
    out["limits"].append(str(path))
    return out
