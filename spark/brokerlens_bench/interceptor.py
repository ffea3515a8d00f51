"""The interceptor section: a live Pulsar standalone's dispatch throughput without and with
brokerlens' broker interceptor (infra/pulsar/interceptor/, docs/interceptor.md), side by side in
one run.

Each round starts a fresh 4.0.7 standalone (infra/pulsar/standalone.py) on one side, runs a
producer (batching on, asynchronous sends, blocking when its queue is full) and a consumer
(receive, then acknowledge each message) at full speed on one new topic, and after a warm-up
measures for a fixed number of seconds: the messages the broker dispatched, from the
subscription's own ``msgOutCounter`` read through the admin API at the start and end of the
window, the messages the consumer received, those published (the topic's ``msgInCounter``), and
the broker JVM's CPU seconds (user + system). The sides alternate (without, with, without, with,
...) so that drift on a shared machine hits both; the overhead is ``1 - with / without`` of the
medians of dispatched messages per second.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

log = logging.getLogger("brokerlens.bench")

REPO = Path(__file__).resolve().parents[2]
PULSAR = "4.0.7"  # the version the interceptor is tested on (infra/pulsar/fetch.py's LTS)
TARGET_PERCENT = 2.0  # issue 29: at most 2 % of dispatch throughput lost
# The real figure's defaults (make bench); a smoke: --interceptor-rounds 1 --interceptor-seconds 3 --interceptor-warmup 2.
ROUNDS = 3
SECONDS = 30.0
WARMUP_SECONDS = 10.0
PAYLOAD_BYTES = 100
SUBSCRIPTION = "bench"
SIDES = {False: "without", True: "with"}


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def overhead_percent(without: float, with_: float) -> float:
    """Throughput lost to the interceptor, in percent: ``1 - with / without`` (negative: faster with it)."""
    return round(100 * (1 - with_ / without), 2)


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1)


def summary(runs: list[dict], seconds: float, warmup: float, payload: int = PAYLOAD_BYTES, version: str = PULSAR) -> dict:
    """The section's entry in the results file from its rounds (``measure_round``'s dicts, in the order run)."""
    medians = {
        figure: {side: median([r[figure] for r in runs if r["interceptor"] == flag]) for flag, side in SIDES.items()}
        for figure in ("dispatched_per_second", "consumer_per_second", "published_per_second", "broker_cpu_us_per_message")
    }
    lost = overhead_percent(medians["dispatched_per_second"]["without"], medians["dispatched_per_second"]["with"])
    return {
        "pulsar": version,
        "setup": f"a standalone started per round; one non-partitioned topic, one exclusive subscription; "
        f"{payload}-byte messages, producer batching with asynchronous sends, consumer receives and acknowledges each",
        "warmup_seconds": warmup,
        "seconds": seconds,
        "rounds": sum(1 for r in runs if r["interceptor"]),
        "order": [SIDES[r["interceptor"]] for r in runs],
        "runs": runs,
        "medians": medians,
        "overhead_percent": lost,
        "target_percent": TARGET_PERCENT,
        "target_met": lost <= TARGET_PERCENT,
    }


def window(start: dict, end: dict) -> dict:
    """One round's figures from the two readings at the measured window's start and end."""
    seconds = end["at"] - start["at"]
    dispatched = end["msg_out"] - start["msg_out"]
    received = end["received"] - start["received"]
    cpu = end["cpu"] - start["cpu"]
    return {
        "window_seconds": round(seconds, 2),
        "dispatched": dispatched,
        "dispatched_per_second": rate(dispatched, seconds),
        "consumer_received": received,
        "consumer_per_second": rate(received, seconds),
        "published_per_second": rate(end["msg_in"] - start["msg_in"], seconds),
        "broker_cpu_seconds": round(cpu, 2),
        "broker_cpu_us_per_message": round(1e6 * cpu / dispatched, 2) if dispatched else None,
    }


def markdown_lines(section: dict) -> list[str]:
    """The section in docs/benchmarks.md: the medians, the overhead against its target, a row per round."""
    m, n = section["medians"], section["rounds"]
    met = "met" if section["target_met"] else "missed"
    lines = [
        f"Interceptor overhead (Pulsar {section['pulsar']} standalone; {section['setup']}; {n} round{'s' if n != 1 else ''} a side, "
        f"alternated, {section['seconds']:g} s measured after {section['warmup_seconds']:g} s of warm-up): median dispatched "
        f"{m['dispatched_per_second']['without']:,.0f} msg/s without the interceptor, {m['dispatched_per_second']['with']:,.0f} with it: "
        f"{section['overhead_percent']} % lost (target at most {section['target_percent']:g} %: {met}); broker CPU "
        f"{m['broker_cpu_us_per_message']['without']} and {m['broker_cpu_us_per_message']['with']} µs per message.",
        "",
        "| round | interceptor | dispatched msg/s (msgOutCounter) | consumer msg/s | published msg/s | broker CPU µs/msg | load 1m before |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in section["runs"]:
        lines.append(
            f"| {r['round']} | {SIDES[r['interceptor']]} | {r['dispatched_per_second']:,.0f} | {r['consumer_per_second']:,.0f} | "
            f"{r['published_per_second']:,.0f} | {r['broker_cpu_us_per_message']} | {r['load_avg_1m_before']} |"
        )
    return lines


# --- the live part ----------------------------------------------------------------------------


def _standalone():
    """infra/pulsar/standalone.py, imported the way the tests import it (its folder on sys.path)."""
    folder = str(REPO / "infra" / "pulsar")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import standalone

    return standalone


class Traffic:
    """A producer and a consumer at full speed on ``topic``, each on its own thread, until ``stop``."""

    def __init__(self, client, topic: str, payload: int):
        import pulsar

        self.consumer = client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive)
        self.producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True, max_pending_messages=10_000)
        self.payload = os.urandom(payload)
        self.ok = pulsar.Result.Ok
        self.received = self.send_errors = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True), threading.Thread(target=self._consume, daemon=True)]
        for t in self._threads:
            t.start()

    def _sent(self, result, _message_id) -> None:
        if result != self.ok:
            self.send_errors += 1

    def _produce(self) -> None:
        send, payload, callback = self.producer.send_async, self.payload, self._sent
        try:
            while not self._stop.is_set():
                send(payload, callback)
        except Exception as exc:  # noqa: BLE001 - pulsar-client raises its own error types
            self.errors.append(f"producer: {type(exc).__name__}: {exc}")

    def _consume(self) -> None:
        import pulsar

        receive, ack = self.consumer.receive, self.consumer.acknowledge
        while not self._stop.is_set():
            try:
                message = receive(1000)
            except pulsar.Timeout:
                continue
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"consumer: {type(exc).__name__}: {exc}")
                return
            ack(message)
            self.received += 1

    def stop(self) -> None:
        """Stop both threads, then close the producer (after its pending sends) and the consumer."""
        self._stop.set()
        for t in self._threads:
            t.join(30)
        try:
            self.producer.flush()
            self.producer.close()
            self.consumer.close()
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"close: {type(exc).__name__}: {exc}")


def _reading(broker, topic: str, traffic: Traffic, cpu) -> dict:
    """The counters at one instant: the admin API's topic stats, the consumer's count, the broker's CPU."""
    before = time.monotonic()
    received = traffic.received
    used = cpu()
    stats = broker.stats(topic)
    at = (before + time.monotonic()) / 2
    return {"at": at, "msg_out": stats["subscriptions"][SUBSCRIPTION]["msgOutCounter"], "msg_in": stats["msgInCounter"], "received": received, "cpu": used}


