"""brokerlens' broker interceptor (infra/pulsar/interceptor/, docs/interceptor.md) on a live
Pulsar 4.0.7 standalone: the NAR builds once, the broker loads it, and the per-second dispatch
records it serves at /admin/v2/brokerlens/dispatch equal what the consumer received in each
second and, in total, the subscription's msgOutCounter/bytesOutCounter from topic stats.

Exactness of the per-second comparison: the interceptor counts an entry in the second its
dispatcher called ``beforeSendMessage``; the test knows each message's publish time (the same
clock: broker and client share the machine), and the broker dispatches to a waiting consumer a
few milliseconds after the publish. The messages are sent only in the middle of a second (0.25 s
to 0.6 s after it starts), and the test asserts they were, so publish and dispatch fall in the
same second unless dispatch lagged the publish by more than 0.4 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
import requests

from pulsar_broker import REPO, pulsar_interceptor, pulsar_jars

pytestmark = pytest.mark.pulsar

PATH = pulsar_interceptor.PATH


@pytest.fixture(scope="module")
def broker(pulsar_brokers):
    return pulsar_brokers.get(pulsar_jars.LTS, {}, interceptor=True)


def fetch(broker, after: int | None = None, epoch: str | None = None, limit: int | None = None):
    params = {k: v for k, v in {"after": after, "epoch": epoch, "limit": limit}.items() if v is not None}
    response = requests.get(broker.admin_url + PATH, params=params, timeout=30)
    assert response.status_code == 200, response.text[:300]
    import json

    return response.headers, [json.loads(line) for line in response.text.splitlines() if line.strip()]


def sub_records(records, topic: str, subscription: str) -> dict[int, dict]:
    """Second (epoch) → the subscription's record of that second."""
    from datetime import datetime

    out = {}
    for r in records:
        if r["level"] == "subscription" and r["topic"] == topic and r["subscription"] == subscription:
            second = int(datetime.fromisoformat(r["period_start"].replace("Z", "+00:00")).timestamp())
            assert second not in out, f"two records for second {second}"
            out[second] = r
    return out


def wait_flushed(broker, second: int, timeout: float = 15) -> tuple[dict, list]:
    """Every record up to and including ``second`` (the interceptor flushes a second 0.3 s after it closes)."""
    deadline = time.monotonic() + timeout
    while True:
        headers, records = fetch(broker)
        if any(r["level"] == "broker" and r["period_start"] > time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)) for r in records):
            return headers, records
        assert time.monotonic() < deadline, f"second {second} not flushed in {timeout}s"
        time.sleep(0.3)


def sleep_to_mid_second(offset: float = 0.25) -> None:
    now = time.time()
    target = int(now) + 1 + offset
    time.sleep(target - now)


def drain(consumer, expected: int, timeout_ms: int = 10_000) -> list:
    got = []
    while len(got) < expected:
        message = consumer.receive(timeout_ms)
        got.append(message)
        consumer.acknowledge(message)
    return got


def test_nar_builds_once():
    """The build is cached by source and version: a second build runs no Maven (none on PATH)."""
    nar = pulsar_interceptor.build(pulsar_jars.LTS)
    assert nar.is_file() and nar.suffix == ".nar"
    assert nar.name == f"brokerlens-interceptor-{pulsar_interceptor.digest(pulsar_jars.LTS)}.nar"
    import zipfile

    with zipfile.ZipFile(nar) as z:
        names = set(z.namelist())
        assert "META-INF/services/broker_interceptor.yml" in names
        assert "brokerlens/interceptor/DispatchInterceptor.class" in names
        assert "interceptorClass: brokerlens.interceptor.DispatchInterceptor" in z.read("META-INF/services/broker_interceptor.yml").decode()
        # pulsar-broker is provided by the broker: nothing of Pulsar's is bundled.
        assert not [n for n in names if n.startswith("META-INF/bundled-dependencies/") and n.endswith(".jar")]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "infra" / "pulsar" / "interceptor.py"), pulsar_jars.LTS],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(nar)
    assert time.monotonic() - started < 10
    # Another version is another NAR (the digest covers the version).
    assert pulsar_interceptor.nar_path(pulsar_jars.NEWER) != nar


