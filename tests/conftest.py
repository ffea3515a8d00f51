"""One SparkSession for the whole test session; a fresh BROKERLENS_HOME for every test."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from airflow_harness import JIT_ENV

REPO = Path(__file__).resolve().parents[1]
# Fixtures that tests of several files share: the local SMTP server, the report's seeded day.
pytest_plugins = ["alert_helpers", "report_data"]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Tests must not pick up a developer's settings file.
os.environ.pop("BROKERLENS_CONFIG", None)
# The brokerlens processes tests start (commands, Connect servers, the DAG's spark-submits) each
# run a small day or a query once, in a new JVM: with the quick compiler only, a cold
# `brokerlens sql` took 10.2 s against 14.2-20.4 s, a cold report 28 s against 32-37 s
# (2026-11-27, 2 cores). The tests' own session keeps the JVM's default (see spark below).
os.environ.setdefault(JIT_ENV, "-XX:TieredStopAtLevel=1")


# make test runs two pytest-xdist workers. The tests that mostly wait on other processes (a live
# broker, Airflow's runs) are one unit of work, run by one worker in file order, which also keeps
# one pool of brokers and its ports; every other file is a unit of its own, handed to whichever
# worker is free, so the in-process Spark tests fill the core the waiting ones leave idle. The
# units are handed out in the order below: the waiting ones, then the longest files (about 300,
# 290 and 210 s each in a run of 2026-11-29), so that no worker ends alone on one of them.
WAITING = ("test_dags.py", "test_daily_dag_e2e.py", "test_pulsar_fixture.py")
LONGEST = ("test_timezones.py", "test_alerting_delivery.py", "test_tables.py")


def waits(name: str) -> bool:
    return name.startswith("test_live_") or name in WAITING


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "waiting" if waits(Path(path).name) else path

    config.option.loadscopereorder = False  # the workers' collection order, below
    return Lanes(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted({item.path.name for item in items if item.get_closest_marker("pulsar") and not waits(item.path.name)})
    if strays:
        raise pytest.UsageError(f"live-broker tests belong in test_live_*.py files (one worker runs them): {', '.join(strays)}")
    if hasattr(config, "workerinput"):  # an xdist worker's collection: the order units are handed out in

        def unit_order(item) -> int:
            name = item.path.name
            if waits(name):
                return 0
            return 1 + (LONGEST.index(name) if name in LONGEST else len(LONGEST))

        items.sort(key=unit_order)  # stable: each file's tests stay in their order


@pytest.fixture(scope="session")
def spark():
    from brokerlens.platform.spark import get_spark
    from brokerlens.settings import Settings

    # Two shuffle partitions, one per core: the tests' days are tiny, and each task is overhead
    # (make test-fast: 175 s against 197 s with 4, one run each, 2026-11-27).
    # Long-lived, it runs hundreds of stages: the optimising compiler pays (make test-fast: 164.5 s
    # against 174.8 s with the quick compiler only, 2026-11-27).
    # Its Spark Connect service, when a test asks for it (connect_url), takes a port free then.
    connect = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": "0"}
    # The JVM starts under a zone half an hour off UTC, as a brokerlens JVM may on an operator's
    # machine, and must be in UTC all the same (test_timezones builds its day in it).
    with mock.patch.dict(os.environ, TZ="Asia/Kolkata"):
        session = get_spark(Settings(spark={"shuffle_partitions": 2, "driver_memory": "3g", "conf": connect}))
    # The C library keeps the zone it first read: had that been while TZ said Kolkata (the
    # session's first log line), this process's local time, by which PySpark turns timestamps
    # into datetimes, would stay Kolkata's (test_land run alone failed so).
    time.tzset()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_url(spark) -> str:
    """The tests' own JVM as a Spark Connect server too (Spark's service, started on first use),
    for `brokerlens` commands a test runs as processes of their own: as clients of it (``spark.remote``),
    as the DAG's tasks are of theirs, they start no JVM each (a cold one: 20 to 40 s of CPU)."""
    service = spark.sparkContext._jvm.org.apache.spark.sql.connect.service
    service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    return f"sc://127.0.0.1:{getattr(getattr(service, 'SparkConnectService$'), 'MODULE$').localPort()}"


@pytest.fixture(autouse=True)
def brokerlens_home(tmp_path, monkeypatch):
    """Every test gets its own landing, lake, reports and outbox under tmp_path."""
    from brokerlens.settings import reload_settings

    home = tmp_path / "var"
    monkeypatch.setenv("BROKERLENS_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    reload_settings()
    # A command run in this process (typer's CliRunner) configures logging for itself: its root
    # handler writes to that run's captured stderr, closed once the run ends. Put the logging of
    # before back, or a later test's records go to a closed stream.
    root, factory = logging.getLogger(), logging.getLogRecordFactory()
    handlers, levels = list(root.handlers), {name: logging.getLogger(name).level for name in ("", "brokerlens")}
    yield home
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.setLogRecordFactory(factory)
    reload_settings()


@pytest.fixture
def every_metric_family(brokerlens_home, monkeypatch):
    """Land every /metrics sample (``land.metric_families = ["*"]``), for the tests of the parser
    itself; ask for it before ``settings``."""
    from brokerlens.settings import reload_settings

    monkeypatch.setenv("BROKERLENS_LAND__METRIC_FAMILIES", '["*"]')
    reload_settings()


@pytest.fixture
def settings(brokerlens_home):
    from brokerlens.settings import get_settings

    return get_settings()


@pytest.fixture
def brokerlens_command():
    """argv for the installed `brokerlens` command, for tests that run it as a user would."""
    return lambda *args: [str(Path(sys.executable).with_name("brokerlens")), *args]


BROKER_POOL = pytest.StashKey["BrokerPool"]()


@pytest.fixture(scope="module", autouse=True)
def brokers_stopped_after_each_file(request):
    """The live brokers a test file started stop when it ends (BrokerPool.stop_running)."""
    yield
    pool = request.config.stash.get(BROKER_POOL, None)
    if pool is not None:
        pool.stop_running()


@pytest.fixture(scope="session")
def pulsar_brokers(tmp_path_factory, request):
    """Live Apache Pulsar standalone brokers (tests/pulsar_broker.py): ``pulsar_brokers.get(version,
    config)`` starts one per version and broker.conf overrides, or returns the running one.
    ``BROKERLENS_SKIP_PULSAR_TESTS=1`` skips every test that uses it; nothing else does: a missing
    Maven or JDK, or a failed fetch, fails them."""
    from pulsar_broker import BrokerPool, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    pool = request.config.stash[BROKER_POOL] = BrokerPool(tmp_path_factory.mktemp("pulsar"))
    yield pool
    pool.stop_running()
