"""Traffic for the live-broker throttling tests: producers with and without batching, a consumer
that keeps each message's receive time and publish time, and a collector that runs
``brokerlens collect`` on the broker's admin API every second (with a /metrics scrape beside it)
into a landing folder while the traffic runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import TypeVar

import pulsar

from brokerlens.sources.collect import collect


T = TypeVar("T")


def at_once(names: Iterable[str], job: Callable[[str], T]) -> dict[str, T]:
    """``job(name)`` for each name, each on its own thread, all at once: one broker's experiments
    mostly wait on that broker (its rate limits, its flushes, its restarts), so several brokers'
    run side by side in about the time of the longest. Their results by name; the first failure
    is raised."""
    names = list(names)
    with ThreadPoolExecutor(max(1, len(names)), thread_name_prefix="experiment") as pool:
        futures = {name: pool.submit(job, name) for name in names}
        return {name: future.result() for name, future in futures.items()}


def one_utc_day(traffic_seconds: float = 600) -> date:
    """Today (UTC), once a fixture's traffic can end on it: when less than ``traffic_seconds``
    are left before midnight, after midnight. The fixture lands and builds that one day, so
    traffic split across two day folders would leave part of it unjudged."""
    now = datetime.now(timezone.utc)
    left = (datetime(now.year, now.month, now.day, tzinfo=timezone.utc) + timedelta(days=1) - now).total_seconds()
    if left < traffic_seconds:
        time.sleep(left + 1)
    return datetime.now(timezone.utc).date()


@dataclass
class Received:
    """What a consumer saw: per message (receive time, publish time), epoch seconds."""

    times: list[tuple[float, float]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.times)

    def within(self, start: float, seconds: float) -> int:
        return sum(1 for r, _ in self.times if start <= r < start + seconds)

    @property
    def first(self) -> float:
        return self.times[0][0]

    def reads(self, gap: float) -> list[tuple[float, int]]:
        """(first receive, messages) of each run of receives that no pause of ``gap`` seconds
        splits: one dispatcher read as the consumer saw it."""
        found: list[tuple[float, int]] = []
        for at, _ in self.times:
            if found and at - last < gap:
                found[-1] = (found[-1][0], found[-1][1] + 1)
            else:
                found.append((at, 1))
            last = at
        return found


def subscribe_first(client: pulsar.Client, topic: str, subscription: str) -> None:
    """Create the durable subscription before anything is published, so the backlog is kept."""
    client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Exclusive).close()


def set_dispatch_rate(broker, topic: str, rate: dict, kind: str = "subscriptionDispatchRate", timeout: float = 30) -> None:
    """Set a topic's dispatch-rate policy (``kind``: ``subscriptionDispatchRate`` or
    ``dispatchRate``) and return once the admin API gives it back: a topic policy takes effect
    when the broker has read it back from its system topic, and a collect sooner than that
    (a CI run's, a second later) still misses it."""
    path = broker.topic_path(topic) + "/" + kind
    broker.admin("POST", path, json=rate)
    deadline = time.monotonic() + timeout
    while (broker.admin("GET", path) or {}).get("dispatchThrottlingRateInMsg") != rate["dispatchThrottlingRateInMsg"]:
        assert time.monotonic() < deadline, f"{path} not applied within {timeout:.0f} s"
        time.sleep(0.1)


def produce(client: pulsar.Client, topic: str, messages: int, batch: int | None = None, size: int = 100) -> None:
    """``messages`` of ``size`` bytes at once; ``batch``: entries of exactly that many messages
    (each batch flushed whole)."""
    options = {"batching_enabled": bool(batch), "block_if_queue_full": True}
    if batch:
        options.update(batching_max_messages=batch, batching_max_publish_delay_ms=10_000,
                       batching_max_allowed_size_in_bytes=64 * 1024 * 1024)  # fmt: skip
    producer = client.create_producer(topic, **options)
    payload = b"x" * size
    try:
        for i in range(messages):
            producer.send_async(payload, None)
            if batch and (i + 1) % batch == 0:
                producer.flush()
        producer.flush()
    finally:
        producer.close()


def consume(client: pulsar.Client, topic: str, subscription: str, seconds: float, queue: int = 1000,
            during=None) -> Received:  # fmt: skip
    """Receive and acknowledge for ``seconds`` (and while ``during`` runs), and close in the pause
    after a read; ``during`` (optional) runs in a thread meanwhile (a producer, a policy change).

    The broker counts a read in msgOutCounter when it dispatches it, and a rate-limited consumer's
    reads come once per rate period from its first one, so whole seconds after attaching are when
    the next read comes: a consumer closed then may miss a read on its way. So after ``seconds``
    it goes on until 0.3 s have passed since its last message, and if more than 0.6 s have (the
    next read is near), until the next read has come and gone; 3 s without a message is the end
    of the traffic."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Exclusive,
                                receiver_queue_size=queue, initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
    side = threading.Thread(target=during, daemon=True) if during else None
    if side:
        side.start()
    received, end = Received(), time.time() + seconds
    last = time.time()
    try:
        while (now := time.time()) < end or (side and side.is_alive()) or not (0.3 <= now - last <= 0.6 or now - last > 3 or now > end + 10):
            try:
                message = consumer.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            last = time.time()
            received.times.append((last, message.publish_timestamp() / 1000))
            consumer.acknowledge(message)
    finally:
        consumer.close()
        if side:
            side.join(60)
    return received


class Collector:
    """``brokerlens collect`` every ``every`` seconds on ``broker``'s admin API, into
    ``settings.landing``, and its /metrics every ``metrics_every`` collections (a file per scrape,
    named for the broker as the landing wants: ``127.0.0.1_<port>@<n>.prom``)."""

    def __init__(self, broker, settings, every: float = 1.0, metrics_every: int = 5):
        self.broker, self.settings, self.every, self.metrics_every = broker, settings, every, metrics_every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.runs, self.errors = 0, []
        self.started: list[float] = []  # each collect's start (epoch s)

    def __enter__(self) -> "Collector":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)
        # The counters after the traffic, at the cadence: a last interval shorter than a period
        # that holds a read is judged against that fraction of a quota (docs/live-broker-throttling.md).
        time.sleep(max(0.0, self.started[-1] + self.every - time.time()) if self.started else 0.0)
        self.once()

    def next_start(self, timeout: float = 60) -> tuple[int, float]:
        """(collects ended, start) when the next collect begins: it has ended once ``runs`` is
        past the first figure."""
        begun, deadline = len(self.started), time.monotonic() + timeout
        while len(self.started) == begun:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no collect began within {timeout:.0f}s ({self.errors[-1:] or 'no errors'})")
            time.sleep(0.01)
        return self.runs, self.started[begun]

    def policy_landed(self, topic: str, timeout: float = 60) -> None:
        """Return as soon as a collect has landed a policy record of ``topic`` (collect writes its
        policies last): what comes next falls in the interval from that collect's snapshot."""
        deadline = time.monotonic() + timeout
        while not any(f'"topic": "{topic}"' in p.read_text() for p in self.settings.landing.glob("*/policies/*.jsonl")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no collect landed a policy of {topic} within {timeout:.0f}s ({self.errors[-1:] or 'no errors'})")
            time.sleep(0.02)

    def settled(self, timeout: float = 60) -> None:
        """Return once a collect that began after this call has ended: what the broker changed
        before the call (a policy, a dynamic setting) is in the landing, however loaded the machine."""
        target = self.runs + 2  # the collect under way now may have read the broker before the change
        deadline = time.monotonic() + timeout
        while self.runs < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no collect ended within {timeout:.0f}s ({self.errors[-1:] or 'no errors'})")
            time.sleep(0.1)

    def once(self) -> None:
        self.started.append(time.time())
        collect(None, self.settings, admin_url=self.broker.admin_url)
        if self.runs % self.metrics_every == 0:
            day = datetime.now(timezone.utc).date().isoformat()
            folder = self.settings.landing / day / "metrics"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"127.0.0.1_{self.broker.web_port}@{self.runs}.prom").write_text(self.broker.metrics())
        self.runs += 1

    def _run(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            try:
                self.once()
            except Exception as exc:  # noqa: BLE001 - kept for the test to show, not hidden
                self.errors.append(repr(exc))
            next_at += self.every
            self._stop.wait(max(0.0, next_at - time.time()))


def partial_quota_then_refill(client: pulsar.Client, collector: Collector, topic: str, quota: int, period: float, attempts: int = 3) -> list[dict]:
    """A caught-up consumer on ``topic``, limited to ``quota`` messages a ``period``, with
    snapshots ``collector.every`` seconds apart (more than half a period, less than one). After a
    period without a read, one message: the read that ends the wait, when the token bucket adds
    its refill, capped at the quota, and starts its next period. Right after the snapshot that
    follows, a backlog of ``2 * quota - 1``: the dispatcher sends ``quota - 1`` at once, the rest
    of the quota it refilled; then, throttled, it retries every second
    (MESSAGE_RATE_BACKOFF_MS), and the first retry a period after the first message gets the
    next quota. Both reads fall in the one snapshot interval, shorter than a period.

    An attempt whose timing missed (a collect or the producer too slow) is tried again after a
    wait of two periods. Each attempt's times (epoch s); ``kept``: the one that held."""
    tried = []
    for attempt in range(attempts):
        time.sleep(period + 0.5 if attempt == 0 else 2 * period + 0.5)
        _, first_snapshot = collector.next_start()
        time.sleep(max(0.0, first_snapshot + 0.3 - time.time()))
        produce(client, topic, 1)
        one = time.time()
        ended, snapshot = collector.next_start()
        while collector.runs <= ended and time.time() < one + period:
            time.sleep(0.01)
        produce(client, topic, 2 * quota - 1)
        backlog = time.time()
        # The refill's read comes by the first retry a period after the first message.
        time.sleep(max(0.0, one + period + 1.2 - time.time()))
        # The backlog's first reads came before that period's end, and no collect began since
        # the one after the first message: both reads are in its interval.
        kept = backlog < one + period - 0.2 and collector.started[-1] == snapshot
        tried.append({"one": one, "snapshot": snapshot, "backlog": backlog, "kept": kept})
        if kept:
            time.sleep(1)  # the consumer receives the refill's read before it closes
            break
    return tried