def test_broker_loads_it(broker):
    log = broker.log_path.read_text(errors="replace")
    assert "Successfully loaded broker interceptor for name `brokerlens`" in log
    assert f"brokerlens dispatch interceptor initialized: broker=127.0.0.1:{broker.web_port} cluster=standalone" in log
    headers, _ = fetch(broker)
    assert headers["X-Brokerlens-Broker"] == f"127.0.0.1:{broker.web_port}"
    assert headers["X-Brokerlens-Dispatch-Errors"] == "0"
    # Other paths are untouched: the admin API still answers behind the filter.
    assert "public/default" in broker.admin("GET", "/admin/v2/namespaces/public")


def run_bursts(broker, topic: str, sizes: list[int], batched: bool):
    """Sends ``sizes[k]`` messages in the middle of the k-th of consecutive seconds (0 skips the
    second) to a consumer already subscribed; returns (received messages, record by second).
    Each burst is sent asynchronously, then flushed (unbatched, still an entry a message): sent one
    at a time, each waiting for its receipt, 23 messages once took from 0.25 to 0.87 of their
    second on a busy machine, past the middle of it that the tests rely on."""
    client = broker.client()
    try:
        consumer = client.subscribe(topic, "s")
        kwargs = {"batching_enabled": True, "batching_max_messages": 5, "batching_max_publish_delay_ms": 50} if batched else {"batching_enabled": False}
        producer = client.create_producer(topic, **kwargs)
        received = []
        for size in sizes:
            sleep_to_mid_second()
            for i in range(size):
                producer.send_async(f"m{i}".encode() * (1 + i % 7), None)
            producer.flush()
            received += drain(consumer, size)
        last = max(int(m.publish_timestamp() / 1000) for m in received)
        _, records = wait_flushed(broker, last + 1)
    finally:
        client.close()
    return received, sub_records(records, topic, "s")


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_per_second_counts_equal_the_consumers(broker, batched):
    topic = f"persistent://public/default/icpt-{'b' if batched else 'n'}-{uuid.uuid4().hex[:8]}"
    sizes = [7, 0, 23, 4]
    received, by_second = run_bursts(broker, topic, sizes, batched)
    assert len(received) == sum(sizes)
    # The premise of exactness: every publish was well inside its second.
    fractions = sorted((m.publish_timestamp() % 1000) / 1000 for m in received)
    assert fractions[0] >= 0.2 and fractions[-1] < 0.75, fractions
    expected = Counter(int(m.publish_timestamp() / 1000) for m in received)
    distinct = {}
    for m in received:
        distinct.setdefault(int(m.publish_timestamp() / 1000), set()).add((m.message_id().ledger_id(), m.message_id().entry_id()))
    got = {s: r["msgs"] for s, r in by_second.items() if r["msgs"]}
    assert got == dict(expected)
    assert {s: r["entries"] for s, r in by_second.items() if r["entries"]} == {s: len(e) for s, e in distinct.items()}
    # The empty second between the bursts has its zero record (the consumer was connected).
    first, last = min(expected), max(expected)
    assert all(by_second[s]["msgs"] == 0 for s in range(first, last + 1) if s not in expected)
    assert set(range(first, last + 1)) <= set(by_second)
    stats = broker.stats(topic)["subscriptions"]["s"]
    assert sum(r["msgs"] for r in by_second.values()) == stats["msgOutCounter"] == sum(sizes)
    assert sum(r["bytes"] for r in by_second.values()) == stats["bytesOutCounter"]
    assert sum(r["redelivered_msgs"] for r in by_second.values()) == 0
    total_entries = sum(r["entries"] for r in by_second.values())
    if batched:
        # Batches count by their size; entries count the batches (at most 5 messages each here).
        assert total_entries == len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received})
        assert total_entries < sum(sizes)
        assert max(m.message_id().batch_index() for m in received) >= 1
    else:
        assert total_entries == sum(sizes)
    sample = next(iter(by_second.values()))
    assert sample["source"] == "exporter" and sample["period_seconds"] == 1
    assert sample["cluster"] == "standalone" and sample["broker"] == f"127.0.0.1:{broker.web_port}"
    assert set(sample) == {
        "period_start", "period_seconds", "level", "cluster", "broker", "topic", "subscription",
        "msgs", "bytes", "entries", "redelivered_msgs", "source", "seq",
    }  # fmt: skip


