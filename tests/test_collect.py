"""collect against a local HTTP server replaying recorded admin API responses (Pulsar's format).

tests/fixtures/admin_api/<url path>.json holds the body of ``GET <url path>``; an empty file is
an HTTP 204 (a policy that is not set).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from brokerlens.settings import Settings
from brokerlens.sources import collect as collect_module
from brokerlens.sources.collect import CollectError, collect

FIXTURES = Path(__file__).parent / "fixtures" / "admin_api"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXJvbGU.do-not-leak-3f9a"
FLAKY = "/admin/v2/persistent/acme/orders/order-events/stats"


class Replay(BaseHTTPRequestHandler):
    token = TOKEN
    overrides: dict[str, object] = {}
    failures: dict[str, int] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(401, {"reason": "Authentication required"})
        if self.failures.get(path, 0) > 0:
            self.failures[path] -= 1
            return self._send(500, {"reason": "Internal Server Error"})
        if path.endswith("/partitioned-stats") and url.query != "perPartition=true":
            return self._send(400, {"reason": "expected perPartition=true"})
        if path in self.overrides:
            body = self.overrides[path]
            return self._send(204, None) if body is None else self._send(200, body)
        file = FIXTURES / (path.lstrip("/") + ".json")
        if not file.is_file():
            return self._send(404, {"reason": "Topic not found"})
        text = file.read_text()
        if not text.strip():
            return self._send(204, None)
        self._send(200, json.loads(text))

    def _send(self, status, body):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep test output quiet
        pass


@contextmanager
def serving(handler):
    """The base URL of a server on 127.0.0.1 answering with ``handler``, stopped after the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def admin():
    Replay.overrides, Replay.failures, Replay.seen = {}, {FLAKY: 1}, []
    with serving(Replay) as url:
        yield url


@pytest.fixture
def collect_settings(brokerlens_home):
    return Settings(admin_token=TOKEN, collect={"backoff_seconds": 0, "concurrency": 4})


def fixture(path: str):
    return json.loads((FIXTURES / (path.lstrip("/") + ".json")).read_text())


def landed(settings: Settings, kind: str) -> list[Path]:
    return sorted(settings.landing.glob(f"*/{kind}/collect-*"))


def test_collect_writes_envelopes_verbatim(admin, collect_settings, caplog):
    caplog.set_level(logging.DEBUG)
    result = collect(None, collect_settings, admin_url=admin)
    [ts_file] = landed(collect_settings, "topic-stats")
    envelopes = {e["topic"]: e for e in json.loads(ts_file.read_text())}
    assert set(envelopes) == {"persistent://acme/orders/order-events", "persistent://acme/orders/orders"}
    events = envelopes["persistent://acme/orders/order-events"]
    assert events["stats"] == fixture("/admin/v2/persistent/acme/orders/order-events/stats")
    assert events["cluster"] == "c1" and events["broker"] == "broker-1:8080"  # from the lookup
    assert events["collected_at"].startswith(ts_file.parent.parent.name)
    orders = envelopes["persistent://acme/orders/orders"]
    assert orders["stats"] == fixture("/admin/v2/persistent/acme/orders/orders/partitioned-stats")
    [is_file] = landed(collect_settings, "internal-stats")
    internal = {e["topic"]: e for e in json.loads(is_file.read_text())}
    partitions = orders["stats"]["partitions"]
    assert set(internal) == {"persistent://acme/orders/order-events", *partitions}
    for name, part in partitions.items():
        assert internal[name]["broker"] == part["ownerBroker"]
        local = name.rsplit("/", 1)[1]
        assert internal[name]["stats"] == fixture(f"/admin/v2/persistent/acme/orders/{local}/internalStats")
    # The flaky endpoint failed once with HTTP 500 and was retried.
    assert sum(1 for path, _ in Replay.seen if path == FLAKY) == 2
    assert result.metrics["errors"] == 0 and result.metrics["topics"] == 2
    # Every request carried the token; it appears in no log line and no landing file.
    assert all(auth == f"Bearer {TOKEN}" for _, auth in Replay.seen)
    assert TOKEN not in caplog.text and TOKEN not in result.render()
    for path in collect_settings.landing.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text()


