"""collect fetches the broker interceptor's dispatch records (sources/exporter.py) from a local
HTTP server that answers the admin API's listing and the interceptor's path as a 4.0.7 broker
with brokerlens' NAR does (headers and paging of RecordBuffer.after); the live broker's proof is
tests/test_live_exporter.py."""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import pytest
from test_collect import serving

from brokerlens.settings import Settings
from brokerlens.sources import exporter
from brokerlens.sources.collect import STATE_FILE, collect

TOKEN = "exporter-token-do-not-leak-77"


def record(seq: int, start: str, msgs: int = 5) -> dict:
    return {"period_start": start, "period_seconds": 1, "level": "broker", "cluster": "c1", "broker": Broker.name,
            "msgs": msgs, "bytes": msgs * 100, "entries": 1, "redelivered_msgs": 0, "source": "exporter", "seq": seq}  # fmt: skip


class Broker(BaseHTTPRequestHandler):
    """One broker: the admin listing names itself and ``others``; its interceptor holds ``records``
    (seq ``first``..), dropped ``dropped`` since ``epoch``."""

    name = ""
    others: list[str] = []
    epoch = "1000"
    records: list[dict] = []
    dropped = 0
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802
        url = urlsplit(self.path)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(401, b"{}")
        listing = {"/admin/v2/clusters": ["c1"], "/admin/v2/tenants": [], "/admin/v2/brokers/c1": [self.name, *self.others]}
        if url.path in listing:
            return self._send(200, json.dumps(listing[url.path]).encode())
        if url.path != exporter.PATH:
            return self._send(404, b'{"reason": "not found"}')
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        after = int(q.get("after", 0)) if q.get("epoch") in (None, self.epoch) else 0
        limit = int(q.get("limit", 100_000))
        first = self.records[0]["seq"] if self.records else self.dropped + 1
        last = self.records[-1]["seq"] if self.records else self.dropped
        page = [r for r in self.records if r["seq"] > after][:limit]
        headers = {"Epoch": self.epoch, "First-Seq": first, "Last-Seq": last, "Dropped-Records": self.dropped,
                   "Missed-Records": max(0, min(first - 1, last) - max(after, 0)), "Dispatch-Errors": 0}  # fmt: skip
        self._send(200, "".join(json.dumps(r) + "\n" for r in page).encode(), headers)

    def _send(self, status, data, headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header("X-Brokerlens-" + k, str(v))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Plain(BaseHTTPRequestHandler):
    """A broker without the interceptor: 404 on its path."""

    hits = 0

    def do_GET(self):  # noqa: N802
        Plain.hits += 1
        self.send_response(404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def brokers():
    with serving(Broker) as url, serving(Plain) as plain:
        Broker.name, Broker.others = url.removeprefix("http://"), [plain.removeprefix("http://")]
        Broker.epoch, Broker.dropped, Broker.seen, Plain.hits = "1000", 0, [], 0
        Broker.records = [record(1, "2026-11-21T23:59:59Z"), record(2, "2026-11-22T00:00:00Z"), record(3, "2026-11-22T00:00:01Z")]
        yield url


@pytest.fixture
def settings(brokerlens_home):
    return Settings(admin_token=TOKEN, collect={"backoff_seconds": 0})


def landed(settings) -> dict[str, list[dict]]:
    out = {}
    for path in sorted(settings.landing.glob("*/dispatch/exporter-*.jsonl")):
        out[str(path.relative_to(settings.landing))] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def state(settings) -> dict:
    return json.loads((settings.landing / STATE_FILE).read_text())


def test_lands_records_by_day_of_the_period_and_remembers_the_seq(brokers, settings, caplog):
    caplog.set_level(logging.INFO)
    result = collect(None, settings, admin_url=brokers)
    files = landed(settings)
    file_broker = Broker.name.replace(":", "_")
    assert sorted(name.split("/")[0] for name in files) == ["2026-11-21", "2026-11-22"]
    assert all(f"/dispatch/exporter-{file_broker}-" in name for name in files)
    assert [r["seq"] for rs in files.values() for r in rs] == [1, 2, 3]
    assert state(settings)[f"exporter|{Broker.name}"] == {"epoch": "1000", "seq": 3, "installed": True}
    assert result.metrics["exporter_records"] == 3 and result.metrics["exporter_brokers"] == 1
    assert result.metrics["exporter_missed_records"] == 0 and result.metrics["errors"] == 0
    # The admin token went to the broker's path, and nowhere in the logs or the result.
    assert all(auth == f"Bearer {TOKEN}" for _, auth in Broker.seen)
    assert TOKEN not in caplog.text and TOKEN not in "\n".join(result.lines)

    # Next run: only what came after seq 3.
    Broker.records.append(record(4, "2026-11-22T00:00:02Z"))
    result = collect(None, settings, admin_url=brokers)
    assert result.metrics["exporter_records"] == 1
    assert [r["seq"] for rs in landed(settings).values() for r in rs] == [1, 2, 3, 4]
    assert "after=3" in Broker.seen[-1][0] and "epoch=1000" in Broker.seen[-1][0]


def test_a_broker_without_the_interceptor_is_said_once_and_not_an_error(brokers, settings, caplog):
    caplog.set_level(logging.INFO)
    first = collect(None, settings, admin_url=brokers)
    second = collect(None, settings, admin_url=brokers)
    plain = Broker.others[0]
    assert Plain.hits == 2
    assert [line for line in first.lines if "not installed" in line] == [
        f"exporter: not installed on {plain} (404 on {exporter.PATH}); its dispatch periods come from counters only"
    ]
    assert not [line for line in second.lines if "not installed" in line]
    assert caplog.text.count(f"not installed on {plain}") == 1
    assert first.metrics["exporter_brokers_without"] == second.metrics["exporter_brokers_without"] == 1
    assert first.metrics["exporter_errors"] == 0
    assert state(settings)[f"exporter|{plain}"] == {"installed": False}


def test_missed_records_are_a_warning_and_counted(brokers, settings, caplog):
    collect(None, settings, admin_url=brokers)
    # The interceptor's bound dropped seq 4..6 before the next fetch; 7 and 8 are kept.
    Broker.records, Broker.dropped = [record(7, "2026-11-22T00:00:05Z"), record(8, "2026-11-22T00:00:06Z")], 6
    caplog.set_level(logging.WARNING)
    result = collect(None, settings, admin_url=brokers)
    assert result.metrics["exporter_missed_records"] == 3 and result.metrics["exporter_dropped_records_total"] == 6
    assert result.metrics["exporter_records"] == 2
    assert any("dropped 3 records at its bound" in line for line in result.lines)
    assert "dropped 3 records at its bound" in caplog.text


def test_a_new_epoch_starts_from_the_first_record(brokers, settings, caplog):
    collect(None, settings, admin_url=brokers)
    Broker.epoch, Broker.records = "2000", [record(1, "2026-11-22T01:00:00Z"), record(2, "2026-11-22T01:00:01Z")]
    caplog.set_level(logging.WARNING)
    result = collect(None, settings, admin_url=brokers)
    assert result.metrics["exporter_restarts"] == 1 and result.metrics["exporter_records"] == 2
    assert "restarted (epoch 1000 -> 2000)" in caplog.text
    assert state(settings)[f"exporter|{Broker.name}"] == {"epoch": "2000", "seq": 2, "installed": True}


def test_pages(brokers, settings, monkeypatch):
    monkeypatch.setattr(exporter, "PAGE", 2)
    result = collect(None, settings, admin_url=brokers)
    assert result.metrics["exporter_records"] == 3
    assert len([p for p, _ in Broker.seen if p.startswith(exporter.PATH)]) == 2


def test_switched_off(brokers, brokerlens_home):
    settings = Settings(admin_token=TOKEN, collect={"backoff_seconds": 0, "exporter": False})
    result = collect(None, settings, admin_url=brokers)
    assert not [p for p, _ in Broker.seen if p.startswith(exporter.PATH)] and Plain.hits == 0
    assert not landed(settings) and "exporter_records" not in result.metrics