def test_zero_records_start_with_the_second_the_consumer_connected(broker):
    """A consumer that connects early in a second S, before S - 1 is flushed (0.3 s after it
    closes), gives S - 1 no record: zero records start with S (Consumer.getConnectedSince)."""
    topic = f"persistent://public/default/icpt-z-{uuid.uuid4().hex[:8]}"
    client = broker.client()
    try:
        client.create_producer(topic).close()  # the topic exists: the subscribe below is quick
        for attempt in range(5):
            sleep_to_mid_second(0.02)
            before = time.time()
            consumer = client.subscribe(topic, f"z{attempt}")
            after = time.time()
            if int(after) == int(before) and after % 1 < 0.25:
                break  # connected inside [S, S + 0.25): before the flush of S - 1
            consumer.close()
        else:
            pytest.fail("no subscribe completed within 0.25 s of a second's start")
        connected = int(before)
        _, records = wait_flushed(broker, connected + 2)
    finally:
        client.close()
    by_second = sub_records(records, topic, f"z{attempt}")
    assert min(by_second) == connected
    assert {connected, connected + 1, connected + 2} <= set(by_second)
    assert all(r["msgs"] == 0 for r in by_second.values())


def test_rollups_sum_the_subscriptions(broker):
    """Topic records sum the topic's subscriptions of the same second; broker records sum all."""
    topic = f"persistent://public/default/icpt-r-{uuid.uuid4().hex[:8]}"
    client = broker.client()
    try:
        a, b = client.subscribe(topic, "a"), client.subscribe(topic, "b")
        producer = client.create_producer(topic, batching_enabled=False)
        sleep_to_mid_second()
        for _ in range(9):
            producer.send(b"x" * 10)
        drain(a, 9), drain(b, 9)
        second = int(time.time())
        _, records = wait_flushed(broker, second + 1)
    finally:
        client.close()
    subs = [r for r in records if r["level"] == "subscription" and r["topic"] == topic]
    tops = [r for r in records if r["level"] == "topic" and r["topic"] == topic]
    assert sum(r["msgs"] for r in subs) == 18 and sum(r["msgs"] for r in tops) == 18
    for t in tops:
        same = [r for r in subs if r["period_start"] == t["period_start"]]
        for field in ("msgs", "bytes", "entries", "redelivered_msgs"):
            assert t[field] == sum(r[field] for r in same)
        assert "subscription" not in t
    for br in (r for r in records if r["level"] == "broker"):
        same = [r for r in records if r["level"] == "topic" and r["period_start"] == br["period_start"]]
        assert br["msgs"] == sum(r["msgs"] for r in same) and br["bytes"] == sum(r["bytes"] for r in same)
        assert "topic" not in br


def test_redelivered_messages_are_counted(broker):
    """A Shared subscription's redelivery (the consumer asks for its unacked messages again): the
    broker's redelivery tracker counts them, and the client sees redelivery_count > 0."""
    import pulsar

    topic = f"persistent://public/default/icpt-rd-{uuid.uuid4().hex[:8]}"
    client = broker.client()
    try:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(6):
            producer.send(b"r" * 20)
        first = [consumer.receive(10_000) for _ in range(6)]
        consumer.redeliver_unacknowledged_messages()
        again = drain(consumer, 6)
        time.sleep(0.5)
        second = int(time.time())
        _, records = wait_flushed(broker, second + 1)
    finally:
        client.close()
    by_second = sub_records(records, topic, "s")
    assert [m.redelivery_count() for m in first] == [0] * 6
    redelivered = sum(1 for m in again if m.redelivery_count() > 0)
    assert redelivered == 6
    assert sum(r["redelivered_msgs"] for r in by_second.values()) == redelivered
    assert sum(r["msgs"] for r in by_second.values()) == 12 == broker.stats(topic)["subscriptions"]["s"]["msgOutCounter"]


