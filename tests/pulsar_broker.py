"""The live-broker tests' Apache Pulsar standalone brokers: ``PulsarBroker`` (one standalone,
infra/pulsar/standalone.py, re-exported here with the pinned versions of infra/pulsar/fetch.py and
the interceptor NAR of infra/pulsar/interceptor.py) and ``BrokerPool``, the session's brokers."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "infra" / "pulsar"))
import fetch as pulsar_jars  # noqa: E402  (infra/pulsar/fetch.py: the pinned versions and the JAR cache)
import interceptor as pulsar_interceptor  # noqa: E402  (infra/pulsar/interceptor.py: brokerlens' interceptor NAR)
from standalone import LOWEST_PORT, BookieReadOnly, BrokerError, BrokerUnusable, PulsarBroker, free_port  # noqa: E402  (infra/pulsar/standalone.py: one standalone)

__all__ = [
    "LOWEST_PORT",
    "REPO",
    "BookieReadOnly",
    "BrokerError",
    "BrokerPool",
    "BrokerUnusable",
    "PulsarBroker",
    "free_port",
    "pulsar_interceptor",
    "pulsar_jars",
    "skip_reason",
]

SKIP_ENV = "BROKERLENS_SKIP_PULSAR_TESTS"
# The tests' brokers compile with C1 only: a start costs about 6 s of CPU instead of 12 (the
# optimising compiler's work on Pulsar's start-up code), and the tests' traffic is a few thousand
# messages, far below what C1's code dispatches. The bench's interceptor section, which measures
# throughput, starts its brokers with the JVM's defaults. C1 alone gets a 48 MB code cache by
# default; the pool's brokers live for a whole module, so they keep the tiered 240 MB.
TEST_JVM_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]


def skip_reason() -> str | None:
    if os.environ.get(SKIP_ENV) == "1":
        return f"{SKIP_ENV}=1: live Pulsar broker tests skipped"
    return None


class BrokerPool:
    """The session's brokers: one per (version, configuration), reused by every test that asks for
    the same (stopped after each test file, started again on their data when asked for again); at
    most ``max_running`` alive at once (starting another stops the least recently
    used). Threads may ask at once (a fixture's brokers run their experiments side by side): each
    broker starts on the thread that asked for it, the others' starts beside it."""

    def __init__(self, root: Path, max_running: int = 4):
        self.root, self.max_running = root, max_running
        self.brokers: dict[tuple, PulsarBroker] = {}  # least recently used first
        self.starting: dict[tuple, threading.Lock] = {}
        self.lock = threading.Lock()
        self.made = 0

    def get(self, version: str = pulsar_jars.LTS, config: dict | None = None, interceptor: bool = False) -> PulsarBroker:
        key = (version, tuple(sorted((k, str(v)) for k, v in (config or {}).items())), interceptor)
        with self.lock:
            broker = self.brokers.pop(key, None)
            if broker is None:
                self.made += 1
                broker = PulsarBroker(self.root / f"broker-{self.made}-{version}", version, config, interceptor, TEST_JVM_OPTIONS)
            others = [b for b in self.brokers.values() if b.running]  # least recently used first
            stopping = others[: max(0, len(others) - self.max_running + 1)]
            self.brokers[key] = broker
            starting = self.starting.setdefault(key, threading.Lock())
        for other in stopping:
            other.stop()
        with starting:
            if not broker.running:
                broker.start()
        return broker

    def stop_running(self) -> None:
        """Stop every running broker; ``get`` starts one again on its data. conftest.py calls it after
        each test file: an idle standalone spends about 2.6 s of CPU a minute (and a start about 8),
        and a file's brokers would otherwise idle through the files after it."""
        with ThreadPoolExecutor(max(1, len(self.brokers))) as pool:  # each shutdown waits on its broker alone
            list(pool.map(PulsarBroker.stop, self.brokers.values()))
