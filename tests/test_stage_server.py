"""The stage server (`brokerlens serve`): one Spark application in its own process, warmed up on a
generated day, running the commands clients send it with their environment, one at a time.

Asserted: the warm-up writes nothing where the server's settings point; the address file is
private and a request needs its token; only the daily stages run, with only brokerlens's and
Airflow connections' variables; a stage's output and exit code come back as the command's own
(the rows land says it wrote are in the table); a request's variables are its own (a failing
report, then the server's own settings again); a stage sent while another runs waits and
says so; a stage whose task went away is cancelled and
the next one runs; SIGTERM stops it and removes its address file.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import date
from pathlib import Path

import pytest

from brokerlens.stage_server import EXIT_PREFIX, StageServerError, run_remote

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # the DAG tests run stages on the server too

DAY = date(2026, 11, 21)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("stage-server") / "var"
    address = home / "run" / "stage-server.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKERLENS_")}
    env.update(BROKERLENS_HOME=str(home), BROKERLENS_SPARK__DRIVER_MEMORY="1g", SPARK_LOCAL_IP="127.0.0.1")
    scratch_before = set(Path(tempfile.gettempdir()).glob("brokerlens-warm-up-*"))
    log = home.parent / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("brokerlens")), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while not address.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"stage server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    info = {
        "proc": proc,
        "address": address,
        "home": home,
        "log": log,
        "env": env,
        "warm_up_left": sorted(p.name for p in home.iterdir()),
        "scratch_left": set(Path(tempfile.gettempdir()).glob("brokerlens-warm-up-*")) - scratch_before,
    }
    yield info
    if proc.poll() is None:
        proc.kill()


def remote(server, *argv: str, **environ: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = run_remote(server["address"], list(argv), {"BROKERLENS_HOME": str(server["home"]), **environ}, lines.append)
    return code, lines


def request(server, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, str]:
    address = json.loads(server["address"].read_text())
    headers = {"Authorization": f"Bearer {token if token is not None else address['token']}"}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(address["url"] + path, data, headers, method=method)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_warm_up_leaves_nothing_behind(server):
    # The server's home holds only its address file and its log (the JVM's stderr, as any
    # command started from a shell): the generated day lived in a scratch folder.
    assert server["warm_up_left"] == ["logs", "run"]
    assert not server["scratch_left"]
    assert "warmed up in" in server["log"].read_text()


def test_address_file_is_private_and_requests_need_its_token(server):
    address = server["address"]
    assert stat.S_IMODE(address.stat().st_mode) == 0o600
    info = json.loads(address.read_text())
    assert info["url"].startswith("http://127.0.0.1:") and info["pid"] == server["proc"].pid
    assert request(server, "GET", "/health", token="wrong")[0] == 401
    status, body = request(server, "GET", "/health")
    assert status == 200 and json.loads(body)["stages_run"] == 0
    # Only the daily stages, only brokerlens's and connections' variables.
    status, body = request(server, "POST", "/run", {"argv": ["sql", "SELECT 1"]})
    assert status == 400 and "runs only land, validate, build, alert, report" in body
    status, body = request(server, "POST", "/run", {"argv": ["land", "--date", "2026-11-21"], "environ": {"PATH": "/x"}})
    assert status == 400 and "BROKERLENS_* and AIRFLOW_CONN_*" in body
    with pytest.raises(StageServerError, match="refused the request: 400"):
        remote(server, "vacuum")


def test_a_stage_runs_with_its_output_and_exit_code(server):
    from deltalake import DeltaTable

    demo = subprocess.run(
        [str(Path(sys.executable).with_name("brokerlens")), "--quiet", "demo-data", "--date", DAY.isoformat(), "--scale", "0.01"],
        env=server["env"],
        capture_output=True,
        text=True,
    )
    assert demo.returncode == 0, demo.stderr
    code, lines = remote(server, "land", "--date", DAY.isoformat())
    assert code == 0, lines[-20:]
    assert f"land {DAY.isoformat()}" in lines
    said = next(line for line in lines if line.strip().startswith("bronze_dispatch:"))
    rows = int(said.split(":")[1].split()[0])
    table = DeltaTable(str(server["home"] / "lake" / "bronze_dispatch"))
    assert rows > 0 and table.to_pyarrow_table().num_rows == rows
    assert not any(line.startswith(EXIT_PREFIX) for line in lines)


def test_a_request_s_variables_are_its_own(server, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, lines = remote(server, "report", "--date", DAY.isoformat(), BROKERLENS_REPORTS_DIR=str(blocker / "reports"))
    assert code == 2
    assert lines[-1] == f"error: NotADirectoryError: [Errno 20] Not a directory: '{blocker / 'reports' / DAY.isoformat()}'"
    # The next request runs with the server's settings again: the report lands under its home.
    code, lines = remote(server, "report", "--date", DAY.isoformat())
    assert code == 0, lines[-20:]
    assert list((server["home"] / "reports" / DAY.isoformat()).glob("*.html"))
    assert json.loads(request(server, "GET", "/health")[1])["stages_run"] == 3


def test_a_stage_sent_while_another_runs_waits_its_turn(server):
    first: dict = {}
    argv = ("validate", "--layer", "bronze", "--date", DAY.isoformat())
    thread = threading.Thread(target=lambda: first.update(result=remote(server, *argv)))
    thread.start()
    deadline = time.monotonic() + 60
    while json.loads(request(server, "GET", "/health")[1])["running"] != " ".join(argv):
        assert time.monotonic() < deadline, "the first stage never started"
        time.sleep(0.05)
    code, lines = remote(server, *argv)
    thread.join()
    assert first["result"][0] == 0 and code == 0, lines[-20:]
    assert lines[0] == "stage server: 1 stage(s) ahead of this one; waiting"
    assert not any(line.startswith("stage server:") for line in first["result"][1])


def test_a_stage_whose_task_went_away_is_cancelled_and_the_server_goes_on(server):
    address = json.loads(server["address"].read_text())
    before = json.loads(request(server, "GET", "/health")[1])["stages_run"]
    connection = http.client.HTTPConnection("127.0.0.1", int(address["url"].rsplit(":", 1)[1]))
    body = {"argv": ["build", "--layer", "silver", "--date", DAY.isoformat()], "environ": {"BROKERLENS_HOME": str(server["home"])}}
    connection.request("POST", "/run", json.dumps(body), {"Authorization": f"Bearer {address['token']}"})
    response = connection.getresponse()
    assert response.status == 200 and response.readline()  # the stage has started
    response.close()
    connection.close()
    deadline = time.monotonic() + 300
    while json.loads(request(server, "GET", "/health")[1])["stages_run"] == before:
        assert time.monotonic() < deadline, "the stage never ended"
        time.sleep(1)
    assert "client of build --layer silver --date 2026-11-21 went away: cancelling its Spark jobs" in server["log"].read_text()
    # The server goes on with the next stage.
    code, lines = remote(server, "validate", "--layer", "bronze", "--date", DAY.isoformat())
    assert code == 0, lines[-20:]


def test_sigterm_stops_the_server_and_removes_its_address(server):
    proc = server["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert not server["address"].exists()
