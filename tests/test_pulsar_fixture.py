"""The live-broker fixture itself: Pulsar 4.0.7 from Maven Central starts on free 127.0.0.1 ports,
takes a broker.conf override, carries messages, and stops by its pid."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pulsar_broker import LOWEST_PORT, REPO, TEST_JVM_OPTIONS, BookieReadOnly, PulsarBroker, free_port, pulsar_jars

pytestmark = pytest.mark.pulsar


@pytest.fixture(scope="module")
def broker(pulsar_brokers):
    # Broker metrics (the cursor's among them) are recomputed every statsUpdateFrequencyInSecs.
    return pulsar_brokers.get(pulsar_jars.LTS, {"managedLedgerMaxUnackedRangesToPersist": 77, "statsUpdateFrequencyInSecs": 2})


def test_fetch_is_cached(pulsar_brokers):
    """A second fetch runs no Maven (none on PATH here): the cached folder is the answer."""
    done = subprocess.run(
        [sys.executable, str(REPO / "infra" / "pulsar" / "fetch.py"), pulsar_jars.LTS],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert f"pulsar {pulsar_jars.LTS}: " in done.stdout
    assert len(list(pulsar_jars.lib_dir(pulsar_jars.LTS).glob("*.jar"))) > 250


def test_produce_consume_and_config(broker):
    topic = f"persistent://public/default/fixture-{uuid.uuid4().hex[:8]}"
    client = broker.client()
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        for i in range(5):
            producer.send(f"m{i}".encode())
        received = []
        for _ in range(5):
            message = consumer.receive(10_000)
            received.append(message.data().decode())
            consumer.acknowledge(message)
        # Pulsar 4.0.7 counts a dispatch once its write to the connection has completed (a
        # listener in Consumer.sendMessages), which can be after the client has the messages; a
        # consumer's count joins its subscription's when it leaves, and what it counts after that is
        # lost (CI once read 3 of 5 after the close). So the counters are read, until they settle,
        # while the consumer is connected.
        deadline = time.monotonic() + 10
        while True:
            stats = broker.stats(topic)
            counted = (stats["msgInCounter"], stats["subscriptions"]["s"]["msgOutCounter"])
            if counted == (5, 5) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        client.close()
    assert received == [f"m{i}" for i in range(5)]
    assert counted == (5, 5)
    assert broker.runtime_config()["managedLedgerMaxUnackedRangesToPersist"] == "77"
    assert broker.version == pulsar_jars.LTS
    assert f"pulsar-broker-{pulsar_jars.LTS}.jar" in {p.name for p in broker.lib.iterdir()}


def test_metrics_names_are_pulsar_not_brk(broker):
    """/metrics writes the broker's brk_ names as pulsar_ (PrometheusMetricsGenerator): the cursor's
    range count is pulsar_ml_cursor_nonContiguousDeletedMessagesRange on 4.0.7, and no family
    starts with brk_."""
    deadline = time.monotonic() + 30
    while True:
        names = {line.split("{")[0].split(" ")[0] for line in broker.metrics().splitlines() if line and not line.startswith("#")}
        if "pulsar_ml_cursor_nonContiguousDeletedMessagesRange" in names or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "pulsar_ml_cursor_nonContiguousDeletedMessagesRange" in names
    assert f'version="{pulsar_jars.LTS}"' in broker.metrics()
    assert not {n for n in names if n.startswith("brk_")}


def test_listens_on_loopback_only(broker):
    ports = {c.laddr for c in psutil.Process(broker.process.pid).net_connections("tcp") if c.status == "LISTEN"}
    assert {port for _, port in ports} >= {broker.broker_port, broker.web_port, broker.bookie_port}
    assert {host.removeprefix("::ffff:") for host, _ in ports} == {"127.0.0.1"}


def test_stop_by_pid(broker):
    """SIGTERM by its pid (last in this module: a later ``get`` starts it again on the same data)."""
    pid = broker.process.pid
    broker.stop()
    assert not broker.running
    assert not psutil.pid_exists(pid)
    # 143: the JVM's exit on SIGTERM after its shutdown hooks ran (not SIGKILL's -9).
    assert broker.process.returncode in (0, 143)


@contextlib.contextmanager
def taken(port: int):
    """Another process's listener on ``port`` meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a stopped broker's connections linger in TIME_WAIT
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        yield