def test_fetch_after_sequence_has_no_duplicates(broker):
    headers, records = fetch(broker)
    epoch, last = headers["X-Brokerlens-Epoch"], int(headers["X-Brokerlens-Last-Seq"])
    assert last >= 1 and [r["seq"] for r in records] == list(range(int(headers["X-Brokerlens-First-Seq"]), last + 1))
    time.sleep(2.5)  # a few more seconds are flushed (zero records of the connected system readers at least)
    headers2, records2 = fetch(broker, after=last, epoch=epoch)
    seqs = [r["seq"] for r in records2]
    assert seqs and seqs[0] == last + 1 and seqs == list(range(last + 1, seqs[-1] + 1))
    assert not set(seqs) & {r["seq"] for r in records}
    assert headers2["X-Brokerlens-Missed-Records"] == "0"
    # A retry of the same fetch gets the same records; a limit pages them.
    assert [r["seq"] for r in fetch(broker, after=last, epoch=epoch)[1]][: len(seqs)] == seqs
    assert [r["seq"] for r in fetch(broker, after=last, epoch=epoch, limit=2)[1]] == seqs[:2]
    # A sequence from another broker process (other epoch) is ignored: everything kept comes back.
    _, all_again = fetch(broker, after=last, epoch="1")
    assert all_again[0]["seq"] == int(headers["X-Brokerlens-First-Seq"])


def test_period_follows_the_dispatch_rate_policy(broker):
    """A namespace subscription dispatch rate with ratePeriodInSecond=2 (a limit far above the test's
    rate: DispatchRateImpl.normalize takes a policy without limits as no policy, 1 s): the
    subscription's records are 2-second periods starting on even seconds, their counts the sums
    of the seconds; the topic's records stay at 1 s (no topic dispatch-rate policy)."""
    namespace = f"public/p2-{uuid.uuid4().hex[:6]}"
    broker.admin("PUT", f"/admin/v2/namespaces/{namespace}")
    rate = {"dispatchThrottlingRateInMsg": 100000, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 2, "relativeToPublishRate": False}
    broker.admin("POST", f"/admin/v2/namespaces/{namespace}/subscriptionDispatchRate", json=rate)
    topic = f"persistent://{namespace}/icpt-p"
    received, by_start = run_bursts(broker, topic, [3, 5, 2, 4], batched=False)
    assert len(received) == 14
    assert by_start and {r["period_seconds"] for r in by_start.values()} == {2}
    assert all(start % 2 == 0 for start in by_start)
    expected = Counter(int(m.publish_timestamp() / 1000) // 2 * 2 for m in received)
    assert {s: r["msgs"] for s, r in by_start.items() if r["msgs"]} == dict(expected)
    _, records = fetch(broker)
    assert {r["period_seconds"] for r in records if r["level"] == "topic" and r["topic"] == topic} == {1}


def test_overflow_drops_the_oldest_and_counts_them(broker, pulsar_brokers):
    """A bound of 20 records: the oldest are dropped, and the drop is reported (last in the module:
    it stops the module's broker so that only one broker of this file runs)."""
    broker.stop()
    small = pulsar_brokers.get(pulsar_jars.LTS, {"brokerlensDispatchBufferMaxRecords": 20}, interceptor=True)
    client = small.client()
    try:
        client.subscribe(f"persistent://public/default/icpt-o-{uuid.uuid4().hex[:8]}", "s")  # zero records each second
        deadline = time.monotonic() + 60
        while int(fetch(small)[0]["X-Brokerlens-Last-Seq"]) < 50:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        headers, records = fetch(small)
        # A collector that had landed up to seq 5 is told how many records it missed.
        missed_headers, missed_records = fetch(small, after=5, epoch=headers["X-Brokerlens-Epoch"])
    finally:
        client.close()
        small.stop()
    first, last = int(headers["X-Brokerlens-First-Seq"]), int(headers["X-Brokerlens-Last-Seq"])
    dropped = int(headers["X-Brokerlens-Dropped-Records"])
    assert len(records) == 20 == last - first + 1
    assert [r["seq"] for r in records] == list(range(first, last + 1))
    assert dropped == first - 1 >= 30
    first_now = int(missed_headers["X-Brokerlens-First-Seq"])
    assert int(missed_headers["X-Brokerlens-Missed-Records"]) == first_now - 1 - 5 > 0
    assert missed_records[0]["seq"] == first_now
