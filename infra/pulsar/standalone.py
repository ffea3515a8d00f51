"""A real Apache Pulsar standalone broker (broker, bookie and RocksDB metadata store in one JVM):
Pulsar's own JARs from Maven Central (fetch.py), every port chosen free on 127.0.0.1, the data dir
in a folder of the caller's, a bounded heap, the log in ``<root>/broker.log``; optionally with
brokerlens' interceptor NAR (interceptor.py). Stopped by its pid; can be killed with SIGKILL and
started again on the same data (a crash).

The live-broker tests (tests/pulsar_broker.py, which re-exports it) and the bench's interceptor
section (spark/brokerlens_bench/interceptor.py) import it with this folder on ``sys.path``, as
they import fetch.py and interceptor.py. Needs ``requests`` and, for ``client()`` and the start's
probe, ``pulsar-client`` (the dev extra).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch as pulsar_jars  # noqa: E402  (the pinned versions and the JAR cache)
import interceptor as pulsar_interceptor  # noqa: E402  (brokerlens' interceptor NAR)

LOOPBACK = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")
START_TIMEOUT_SECONDS = float(os.environ.get("BROKERLENS_PULSAR_START_TIMEOUT", "240"))
# What the standalone needs beyond Pulsar's defaults: one bookie, so quorums of one; no
# functions, websocket or transactions, which the tests and the bench do not use and which cost start time.
BASE_CONFIG = {
    "clusterName": "standalone",
    "advertisedAddress": "127.0.0.1",
    "bindAddress": "127.0.0.1",
    "managedLedgerDefaultEnsembleSize": 1,
    "managedLedgerDefaultWriteQuorum": 1,
    "managedLedgerDefaultAckQuorum": 1,
    "functionsWorkerEnabled": "false",
    "webSocketServiceEnabled": "false",
    "transactionCoordinatorEnabled": "false",
    "httpServerEnabled": "false",
    # The bookie binds to the loopback interface only (else it listens on every address).
    "listeningInterface": LOOPBACK,
    "allowLoopback": "true",
    # Else Pulsar's BKCluster ignores --bookkeeper-port and takes a port of its own choosing.
    "allowEphemeralPorts": "true",
    "exposeTopicLevelMetricsInPrometheus": "true",
    "exposeConsumerLevelMetricsInPrometheus": "true",
    "exposeManagedCursorMetricsInPrometheus": "true",
    "allowAutoTopicCreationType": "non-partitioned",
    # 3.0.x refuses to start when it cannot read the NIC speed (containers), for its load balancer.
    "loadBalancerOverrideBrokerNicSpeedGbps": 10,
    # The bookie reads this file too. BookKeeper's DiskChecker turns it read-only when its disk's
    # used fraction passes 0.95, and a CI machine's disk (a large volume, little of it usable) was
    # at 0.965: every broker after that one stored nothing. The test bookies write megabytes.
    "diskUsageThreshold": 0.99,
}
# What Pulsar's bin/pulsar opens on Java 17 for Netty and its metrics.
JAVA_BASE_OPENS = ("java.io", "java.util.zip", "sun.net", "jdk.internal.misc")
JVM_OPTIONS = [
    "-Xms256m",
    "-Xmx1g",
    "-XX:MaxDirectMemorySize=1g",
    "-XX:+UseG1GC",
    *[option for package in JAVA_BASE_OPENS for option in ("--add-opens", f"java.base/{package}=ALL-UNNAMED")],
    "--add-opens",
    "java.management/sun.management=ALL-UNNAMED",
    "--add-opens",
    "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-exports",
    "java.base/jdk.internal.platform=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dpulsar.allocator.exit_on_oom=true",
]
LOG4J = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %-5level [%t] %c{{1}} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""


class BrokerError(RuntimeError):
    """The standalone did not come up; the message ends with its log's last lines."""