def measure_round(root: Path, round_no: int, interceptor: bool, seconds: float, warmup: float, payload: int = PAYLOAD_BYTES) -> dict:
    """One round on one side: a fresh standalone in ``root`` (removed after), the traffic, the window."""
    import psutil

    standalone = _standalone()
    shutil.rmtree(root, ignore_errors=True)
    load = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    broker = standalone.PulsarBroker(root, PULSAR, interceptor=interceptor)
    try:
        broker.start()
        start_seconds = round(time.monotonic() - started, 1)
        process = psutil.Process(broker.process.pid)

        def cpu() -> float:
            times = process.cpu_times()
            return times.user + times.system

        topic = f"persistent://public/default/bench-interceptor-{round_no}-{SIDES[interceptor]}-{uuid.uuid4().hex[:8]}"
        client = broker.client()
        try:
            traffic = Traffic(client, topic, payload)
            try:
                time.sleep(warmup)
                first = _reading(broker, topic, traffic, cpu)
                time.sleep(seconds)
                last = _reading(broker, topic, traffic, cpu)
            finally:
                traffic.stop()
            if traffic.errors:
                raise RuntimeError("; ".join(traffic.errors))
            if not last["msg_out"] > first["msg_out"]:
                raise RuntimeError(f"nothing dispatched on {topic} in the measured window")
        finally:
            client.close()
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    figures = window(first, last)
    log.info("interceptor round %s %s: %s dispatched msg/s", round_no, SIDES[interceptor], f"{figures['dispatched_per_second']:,}")
    return {
        "round": round_no,
        "interceptor": interceptor,
        **figures,
        "send_errors": traffic.send_errors,
        "start_seconds": start_seconds,
        "load_avg_1m_before": load,
    }


def bench_interceptor(work: Path, rounds: int = ROUNDS, seconds: float = SECONDS, warmup: float = WARMUP_SECONDS, payload: int = PAYLOAD_BYTES) -> dict:
    """``rounds`` rounds a side, alternated (without, with, without, with, ...), one broker at a time."""
    runs = []
    for n in range(1, rounds + 1):
        for flag in SIDES:
            runs.append(measure_round(work / "interceptor" / f"round-{n}-{SIDES[flag]}", n, flag, seconds, warmup, payload))
    shutil.rmtree(work / "interceptor", ignore_errors=True)
    return summary(runs, seconds, warmup, payload)