@pytest.mark.slow
def test_policies_only_when_changed(admin, collect_settings):
    times = []  # each collect's time, which dates its policy changes

    def collected():
        result = collect(None, collect_settings, admin_url=admin)
        times.append(re.search(r"\(collected_at (\S+),", "\n".join(result.lines)).group(1))

    collected()
    [first] = landed(collect_settings, "policies")
    records = [json.loads(line) for line in first.read_text().splitlines()]
    by_kind = {(r["kind"], r.get("namespace") or r.get("topic") or r.get("broker")): r for r in records}
    assert set(by_kind) == {
        ("namespace-dispatch-rate", "acme/orders"),
        ("namespace-subscription-dispatch-rate", "acme/orders"),
        ("topic-dispatch-rate", "persistent://acme/orders/order-events"),
        ("topic-subscription-dispatch-rate", "persistent://acme/orders/orders"),
        ("broker-config", "broker-1:8080"),
        ("broker-config", "broker-2:8080"),
    }
    assert by_kind[("topic-dispatch-rate", "persistent://acme/orders/order-events")]["policy"] == fixture(
        "/admin/v2/persistent/acme/orders/order-events/dispatchRate"
    )
    broker = by_kind[("broker-config", "broker-1:8080")]["policy"]
    # The dynamic value (1500, a string in the API) wins over the runtime "0", typed for landing.
    assert broker["dispatchThrottlingRateInMsg"] == 1500
    assert broker["preciseDispatcherFlowControl"] is False and broker["managedLedgerMaxUnackedRangesToPersist"] == 10000
    assert "webServicePort" not in broker

    # Nothing changed: no policy records.
    Replay.failures = {}
    collected()
    assert len(landed(collect_settings, "policies")) == 1

    # A changed namespace limit and a removed topic policy: exactly those two records.
    Replay.overrides = {
        "/admin/v2/namespaces/acme/orders/subscriptionDispatchRate": {
            "dispatchThrottlingRateInMsg": 120,
            "dispatchThrottlingRateInByte": -1,
            "relativeToPublishRate": False,
            "ratePeriodInSecond": 1,
        },
        "/admin/v2/persistent/acme/orders/order-events/dispatchRate": None,
    }
    collected()
    third = landed(collect_settings, "policies")[-1]
    records = [json.loads(line) for line in third.read_text().splitlines()]
    assert sorted((r["kind"], r["policy"] and r["policy"]["dispatchThrottlingRateInMsg"]) for r in records) == [
        ("namespace-subscription-dispatch-rate", 120),
        ("topic-dispatch-rate", None),
    ]
    # The broker applied each change between the collect that last saw the old value and this one:
    # a cut (200 -> 120) counts from this collect, a removal (no limit) from the start of the
    # second (the rate period) of the one before.
    assert sorted((r["kind"], r["effective_at"]) for r in records) == [
        ("namespace-subscription-dispatch-rate", times[2]),
        ("topic-dispatch-rate", times[1][:19] + "Z"),
    ]

    # Messages raised (120 -> 300) and bytes cut (none -> 5000) at once: the looser of the two
    # (300, no byte limit) from the last collect, the new policy from this one.
    Replay.overrides["/admin/v2/namespaces/acme/orders/subscriptionDispatchRate"] = {
        "dispatchThrottlingRateInMsg": 300,
        "dispatchThrottlingRateInByte": 5000,
        "relativeToPublishRate": False,
        "ratePeriodInSecond": 1,
    }
    collected()
    records = [json.loads(line) for line in landed(collect_settings, "policies")[-1].read_text().splitlines()]
    assert [(r["effective_at"], r["policy"]["dispatchThrottlingRateInMsg"], r["policy"]["dispatchThrottlingRateInByte"]) for r in records] == [
        (times[2][:19] + "Z", 300, -1),
        (times[3], 300, 5000),
    ]


