"""No secret leaves the process: not when a server echoes the token, not in logs, errors, files, mails."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr
from test_collect import TOKEN, Replay, serving

from brokerlens.deliver.mail import build_message
from brokerlens.platform import redact
from brokerlens.settings import Settings

ECHOED = "/admin/v2/persistent/acme/orders/order-events/stats"


class Echo(Replay):
    """Replays the admin API, except that ``echoing`` paths fail with HTTP 500 and send the
    request's Authorization header back in the reason phrase, a header and the error body."""

    echoing: set[str] = set()

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] not in self.echoing:
            return super().do_GET()
        auth = self.headers.get("Authorization", "")
        body = ('{"reason": "boom %s, token=%s"}' % (auth, auth.removeprefix("Bearer "))).encode()
        self.send_response(500, f"boom {auth}")
        self.send_header("X-Echo", auth)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo():
    Echo.overrides, Echo.failures, Echo.seen, Echo.echoing = {}, {}, [], set()
    with serving(Echo) as url:
        yield url


def everything_written(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in home.rglob("*") if p.is_file())


def test_an_echoed_token_is_nowhere_in_what_collect_printed_or_wrote(echo, brokerlens_home, brokerlens_command):
    env = {**os.environ, "BROKERLENS_ADMIN_TOKEN": TOKEN, "BROKERLENS_COLLECT__BACKOFF_SECONDS": "0", "BROKERLENS_COLLECT__RETRIES": "2"}

    def run(*args):
        return subprocess.run(brokerlens_command(*args, "collect", "--admin-url", echo), env=env, capture_output=True, text=True, timeout=120)

    # One topic's stats echo the token on every attempt: retried, then skipped; the rest lands.
    Echo.echoing = {ECHOED}
    skipped = run("-v")
    assert skipped.returncode == 0, skipped.stderr
    # (The fixture's brokers do not exist: their interceptor's records are retried and skipped too.)
    assert sum("retry" in line and ECHOED in line for line in skipped.stderr.splitlines()) == 2 and "topics=1" in skipped.stdout
    assert f"boom Bearer {redact.MASK}" in skipped.stdout + skipped.stderr  # the echo, masked
    # Listing the cluster echoes it: the run fails with one error line, in a log file this time.
    Echo.echoing = {"/admin/v2/clusters"}
    failed = run()
    assert failed.returncode == 1
    assert failed.stderr.splitlines()[-1].startswith("error: collect failed: GET /admin/v2/clusters: HTTP 500 boom Bearer ")
    written = everything_written(brokerlens_home)
    assert (brokerlens_home / "logs" / "brokerlens.log").is_file() and list(brokerlens_home.glob("landing/*/topic-stats/*"))
    grep = subprocess.run(["grep", "-r", "-l", TOKEN, str(brokerlens_home)], capture_output=True, text=True)
    assert grep.returncode == 1, grep.stdout  # grep found nothing
    for text in (skipped.stdout, skipped.stderr, failed.stdout, failed.stderr, written):
        assert TOKEN not in text
    # The server did get the token: the requests were real.
    assert all(auth == f"Bearer {TOKEN}" for _, auth in Echo.seen)


class LaterSettings(BaseModel):
    """A settings section added later with a secret of its own."""

    prometheus_password: SecretStr | None = None
    nested: list[dict[str, SecretStr]] = []


def test_the_secrets_come_from_the_settings_model_and_the_connections(monkeypatch):
    settings = Settings(admin_token="tok-4411", smtp={"password": "smtp-pw-9931"})
    later = LaterSettings(prometheus_password="prom-pw-7720", nested=[{"k": "deep-pw-5501"}])
    assert redact.secret_values(settings) >= {"tok-4411", "smtp-pw-9931"}
    assert redact.secret_values(later) == {"prom-pw-7720", "deep-pw-5501"}
    redact.remember(redact.secret_values(later))
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", "smtp://ops:conn%2Fpw-3388@relay:587")
    text = "tok-4411 smtp-pw-9931 prom-pw-7720 deep-pw-5501 conn/pw-3388 conn%2Fpw-3388 http://reader:url-pw-6677@prometheus:9090/api"
    masked = redact.redact(text)
    for secret in ("tok-4411", "smtp-pw-9931", "prom-pw-7720", "deep-pw-5501", "conn/pw-3388", "url-pw-6677"):
        assert secret not in masked
    assert masked.count(redact.MASK) == 7 and "http://reader:" in masked


def test_logs_streams_and_mails_are_filtered(caplog, capsys):
    Settings(admin_token="tok-5150")
    factory, stdout, stderr = logging.getLogRecordFactory(), sys.stdout, sys.stderr
    try:
        redact.install()
        try:
            raise RuntimeError("failed with tok-5150")
        except RuntimeError:
            logging.getLogger("brokerlens.test").exception("GET %s: %s", "/x", "Bearer tok-5150")
        print("summary tok-5150")
        print("error: tok-5150", file=sys.stderr)
    finally:
        logging.setLogRecordFactory(factory)
        sys.stdout, sys.stderr = stdout, stderr
    out = capsys.readouterr()
    assert "tok-5150" not in caplog.text + out.out + out.err
    # The traceback is kept redacted on the record (exc_text), whatever formatter prints it: a
    # structured one (PySpark's JSON) prints the message only, the plain one both.
    (record,) = [r for r in caplog.records if r.name == "brokerlens.test"]
    assert f"Bearer {redact.MASK}" in caplog.text and record.exc_info is None
    assert f"failed with {redact.MASK}" in record.exc_text
    # stderr may also carry the record, from a handler of the logger's own (PySpark's logger class)
    assert out.out == f"summary {redact.MASK}\n" and out.err.endswith(f"error: {redact.MASK}\n")
    mail = build_message("alert tok-5150", "a@localhost", ["b@localhost"], "text tok-5150", "<p>tok-5150</p>")
    assert "tok-5150" not in mail.as_string() and redact.MASK in mail["Subject"]