def test_a_port_taken_before_the_start_is_picked_again(broker):
    """A port picked at construction and taken by another process before the broker binds it (CI
    once saw the web port taken by the time the pool started a broker again): the start picks other
    broker and web ports and starts again; the bookie keeps its port, which its cookie records."""
    web_port, bookie_port, starts = broker.web_port, broker.bookie_port, broker.starts
    with taken(web_port):
        broker.start()
    try:
        assert broker.web_port != web_port
        assert broker.bookie_port == bookie_port
        assert broker.starts == starts + 2
        assert "Address already in use" in broker.log_path.read_text(errors="replace")
        assert "public/default" in broker.admin("GET", "/admin/v2/namespaces/public")
    finally:
        broker.stop()


def test_a_port_taken_before_a_first_start_is_picked_again(tmp_path):
    """The same on a broker's first start: what the failed attempt wrote goes, and the bookie takes
    another port as well."""
    broker = PulsarBroker(tmp_path / "broker", pulsar_jars.LTS, jvm_options=TEST_JVM_OPTIONS)
    web_port, bookie_port = broker.web_port, broker.bookie_port
    with taken(web_port):
        broker.start()
    try:
        assert broker.web_port != web_port and broker.bookie_port != bookie_port
        assert broker.starts == 2
        assert "public/default" in broker.admin("GET", "/admin/v2/namespaces/public")
    finally:
        broker.kill()  # its data is the test's own: no graceful shutdown needed


def test_a_bookie_that_starts_read_only_is_named_at_once(tmp_path):
    """A disk fuller than ``diskUsageThreshold`` makes the bookie read-only (a CI machine's disk at
    0.965 against BookKeeper's default 0.95 did): the start says so with the DiskChecker's line,
    once, without the probe's timeout or more attempts. The threshold below the disk's use is
    what the machine's disk does to the default; the default the brokers get is 0.99."""
    usage = shutil.disk_usage(tmp_path)
    used = 1 - usage.free / usage.total
    below = round(used / 2, 3)  # BookKeeper refuses a warning threshold above the threshold
    broker = PulsarBroker(tmp_path / "broker", pulsar_jars.LTS, {"diskUsageThreshold": below, "diskUsageWarnThreshold": below}, jvm_options=TEST_JVM_OPTIONS)
    assert PulsarBroker(tmp_path / "other", pulsar_jars.LTS).config["diskUsageThreshold"] == 0.99
    began = time.monotonic()
    with pytest.raises(BookieReadOnly, match=r"diskUsageThreshold=0\.\d+(?s:.*)Used space fraction: 0\.\d+ > threshold"):
        broker.start()
    assert broker.starts == 1 and not broker.running
    assert time.monotonic() - began < 60


def test_free_ports_are_below_the_ephemeral_range():
    """Outgoing connections and binds to port 0 take the kernel's ephemeral ports, so the brokers'
    ports, bound only later, are picked below that range."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < low for port in ports), ports
    assert len(ports) > 1


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch):
    """None of free_port's ports is held until its server binds it: a later call must not return
    it again (a broker's web port once came out as its bookie's)."""
    import standalone

    # Three ports to pick from, free now: a broker of the live tests beside this one may hold any.
    low = next(p for p in range(25000, 30000, 3) if all(_bindable(p + i) for i in range(3)))
    monkeypatch.setattr(standalone, "_handed_out", set())
    monkeypatch.setattr(standalone, "LOWEST_PORT", low)
    monkeypatch.setattr(standalone, "_ephemeral_low", lambda: low + 3)
    assert sorted(standalone.free_port() for _ in range(3)) == [low, low + 1, low + 2]
    # Then none is left below the ephemeral range: the kernel's picks are not repeated either.
    more = [standalone.free_port() for _ in range(50)]
    assert len(set(more)) == 50 and min(more) >= low + 3, more


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