def test_two_collects_of_one_millisecond_keep_both_snapshots(admin, collect_settings, monkeypatch):
    """Two clusters collected into one landing at the same millisecond: neither snapshot replaces
    the other's file."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 27, 10, 15, 0, 250000, tzinfo=timezone.utc)

    monkeypatch.setattr(collect_module, "datetime", Frozen)
    for cluster in ("c1", "c2"):
        collect(None, Settings(admin_token=TOKEN, collect={"backoff_seconds": 0, "cluster": cluster}), admin_url=admin)
    files = landed(collect_settings, "topic-stats")
    assert [f.name for f in files] == ["collect-101500-250-2.json", "collect-101500-250.json"]
    assert sorted({e["cluster"] for e in json.loads(f.read_text())}.pop() for f in files) == ["c1", "c2"]
    assert [f.name for f in landed(collect_settings, "internal-stats")] == ["collect-101500-250-2.json", "collect-101500-250.json"]
    assert not list(collect_settings.landing.rglob(".*"))  # no temporary file left


def test_each_topic_is_dated_when_its_stats_are_asked_for(admin, collect_settings, monkeypatch):
    """A collect begun a few milliseconds before midnight asks for its topics' stats after it: each
    topic's snapshot (and its partitions' internal stats) carries the time its stats were asked
    for and lands under that time's day; the collect's own files (policies) stay under its day."""
    midnight = datetime(2026, 11, 28, tzinfo=timezone.utc)
    calls = []

    class Ticking(datetime):
        @classmethod
        def now(cls, tz=None):
            calls.append(None)  # the day check, the collect's time, then one per topic
            return midnight + timedelta(milliseconds=-5 if len(calls) <= 2 else 10 * len(calls))

    monkeypatch.setattr(collect_module, "datetime", Ticking)
    collect(None, collect_settings, admin_url=admin)
    assert [p.relative_to(collect_settings.landing).parts[:2] for p in landed(collect_settings, "policies")] == [("2026-11-27", "policies")]
    [ts_file] = landed(collect_settings, "topic-stats")
    assert ts_file.parent.parent.name == "2026-11-28"
    topics = {e["topic"]: e["collected_at"] for e in json.loads(ts_file.read_text())}
    assert sorted(topics.values()) == ["2026-11-28T00:00:00.030Z", "2026-11-28T00:00:00.040Z"]
    [is_file] = landed(collect_settings, "internal-stats")
    internal = {e["topic"]: e["collected_at"] for e in json.loads(is_file.read_text())}
    assert internal["persistent://acme/orders/order-events"] == topics["persistent://acme/orders/order-events"]
    assert {at for name, at in internal.items() if "-partition-" in name} == {topics["persistent://acme/orders/orders"]}


def test_without_hard_links_a_new_file_still_never_replaces_one(tmp_path, monkeypatch):
    """A landing on a filesystem without hard links (os.link refused): the next free name all the same."""
    from brokerlens.sources.landing import write_new

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refused)
    path = tmp_path / "topic-stats" / "collect-101500-250.json"
    written = [write_new(path, f"{n}\n") for n in range(3)]
    assert [p.name for p in written] == ["collect-101500-250.json", "collect-101500-250-2.json", "collect-101500-250-3.json"]
    assert [p.read_text() for p in written] == ["0\n", "1\n", "2\n"]
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(p.name for p in written)


def test_collects_at_once_keep_each_others_policy_state(tmp_path):
    """The collect state's read-modify-write is under a lock: sixteen collects of sixteen clusters
    at once each find their own change recorded."""
    state = tmp_path / "_collect_state.json"

    def one(n: int):
        return collect_module._changed_policies(state, f"c{n}", [("broker-config", "b:8080", {"x": n})], "2026-11-27T10:00:00.000Z")

    with ThreadPoolExecutor(16) as pool:
        changes = list(pool.map(one, range(16)))
    assert [len(changed) for changed, _ in changes] == [1] * 16
    saved = json.loads(state.read_text())
    assert {k: v for k, v in saved.items() if not k.endswith("|_collected_at")} == {f"c{n}|broker-config|b:8080": {"x": n} for n in range(16)}


def test_wrong_token_is_a_clear_error_without_the_token(admin, brokerlens_home):
    settings = Settings(admin_token="wrong-" + TOKEN, collect={"backoff_seconds": 0})
    with pytest.raises(CollectError, match="HTTP 401") as err:
        collect(None, settings, admin_url=admin)
    assert TOKEN not in str(err.value)


def test_server_down_after_retries(collect_settings):
    with pytest.raises(CollectError, match="after 4 attempts"):
        collect(None, collect_settings, admin_url="http://127.0.0.1:9")


def test_cli_never_prints_the_token(admin, brokerlens_home, brokerlens_command):
    env = {**os.environ, "BROKERLENS_ADMIN_TOKEN": TOKEN, "BROKERLENS_COLLECT__BACKOFF_SECONDS": "0"}
    run = subprocess.run(brokerlens_command("-v", "collect", "--admin-url", admin), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "topics=2" in run.stdout and "retry" in run.stderr  # the 500 was retried, and said so
    assert TOKEN not in run.stdout + run.stderr


def test_cli_error_is_one_readable_line(admin, brokerlens_home, brokerlens_command):
    env = {**os.environ, "BROKERLENS_ADMIN_TOKEN": "not-the-token-7c1d", "BROKERLENS_COLLECT__BACKOFF_SECONDS": "0"}
    run = subprocess.run(brokerlens_command("collect", "--admin-url", admin), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "error: collect failed: GET /admin/v2/clusters: HTTP 401" in run.stderr
    assert "Traceback" not in run.stderr and "not-the-token-7c1d" not in run.stderr
