"""Traffic for the live-broker experiments: acknowledgement holes a consumer makes on purpose, and
what a consumer receives again after a topic reload (tests/pulsar_broker.py starts the broker)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SUBSCRIPTION = "holes"


@dataclass
class Holes:
    topic: str
    ranges: int
    total: int  # messages produced, one entry each (batching off)
    acked: set[tuple[int, int]] = field(default_factory=set)  # (ledger, entry) of each acknowledged message


def range_sizes(ranges: int) -> list[int]:
    """Acknowledged messages per range: 1, 2, 3, 1, 2, 3, ... so that ranges weigh differently."""
    return [1 + i % 3 for i in range(ranges)]


def make_holes(broker, topic: str, ranges: int) -> Holes:
    """Produce and receive ``1 + sum(size + 1)`` messages on a Shared subscription, then acknowledge
    them individually so that ``ranges`` acknowledged ranges lie after the mark-delete position,
    each followed by one unacknowledged message (the first message stays unacknowledged too)."""
    import pulsar

    sizes = range_sizes(ranges)
    holes = Holes(topic, ranges, 1 + sum(s + 1 for s in sizes))
    client = broker.client()
    try:
        consumer = client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(holes.total):
            producer.send(str(i).encode())
        messages = [consumer.receive(30_000) for _ in range(holes.total)]
        position = 1
        for size in sizes:
            for message in messages[position : position + size]:
                consumer.acknowledge(message)
                holes.acked.add((message.message_id().ledger_id(), message.message_id().entry_id()))
            position += size + 1
        wait_for_ranges(broker, topic, ranges)
        consumer.close()  # the client sends its grouped acknowledgements before it closes
    finally:
        client.close()
    return holes


def wait_for_ranges(broker, topic: str, ranges: int, timeout: float = 30) -> dict:
    """The cursor's internal stats once the broker holds ``ranges`` acknowledged ranges (the client
    groups acknowledgements for up to 100 ms before it sends them)."""
    deadline = time.monotonic() + timeout
    while True:
        cursor = broker.internal_stats(topic)["cursors"][SUBSCRIPTION]
        if cursor.get("totalNonContiguousDeletedMessagesRange") == ranges or time.monotonic() > deadline:
            return cursor
        time.sleep(0.2)


def received_again(broker, holes: Holes, quiet_ms: int = 4000) -> tuple[int, int]:
    """(messages received, acknowledged messages among them) by a consumer that attaches to the
    subscription after a reload and receives until ``quiet_ms`` pass without a message."""
    import pulsar

    client = broker.client()
    received = acked_again = 0
    try:
        consumer = client.subscribe(holes.topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared)
        while True:
            try:
                message = consumer.receive(quiet_ms)
            except pulsar.Timeout:
                break
            received += 1
            acked_again += (message.message_id().ledger_id(), message.message_id().entry_id()) in holes.acked
    finally:
        client.close()
    return received, acked_again
