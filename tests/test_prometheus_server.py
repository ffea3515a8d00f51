"""`brokerlens collect --prometheus-url` against a real Prometheus server.

The test loads a day of broker metrics (two brokers, one sample a minute) into a fresh data
directory with ``promtool tsdb create-blocks-from openmetrics``, starts Debian's ``prometheus``
on 127.0.0.1 with a free port, pulls the day through the HTTP API and stops the server.
``infra/install-test-tools.sh`` installs the binaries; set BROKERLENS_SKIP_SERVER_TESTS=1 to
skip where they cannot be installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from datetime import date, datetime, timezone

import pytest
import requests

from brokerlens.sources.collect import collect
from pulsar_broker import free_port  # below the ephemeral range (infra/pulsar/standalone.py)

DAY = date(2026, 11, 21)
START = int(datetime(2026, 11, 21, tzinfo=timezone.utc).timestamp())
TOPIC = "persistent://acme/ns1/orders-partition-0"
BROKERS = {"broker-1:8080": 1, "broker-2:8080": 2}  # instance -> messages per second dispatched


def _binaries() -> tuple[str, str]:
    found = shutil.which("prometheus"), shutil.which("promtool")
    if all(found):
        return found
    if os.environ.get("BROKERLENS_SKIP_SERVER_TESTS") == "1":
        pytest.skip("prometheus/promtool not installed (BROKERLENS_SKIP_SERVER_TESTS=1)")
    pytest.fail(
        "prometheus and promtool are not installed: run infra/install-test-tools.sh as root (or set BROKERLENS_SKIP_SERVER_TESTS=1 to skip server tests)"
    )


def _openmetrics() -> str:
    """A day of samples every 60 s: per broker a subscription's out counters (msgs = rate x
    seconds since midnight, bytes = 100 x msgs), a cursor's range count (minute of the day mod 7),
    and an unrelated series that collect must not pull."""
    lines = [
        "# TYPE pulsar_out_messages_total gauge",
        "# TYPE pulsar_out_bytes_total gauge",
        "# TYPE brk_ml_cursor_nonContiguousDeletedMessagesRange gauge",
        "# TYPE jvm_memory_bytes_used gauge",
    ]
    for minute in range(1440):
        at = START + minute * 60
        for instance, rate in BROKERS.items():
            common = f'cluster="c1",instance="{instance}",job="pulsar"'
            sub = f'{common},namespace="acme/ns1",subscription="s1",topic="{TOPIC.replace("0", str(rate - 1))}"'
            msgs = rate * minute * 60
            lines.append(f"pulsar_out_messages_total{{{sub}}} {msgs} {at}")
            lines.append(f"pulsar_out_bytes_total{{{sub}}} {msgs * 100} {at}")
            cursor = f'{common},cursor_name="s1",ledger_name="acme/ns1/persistent/orders-partition-{rate - 1}",namespace="acme/ns1"'
            lines.append(f"brk_ml_cursor_nonContiguousDeletedMessagesRange{{{cursor}}} {minute % 7} {at}")
            lines.append(f'jvm_memory_bytes_used{{{common},area="heap"}} 1 {at}')
    # promtool wants each family's samples together.
    body = sorted(lines[4:], key=lambda line: line.split("{")[0])
    return "\n".join(lines[:4] + body) + "\n# EOF\n"


@pytest.fixture
def prometheus(tmp_path):
    server, promtool = _binaries()
    data = tmp_path / "tsdb"
    source = tmp_path / "day.om"
    source.write_text(_openmetrics())
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True, capture_output=True, timeout=300)
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 60s\nscrape_configs: []\n")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [server, f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prometheus did not start: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_collect_a_day_from_prometheus(prometheus, settings):
    result = collect(DAY, settings, prometheus_url=prometheus, step_seconds=60)
    # 2 brokers x 3 series; 1440 steps a day each (the unrelated jvm series is not pulled).
    assert result.metrics["series"] == 6
    assert result.metrics["samples"] == 6 * 1440
    # 240 steps per request: 1440 / 240 = 6 requests, one file per broker per chunk.
    assert result.metrics["requests"] == 6 and result.metrics["files"] == 12
    folder = settings.landing / DAY.isoformat() / "metrics"
    files = sorted(p.name for p in folder.iterdir())
    assert files[:2] == ["broker-1_8080@prometheus-0000.prom", "broker-1_8080@prometheus-0400.prom"]
    text = (folder / "broker-2_8080@prometheus-0400.prom").read_text().splitlines()
    assert len(text) == 3 * 240 and not any("jvm_" in line for line in text)
    # 04:00 is minute 240: broker-2 dispatched 2 msg/s x 14,400 s = 28,800 messages by then.
    first = next(line for line in text if line.startswith("pulsar_out_messages_total"))
    name, labels, value, stamp = re.match(r"^(\w+)\{(.*)\} (\S+) (\d+)$", first).groups()
    assert (value, int(stamp)) == ("28800", (START + 4 * 3600) * 1000)
    assert 'instance="broker-2:8080"' in labels and 'subscription="s1"' in labels and 'cluster="c1"' in labels
    # 00:00 is minute 0; minute 23 has 23 mod 7 = 2 ranges.
    ranges = [l for l in (folder / "broker-1_8080@prometheus-0000.prom").read_text().splitlines() if l.startswith("brk_ml")]
    assert ranges[23].split(" ")[1:] == ["2", str((START + 23 * 60) * 1000)]


def test_collect_prometheus_needs_a_day(settings):
    from brokerlens.sources.collect import CollectError

    with pytest.raises(CollectError, match="needs --date"):
        collect(None, settings, prometheus_url="http://127.0.0.1:9")
