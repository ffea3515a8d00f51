"""`brokerlens alert` when delivery goes wrong (a dropped connection, a refused recipient, a crash
between sending and recording), reminders, STARTTLS with auth, and stale alerts."""

from __future__ import annotations

import base64
import logging
import os
import re
import subprocess
from datetime import date, timedelta
from urllib.parse import quote, quote_plus

import pytest
from aiosmtpd.controller import Controller

from alert_helpers import (
    D1,
    D2,
    DAY1_RANGES,
    PAY_TOPIC,
    Inbox,
    build_days,
    configure,
    free_port,
    parts,
    run_alert,
)
from brokerlens.gold.holes.build import build_holes
from brokerlens.settings import get_settings, reload_settings
from brokerlens.platform.tables import read_table
from holes_data import at, snap, write_snapshots


def notifications(spark, day: date, settings) -> list:
    return read_table("alert_notifications", settings=settings, spark=spark).filter(f"day = '{day}'").collect()


@pytest.mark.slow
def test_dropped_connection_records_what_was_accepted_and_a_rerun_sends_the_rest(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_days(spark, {D1: DAY1_RANGES})
    inbox.drop_after = 1  # ops (first by group name) goes through, then the server goes away

    out = run_alert("--date", str(D1))
    assert out.exit_code == 1
    assert "SMTPServerDisconnected" in out.stderr or "SMTPSenderRefused" in out.stderr, out.stderr
    assert "1 of 2 alert message(s) sent and recorded" in out.stderr
    [(rcpt, first)] = inbox.messages
    assert rcpt == ["ops@example.com", "sre@example.com"]
    # Exactly what the server accepted: the ops message's two alerts, as sent; nothing pending.
    rows = notifications(spark, D1, settings)
    assert sorted((r["group_name"], r["subscription"], r["status"]) for r in rows) == [("ops", "audit", "sent"), ("ops", "billing", "sent")]
    assert {r["message_id"] for r in rows} == {first["Message-ID"]}
    notified = {r["subscription"]: r["notified"] for r in read_table("hole_alerts", settings=settings, spark=spark).collect()}
    assert notified == {"audit": True, "billing": True, "charges": False}

    inbox.drop_after = None
    out = run_alert("--date", str(D1))
    assert out.exit_code == 0, out.output
    assert [rcpt for rcpt, _ in inbox.messages] == [["ops@example.com", "sre@example.com"], ["pay-oncall@example.com"]]
    second = inbox.messages[1][1]
    assert sorted((r["group_name"], r["subscription"], r["message_id"]) for r in notifications(spark, D1, settings)) == [
        ("ops", "audit", first["Message-ID"]),
        ("ops", "billing", first["Message-ID"]),
        ("payments", "charges", second["Message-ID"]),
    ]


@pytest.mark.slow
def test_refused_recipient_is_not_recorded_and_a_rerun_mails_only_it(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_days(spark, {D1: DAY1_RANGES})
    inbox.refuse = {"sre@example.com"}

    out = run_alert("--date", str(D1))
    assert out.exit_code == 1
    assert "refused sre@example.com" in out.stderr and "2 of 2 alert message(s) sent" in out.stderr
    assert sorted(rcpt for rcpt, _ in inbox.messages) == [["ops@example.com"], ["pay-oncall@example.com"]]
    recorded = {(r["group_name"], r["subscription"]): r["recipients"] for r in notifications(spark, D1, settings)}
    assert recorded == {("ops", "audit"): ["ops@example.com"], ("ops", "billing"): ["ops@example.com"], ("payments", "charges"): ["pay-oncall@example.com"]}

    # The re-run mails the ops alerts to sre only: another message (another Message-ID).
    inbox.refuse = set()
    inbox.messages.clear()
    out = run_alert("--date", str(D1))
    assert out.exit_code == 0, out.output
    [(rcpt, msg)] = inbox.messages
    assert rcpt == ["sre@example.com"] and msg["To"] == "sre@example.com"
    assert "billing" in parts(msg)[0] and "audit" in parts(msg)[0]
    rows = notifications(spark, D1, settings)
    assert sorted((r["group_name"], r["subscription"], tuple(r["recipients"])) for r in rows) == [
        ("ops", "audit", ("ops@example.com",)),
        ("ops", "audit", ("sre@example.com",)),
        ("ops", "billing", ("ops@example.com",)),
        ("ops", "billing", ("sre@example.com",)),
        ("payments", "charges", ("pay-oncall@example.com",)),
    ]
    assert len({r["message_id"] for r in rows}) == 3
    assert run_alert("--date", str(D1)).exit_code == 0 and len(inbox.messages) == 1


@pytest.mark.slow
def test_a_crash_between_sending_and_recording_never_mails_twice(spark, smtp_server, monkeypatch, settings, brokerlens_command, connect_url):
    """`brokerlens alert` killed (os._exit, as by SIGKILL) right after the server accepted the
    first message, then killed before sending the second, then run to the end: each message
    reaches the server exactly once, and the record ends as what the server received. Each run
    is a process of its own, a Spark Connect client of this session's JVM (as the DAG's task is
    of its server)."""
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_days(spark, {D1: DAY1_RANGES})

    def alert(crash_at: str | None) -> subprocess.CompletedProcess:
        env = {**os.environ, "BROKERLENS_SPARK__SHUFFLE_PARTITIONS": "2", "BROKERLENS_SPARK__REMOTE": connect_url}
        env.pop("BROKERLENS_TEST_ALERT_CRASH_AT", None)
        if crash_at:
            env["BROKERLENS_TEST_ALERT_CRASH_AT"] = crash_at
        return subprocess.run(brokerlens_command("alert", "--date", str(D1)), env=env, capture_output=True, text=True, timeout=600)

    # 1. Killed after the server accepted ops' message: recorded as pending only.
    assert alert("accepted").returncode == 137
    [(rcpt, ops)] = inbox.messages
    ops_id = ops["Message-ID"]
    assert rcpt == ["ops@example.com", "sre@example.com"]
    assert {(r["group_name"], r["status"], r["message_id"]) for r in notifications(spark, D1, settings)} == {("ops", "pending", ops_id)}

    # 2. Settles ops as sent without mailing it again; killed before handing payments' over.
    run = alert("pending-recorded")
    assert run.returncode == 137, run.stderr[-3000:]
    assert len(inbox.messages) == 1
    assert sorted((r["group_name"], r["status"]) for r in notifications(spark, D1, settings)) == [("ops", "sent"), ("ops", "sent"), ("payments", "pending")]

    # 3. Mails payments (never accepted before), and only it.
    run = alert(None)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "accepted before an earlier run stopped" not in run.stdout
    assert "not sent by an earlier run that stopped; mailed now" in run.stdout
    received = [m["Message-ID"] for _, m in inbox.messages]
    assert len(received) == len(set(received)) == 2
    rows = notifications(spark, D1, settings)
    assert {r["status"] for r in rows} == {"sent"}
    assert {r["message_id"] for r in rows} == set(received)
    assert all(r["notified"] for r in read_table("hole_alerts", settings=settings, spark=spark).collect())


@pytest.mark.slow
def test_ongoing_alerts_are_reminded_after_reminder_days(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    monkeypatch.setenv("BROKERLENS_ALERTS__REMINDER_DAYS", "2")
    configure(monkeypatch, controller.port)
    d3 = D2 + timedelta(days=1)
    calm = {"charges": 12_000, "billing": 10, "audit": 10, "search": 10}
    build_days(spark, {D1: calm, D2: calm, d3: calm})
    mailed = {}
    for d in (D1, D2, d3):
        inbox.messages.clear()
        assert run_alert("--date", str(d)).exit_code == 0
        mailed[d] = [re.findall(r"^\[([A-Z]+ \w+)\] (\S+)", parts(m)[0], re.M) for _, m in inbox.messages]
    # charges is critical all three days: new on day 1, ongoing on days 2 and 3; mailed on day 1
    # and again 2 days (reminder_days) after it, on day 3.
    assert mailed == {D1: [[("NEW critical", PAY_TOPIC)]], D2: [], d3: [[("ONGOING critical", PAY_TOPIC)]]}
    assert [r["day"] for r in read_table("alert_notifications", settings=settings, spark=spark).orderBy("day").collect()] == [D1, d3]


@pytest.fixture
def self_signed_cert(tmp_path):
    """A certificate for 127.0.0.1 that this test's clients trust (SSL_CERT_FILE)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.slow
def test_starttls_and_auth_against_a_real_server_never_show_the_password(spark, monkeypatch, settings, caplog, self_signed_cert, capfd):
    import ssl

    from aiosmtpd.smtp import AuthResult, LoginPassword

    cert, key = self_signed_cert
    password = "s3cr/t p@ss:w+rd%"
    logins = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.login == b"alerts" and auth_data.password == password.encode()
        logins.append((mechanism, ok, session.ssl is not None))
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 535 on a failure

    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    inbox = Inbox()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        tls_context=tls,
        require_starttls=True,
        authenticator=authenticator,
        auth_required=True,
        auth_require_tls=True,
    )
    controller.start()
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        write_snapshots(spark, [snap(at(D1, 5), None, sub="billing", reported=10_001, source="topic-stats")], D1, settings)
        build_holes(spark, D1, get_settings())
        caplog.set_level(logging.DEBUG)

        def uri(secret: str) -> str:  # disable_ssl without disable_tls: STARTTLS
            return f"smtp://alerts:{quote(secret, safe='')}@127.0.0.1:{controller.port}?disable_ssl=true"

        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", uri(password + "-wrong"))
        reload_settings()
        wrong = run_alert("--date", str(D1))
        assert wrong.exit_code == 1 and "SMTPAuthenticationError" in wrong.stderr
        assert f"cannot reach SMTP server smtp://alerts@127.0.0.1:{controller.port} (STARTTLS" in wrong.stderr

        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", uri(password))
        reload_settings()
        ok = run_alert("--date", str(D1))
        assert ok.exit_code == 0, ok.output
        assert [rcpt for rcpt, _ in inbox.messages] == [["pulsar-ops@localhost"]]
        # Every login went over TLS (smtplib tries each mechanism the server offers); only the
        # last one, with the right password, succeeded.
        assert all(tls_on for _, _, tls_on in logins)
        assert [good for _, good, _ in logins].index(True) == len(logins) - 1
    finally:
        controller.stop()

    # Every log record but the test server's own (aiosmtpd logs the AUTH lines it reads).
    logged = [f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records if not r.name.startswith("mail.log")]
    seen = "\n".join(
        [
            wrong.output,
            wrong.stderr,
            ok.output,
            ok.stderr,
            *logged,
            *capfd.readouterr(),
            *(str(r) for r in read_table("alert_notifications", settings=settings, spark=spark).collect()),
            *(p.read_text(errors="replace") for p in settings.outbox.rglob("*.eml")),
        ]
    )
    for secret in (password, password + "-wrong"):
        raw = secret.encode()
        forms = {
            secret,
            quote(secret, safe=""),
            quote_plus(secret),
            quote(secret),
            base64.b64encode(raw).decode(),
            base64.b64encode(b"\0alerts\0" + raw).decode(),
            base64.b64encode(b"alerts\0" + raw).decode(),
        }
        assert not [f for f in forms if f in seen], "password shown"


@pytest.mark.slow
def test_missing_snapshots_make_the_alert_stale_and_mail_no_data_once(spark, smtp_server, monkeypatch, settings):
    """Day 1: audit at 9,000 ranges (warning). Days 2 and 3: no snapshot of audit (search only):
    audit is stale, not resolved, on both days, with stale_since day 2; one "no data since" mail
    on day 2 and none on day 3. Day 4: audit at 300: resolved."""
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    d3, d4 = D2 + timedelta(days=1), D2 + timedelta(days=2)

    def day(d, subs):
        rows = [snap(at(d, h), None, sub=s, reported=n, source="topic-stats", sub_type="Failover")
                for h in (1, 2) for s, n in subs.items()]  # fmt: skip
        write_snapshots(spark, rows, d, settings)
        build_holes(spark, d, get_settings())
        out = run_alert("--date", str(d))
        assert out.exit_code == 0, out.output

    day(D1, {"audit": 9_000, "search": 10})
    assert len(inbox.messages) == 1
    inbox.messages.clear()

    day(D2, {"search": 10})
    stale = read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{D2}'").collect()
    assert [(r["subscription"], r["state"], r["severity"], r["stale_since"]) for r in stale] == [("audit", "stale", "warning", D2)]
    assert stale[0]["reason"].startswith(f"no data since {D1} 02:00 UTC")
    assert len(inbox.messages) == 1
    msg = inbox.messages[0][1]
    assert msg["Subject"] == f"[brokerlens] Pulsar unacked-range alerts {D2}: 1 no data"
    assert f"no data since {D1} 02:00 UTC" in parts(msg)[0]
    inbox.messages.clear()

    day(d3, {"search": 10})
    again = read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{d3}'").collect()
    assert [(r["state"], r["stale_since"], r["first_seen"]) for r in again] == [("stale", D2, D1)]
    assert inbox.messages == []  # one "no data" mail per stretch, not one per day

    day(d4, {"audit": 300, "search": 10})
    back = read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{d4}'").collect()
    assert [(r["state"], r["previous_severity"]) for r in back] == [("resolved", "warning")]
    assert read_table("alert_notifications", settings=settings, spark=spark).filter("subscription = 'audit'").count() == 3  # new, no data, resolved