class BrokerUnusable(BrokerError):
    """The standalone answers its admin API but cannot store a message."""


class PortTaken(BrokerError):
    """The standalone could not bind one of its ports: another process has it."""


class BookieReadOnly(BrokerError):
    """The standalone's bookie started read-only (its disk is fuller than ``diskUsageThreshold``):
    another start cannot help."""


# Starts of one standalone before it is given up (see PulsarBroker.start), and the probe's bound.
START_ATTEMPTS = 3
PROBE_TIMEOUT_SECONDS = 20
# In a namespace of its own: a lookup loads every topic of the bundle it owns
# (NamespaceService.findBrokerServiceUrl -> PulsarService.loadNamespaceTopics), and a start the
# probe finds unusable is stopped gracefully, which would close a crash's topics as an unload does.
PROBE_NAMESPACE = "public/brokerlens-probe"
PROBE_TOPIC = f"persistent://{PROBE_NAMESPACE}/probe"
# What the bookie-resolution loop (see PulsarBroker.start) logs; a sound start logs it never.
BOOKIE_UNKNOWN = "bookie is unknown"


# Ports are picked below the kernel's ephemeral range: the kernel hands ports of that range to every
# outgoing connection and every bind to port 0, so a port picked there and bound only later (a broker
# the pool stopped and starts again) can be taken meanwhile, as a CI run saw.
LOWEST_PORT = 20000
BIND_FAILED = "Address already in use"
# What BookKeeper's BookieStateManager logs when the bookie goes read-only, and its DiskChecker's why.
BOOKIE_READ_ONLY = "Transitioning Bookie to ReadOnly mode"
DISK_CHECK = "Used space fraction"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Ports this process has handed out. None is held until its server binds it, so without this a
# later call could return it again (a broker's web port once came out as its bookie's, and the
# second to bind it failed).
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the ephemeral range when there is room below it, and
    not handed out before by this process."""
    low, high = LOWEST_PORT, _ephemeral_low()
    # Sampled ports below the ephemeral range, then (none free there) the kernel's picks in it.
    wanted = itertools.chain(random.sample(range(low, high), min(200, max(0, high - low))), itertools.repeat(0))
    with _handed_out_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", next(wanted)))
                except OSError:
                    continue
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


class PulsarBroker:
    """One standalone broker. ``config`` overrides broker.conf keys (values written as given).
    ``interceptor=True`` loads brokerlens' broker interceptor (infra/pulsar/interceptor.py builds
    its NAR): the NAR is copied alone into ``<root>/interceptors`` (Pulsar keys the NARs of a
    folder by their interceptor name, so the cache's older builds must not be beside it), with
    ``brokerInterceptorsDirectory`` and ``brokerInterceptors`` set. Pulsar 4.0.7 has no
    ``disableBrokerInterceptors`` switch: a non-empty ``brokerInterceptors`` is what loads them
    (``BrokerInterceptors.load``), in the standalone as in a broker. ``jvm_options``: after ``JVM_OPTIONS``."""

    def __init__(self, root: Path, version: str = pulsar_jars.LTS, config: dict | None = None, interceptor: bool = False, jvm_options: Sequence[str] = ()):
        self.root, self.version, self.jvm_options = Path(root), version, list(jvm_options)
        self.config = {**BASE_CONFIG, **(config or {})}
        self.lib = pulsar_jars.fetch(version)
        self.interceptor_nar: Path | None = None
        if interceptor:
            self.interceptor_nar = pulsar_interceptor.build(version)
            self.config = {
                **self.config,
                "brokerInterceptorsDirectory": self.root / "interceptors",
                "brokerInterceptors": pulsar_interceptor.NAME,
                # NARs unpack here (default /tmp/pulsar-nar, shared by every broker on the machine).
                "narExtractionDirectory": self.root / "nar",
                **(config or {}),
            }
        self.broker_port, self.web_port, self.bookie_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.log_offset = 0

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def log_path(self) -> Path:
        return self.root / "broker.log"

    def _write_config(self) -> Path:
        conf = {**self.config, "brokerServicePort": self.broker_port, "webServicePort": self.web_port}
        path = self.root / "standalone.conf"
        path.write_text("".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n" for k, v in conf.items()))
        (self.root / "log4j2.properties").write_text(LOG4J.format(log=self.log_path))
        return path

    def start(self) -> PulsarBroker:
        """Start (or start again on the same data dir) and wait until ``public/default`` exists."""
        if self.running:
            raise BrokerError(f"broker {self.version} is already running (pid {self.process.pid})")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.interceptor_nar is not None:
            folder = self.root / "interceptors"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            shutil.copyfile(self.interceptor_nar, folder / self.interceptor_nar.name)
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        first_start = not (self.root / "data" / "bookkeeper").exists()
        # RocksDB and Netty unpack their native libraries into java.io.tmpdir, 13 MB a start, left
        # behind by a killed JVM: in the broker's folder they go with it.
        (self.root / "tmp").mkdir(exist_ok=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            command = [
                java,
                *JVM_OPTIONS,
                *self.jvm_options,
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                f"-Djava.io.tmpdir={self.root / 'tmp'}",
                "-cp",
                f"{self.lib}/*",
                "org.apache.pulsar.PulsarStandaloneStarter",
                "--config",
                str(self._write_config()),
                "--no-functions-worker",
                "--no-stream-storage",
                "--bookkeeper-port",
                str(self.bookie_port),
                "--bookkeeper-dir",
                str(self.root / "data" / "bookkeeper"),
                "--metadata-dir",
                str(self.root / "data" / "metadata"),
            ]
            self.log_offset = self.log_path.stat().st_size if self.log_path.is_file() else 0
            with open(self.root / "stdout.log", "ab") as out:
                self.process = subprocess.Popen(command, cwd=self.root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.starts += 1
            try:
                self._wait_ready()
                self._probe()
                return self
            except BrokerUnusable:
                # A standalone killed with SIGKILL and started on the same data can come up unable
                # to resolve its own bookie: the bookie's registration lock, left behind in the
                # RocksDB metadata store, is taken and invalidated in a loop ("bookie is unknown",
                # seen on 4.0.7 and 3.0.7). Stopped gracefully, its bookie unregisters (killed, it
                # left the lock for every later start); only the probe's namespace was loaded.
                self.stop()
                if attempt == START_ATTEMPTS:
                    raise
            except PortTaken:
                # A port picked at __init__ was taken before the broker bound it: pick others, start
                # again. The bookie keeps its port if it had data before (its cookie records it); on
                # a first start this attempt's data goes, and the bookie takes another port too. Not
                # killed: its bookie registered, and would leave its lock (above; a CI run saw it).
                self.stop()
                if attempt == START_ATTEMPTS:
                    raise
                self.broker_port, self.web_port = free_port(), free_port()
                if first_start:
                    shutil.rmtree(self.root / "data", ignore_errors=True)
                    self.bookie_port = free_port()
            except BaseException:
                self.kill()
                raise
        return self

    def _probe(self) -> None:
        """A message through a probe topic: the broker can write its ledgers (reach its bookie)."""
        import pulsar

        created = requests.put(f"{self.admin_url}/admin/v2/namespaces/{PROBE_NAMESPACE}", timeout=30)
        if created.status_code not in (204, 409):  # 409: made by an earlier start
            raise BrokerError(f"PUT namespace {PROBE_NAMESPACE}: HTTP {created.status_code} {created.text[:300]}")
        client = pulsar.Client(self.service_url, operation_timeout_seconds=PROBE_TIMEOUT_SECONDS, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            client.create_producer(PROBE_TOPIC, send_timeout_millis=PROBE_TIMEOUT_SECONDS * 1000).send(b"probe")
        except Exception as exc:  # noqa: BLE001 - pulsar-client raises its own error types
            raise BrokerUnusable(f"broker {self.version} started but cannot store a message ({exc}):\n{self.log_tail(5)}") from None
        finally:
            client.close()
        if BOOKIE_UNKNOWN in self.log_since_start():
            raise BrokerUnusable(f"broker {self.version} started but cannot resolve its own bookie ({BOOKIE_UNKNOWN!r} in its log)")

    def log_since_start(self) -> str:
        """What the broker logged since its last start (the log file is appended to across starts)."""
        if not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            # Before the exit check: a standalone that cannot bind a port shuts down, and need not
            # be waited for.
            log = self.log_since_start()
            if BIND_FAILED in log:
                raise PortTaken(f"broker {self.version} could not bind a port:\n{self.log_tail()}")
            if BOOKIE_READ_ONLY in log:
                why = "\n".join(line for line in log.splitlines() if DISK_CHECK in line) or self.log_tail()
                raise BookieReadOnly(
                    f"broker {self.version}: its bookie started read-only, so no topic can be written "
                    f"(diskUsageThreshold={self.config.get('diskUsageThreshold')}); free disk space:\n{why}"
                )
            if self.process.poll() is not None:
                raise BrokerError(f"broker {self.version} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                # The admin API answers before the standalone has created public/default.
                response = requests.get(self.admin_url + "/admin/v2/namespaces/public", timeout=5)
                if response.status_code == 200 and "public/default" in response.json():
                    return
            except (requests.ConnectionError, requests.Timeout, ValueError):
                pass
            time.sleep(1)
        raise BrokerError(f"broker {self.version} not ready in {START_TIMEOUT_SECONDS:.0f}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a graceful shutdown: topics closed, cursors persisted), SIGKILL after ``timeout``."""
        if not self.running:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: the process dies with whatever it had not persisted (a crash)."""
        if self.running:
            self.process.kill()
            self.process.wait(30)

    def restart(self, crash: bool = False) -> PulsarBroker:
        self.kill() if crash else self.stop()
        return self.start()

    def client(self):
        """A ``pulsar.Client`` on this broker that logs warnings only."""
        import pulsar

        return pulsar.Client(self.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))

    def log_tail(self, lines: int = 30) -> str:
        texts = [p.read_text(errors="replace") for p in (self.log_path, self.root / "stdout.log") if p.is_file()]
        return "\n".join("\n".join(t.splitlines()[-lines:]) for t in texts if t.strip())

    # --- admin API -------------------------------------------------------------------------
    def admin(self, method: str, path: str, **kwargs):
        response = requests.request(method, self.admin_url + path, timeout=30, **kwargs)
        if response.status_code >= 400:
            raise BrokerError(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
        return response.json() if response.content.strip() else None

    def topic_path(self, topic: str) -> str:
        """``persistent://public/default/t`` → ``/admin/v2/persistent/public/default/t``."""
        domain, rest = topic.split("://", 1)
        return f"/admin/v2/{domain}/{rest}"

    def stats(self, topic: str) -> dict:
        return self.admin("GET", self.topic_path(topic) + "/stats")

    def internal_stats(self, topic: str) -> dict:
        return self.admin("GET", self.topic_path(topic) + "/internalStats")

    def unload(self, topic: str) -> None:
        self.admin("PUT", self.topic_path(topic) + "/unload")

    def set_dynamic(self, key: str, value) -> None:
        """A dynamic broker setting (``/admin/v2/brokers/configuration/{key}/{value}``), no restart."""
        self.admin("POST", f"/admin/v2/brokers/configuration/{key}/{value}")

    def runtime_config(self) -> dict:
        return self.admin("GET", "/admin/v2/brokers/configuration/runtime")

    def metrics(self) -> str:
        response = requests.get(self.admin_url + "/metrics/", timeout=30)
        response.raise_for_status()
        return response.text
