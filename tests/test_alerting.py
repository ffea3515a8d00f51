"""`brokerlens alert` against a real local SMTP server (aiosmtpd)."""

from __future__ import annotations

import base64
import email
import json
import logging
import os
import re
import socket
import subprocess
from datetime import date, timedelta
from email import policy
from urllib.parse import quote, quote_plus

import pytest
from aiosmtpd.controller import Controller
from holes_data import at, snap, write_snapshots
from typer.testing import CliRunner

from brokerlens import cli
from brokerlens.deliver.mail import smtp_target
from brokerlens.gold.holes.alerts import HINTS
from brokerlens.gold.holes.build import build_holes
from brokerlens.platform.settings import Settings, get_settings, reload_settings
from brokerlens.platform.tables import read_table

D1 = date(2026, 11, 21)
D2 = D1 + timedelta(days=1)
PAY_TOPIC = "persistent://payments/orders/charges-partition-0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Inbox:
    """An SMTP server's handler: keeps what it accepted. ``drop_after``: once it has accepted that
    many messages it drops the connection at the next MAIL FROM; ``refuse``: addresses it refuses
    at RCPT TO (550)."""

    def __init__(self):
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []
        self.drop_after: int | None = None
        self.refuse: set[str] = set()

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if self.drop_after is not None and len(self.messages) >= self.drop_after:
            server.transport.close()
            return "421 4.3.2 closing connection"
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address in self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.original_content, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"


@pytest.fixture
def smtp_server():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, inbox
    controller.stop()


def configure(monkeypatch, port: int) -> None:
    # SMTP through the Airflow connection, as the DAG would have it (no TLS on the local server).
    monkeypatch.setenv(
        "AIRFLOW_CONN_SMTP_DEFAULT",
        f"smtp://127.0.0.1:{port}?disable_ssl=true&disable_tls=true&from_email=brokerlens%40example.com",
    )
    monkeypatch.setenv(
        "BROKERLENS_ALERTS__GROUPS",
        json.dumps([{"name": "payments", "namespaces": ["payments/*"], "to": ["pay-oncall@example.com"]}]),
    )
    monkeypatch.setenv("BROKERLENS_ALERTS__DEFAULT_GROUP", json.dumps({"name": "ops", "to": ["ops@example.com", "sre@example.com"]}))
    reload_settings()


def build_days(spark, ranges_by_day: dict[date, dict[str, int]]) -> None:
    """hole_alerts for each day from three snapshots per subscription (charges in payments/*,
    the others in t/ns, i.e. the default group)."""
    for d, ranges in ranges_by_day.items():
        rows = []
        for h in (20, 21, 22) if d == D1 else (1, 2, 3):
            rows += [
                snap(at(d, h), None, sub="charges", topic=PAY_TOPIC, namespace="payments/orders",
                     reported=ranges["charges"], source="topic-stats", sub_type="Key_Shared"),
                snap(at(d, h), None, sub="billing", reported=ranges["billing"], source="topic-stats", delayed=50),
                snap(at(d, h), None, sub="audit", reported=ranges["audit"], source="topic-stats", sub_type="Failover"),
                snap(at(d, h), None, sub="search", reported=ranges["search"], source="topic-stats"),
            ]
        write_snapshots(spark, rows, d)
        build_holes(d, get_settings())


DAY1_RANGES = {"charges": 12_000, "billing": 8_200, "audit": 9_000, "search": 10}


def build_two_days(spark) -> None:
    # Day 1: charges critical, billing warning, audit warning. Day 2: charges unchanged (ongoing),
    # billing escalates, audit resolves, search is new.
    build_days(spark, {D1: DAY1_RANGES, D2: {"charges": 12_000, "billing": 10_400, "audit": 300, "search": 8_800}})


def write_limiters(spark, day: date) -> None:
    """dispatch_daily rows of ``day``: two brokers of c1 with their limiter model and its source
    (two scopes on b41: one line per broker), one broker of c2."""
    from brokerlens.platform.schemas import table_schema
    from brokerlens.platform.tables import write_table

    schema = table_schema("dispatch_daily")
    scopes = [("c1", "b31:8080", "classic", "version 3.1.2", None),
              ("c1", "b41:8080", "token-bucket", "broker-config dispatchRateLimiterFactoryClassName", None),
              ("c1", "b41:8080", "token-bucket", "broker-config dispatchRateLimiterFactoryClassName", "t-partition-0"),
              ("c2", "b9:8080", "classic", "default", None)]  # fmt: skip
    rows = []
    for cluster, broker, model, source, topic in scopes:
        row = {c: 0 for c in schema.column_names}
        row.update(day=day, level="topic" if topic else "broker", cluster=cluster, broker=broker, topic=topic,
                   subscription=None, grain="period", limiter_model=model, limiter_model_source=source,
                   pulsar_throttled_msg_events=None, pulsar_throttled_bytes_events=None, main_cause=None,
                   share_batch_msgs=None, share_redelivery_msgs=None, share_other_msgs=None,
                   share_redelivery_bytes=None, share_approx_bytes=None)  # fmt: skip
        rows.append(tuple(row[c] for c in schema.column_names))
    write_table(spark.createDataFrame(rows, schema.struct), "dispatch_daily", "replace", [{"day": day}])


def run_alert(*args):
    return CliRunner().invoke(cli.app, ["alert", *args])


def parts(msg):
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    return text, html


def test_alert_mails_new_then_changes_and_never_twice(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_two_days(spark)
    write_limiters(spark, D1)

    out = run_alert("--date", str(D1))
    assert out.exit_code == 0, out.output
    assert sorted(rcpt for rcpt, _ in inbox.messages) == [["ops@example.com", "sre@example.com"], ["pay-oncall@example.com"]]
    by_rcpt = {rcpt[0]: msg for rcpt, msg in inbox.messages}
    pay = by_rcpt["pay-oncall@example.com"]
    assert pay["From"] == "brokerlens@example.com"
    assert pay["Subject"] == f"[brokerlens] Pulsar unacked-range alerts {D1}: 1 critical"
    text, html = parts(pay)
    assert "[NEW critical] persistent://payments/orders/charges-partition-0 / charges" in text
    assert "12,000 peak" in text and "cap 10,000 (default)" in text and "2,000 ranges" in text
    assert "<table" in html and "<b>charges</b>" in html and "12,000 / 12,000" in html
    assert "Key_Shared: messages of a slow or hot key" in html and "charges" in html
    # The dispatch limiter each broker of the alerts' cluster (c1) ran that day; c2 is not mailed.
    assert "Dispatch rate limiter on c1 b31:8080: classic (version 3.1.2)." in text
    assert "Dispatch rate limiter on c1 b41:8080: token-bucket (broker-config dispatchRateLimiterFactoryClassName)." in text
    assert "c2" not in text and "<b>token-bucket</b>" in html
    ops = by_rcpt["ops@example.com"]
    assert ops["Subject"] == f"[brokerlens] Pulsar unacked-range alerts {D1}: 2 warning"
    text, html = parts(ops)
    assert "billing" in text and "audit" in text and "charges" not in text
    assert HINTS["delayed-messages"] in text and "cumulative acknowledgement" in text
    assert "search" not in html

    notes = read_table("alert_notifications").collect()
    assert sorted((r["group_name"], r["subscription"], r["state"]) for r in notes) == [
        ("ops", "audit", "new"), ("ops", "billing", "new"), ("payments", "charges", "new")]
    assert {r["message_id"] for r in notes} == {m["Message-ID"] for _, m in inbox.messages}
    assert {r["status"] for r in notes} == {"sent"}
    eml = sorted((settings.outbox / "alerts" / str(D1)).glob("*.eml"))
    assert len(eml) == 2 and {email.message_from_bytes(p.read_bytes())["Message-ID"] for p in eml} == {
        m["Message-ID"] for _, m in inbox.messages}
    assert all(r["notified"] for r in read_table("hole_alerts").filter(f"day = '{D1}'").collect())

    # Day 2: only what changed (billing escalated, audit resolved, search new), not ongoing charges.
    inbox.messages.clear()
    out = run_alert("--date", str(D2))
    assert out.exit_code == 0, out.output
    assert [rcpt for rcpt, _ in inbox.messages] == [["ops@example.com", "sre@example.com"]]
    msg = inbox.messages[0][1]
    assert msg["Subject"] == f"[brokerlens] Pulsar unacked-range alerts {D2}: 1 critical, 1 warning, 1 resolved"
    text, html = parts(msg)
    assert "[ESCALATED critical, was warning]" in text and "/ billing" in text
    assert "[NEW warning]" in text and "/ search" in text
    assert "[RESOLVED, was warning]" in text and "/ audit" in text
    assert "charges" not in text
    day2 = {r["subscription"]: r for r in read_table("hole_alerts").filter(f"day = '{D2}'").collect()}
    assert {k: (v["state"], v["notified"]) for k, v in day2.items()} == {
        "charges": ("ongoing", False), "billing": ("escalated", True), "audit": ("resolved", True),
        "search": ("new", True)}

    # A re-run of day 2 sends nothing and records nothing more.
    inbox.messages.clear()
    out = run_alert("--date", str(D2))
    assert out.exit_code == 0, out.output
    assert inbox.messages == [] and "nothing to send" in out.output
    assert read_table("alert_notifications").count() == 6


def test_dry_run_and_smtp_down_fail_clearly_and_record_nothing(spark, monkeypatch, settings):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", f"smtp://alerts:pa%24%24word@127.0.0.1:{port}?disable_ssl=true")
    reload_settings()
    write_snapshots(spark, [snap(at(D1, 5), None, sub="billing", reported=10_001, source="topic-stats")], D1)
    build_holes(D1, get_settings())

    out = run_alert("--date", str(D1), "--dry-run")
    assert out.exit_code == 0, out.output
    assert "dry run: would send 1 message(s)" in out.output
    assert f"to default <pulsar-ops@localhost>: [brokerlens] Pulsar unacked-range alerts {D1}: 1 critical" in out.output
    assert "[NEW critical]" in out.output and "pa$$word" not in out.output

    out = run_alert("--date", str(D1))
    assert out.exit_code == 1
    assert f"cannot reach SMTP server smtp://alerts@127.0.0.1:{port}" in out.stderr
    assert "0 of 1 alert message(s) sent and recorded" in out.stderr
    assert "pa$$word" not in out.output + out.stderr
    assert read_table("alert_notifications").count() == 0
    assert not (settings.outbox / "alerts").exists()
    assert not read_table("hole_alerts").first()["notified"]


def test_smtp_target_reads_airflow_connection_forms():
    settings = Settings(smtp={"host": "relay.local", "port": 2525, "mail_from": "bl@local"})
    assert str(smtp_target(settings, environ={})) == "smtp://relay.local:2525 (plain, from settings.smtp)"
    uri = smtp_target(settings, environ={"AIRFLOW_CONN_SMTP_DEFAULT": "smtp://u%40x:p%2Fw@mail.example.com:587?disable_ssl=true"})
    assert (uri.host, uri.port, uri.login, uri.password.get_secret_value()) == ("mail.example.com", 587, "u@x", "p/w")
    assert (uri.ssl, uri.starttls, uri.mail_from, uri.timeout) == (False, True, "bl@local", 30.0)
    assert "p/w" not in str(uri) and "p/w" not in repr(uri)
    conn = {"conn_type": "smtp", "host": "smtp.example.com", "login": "a", "password": "secret",
            "extra": json.dumps({"from_email": "alerts@example.com", "timeout": 5})}
    js = smtp_target(settings, environ={"AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(conn)})
    # Airflow's SMTP provider defaults: SSL unless disable_ssl, standard port when none is given.
    assert (js.ssl, js.starttls, js.port, js.mail_from, js.timeout) == (True, False, None, "alerts@example.com", 5.0)
    assert str(js) == "smtp://a@smtp.example.com:465 (SSL, from Airflow connection smtp_default)"


def test_groups_by_namespace_glob_with_default_and_dedup():
    from brokerlens.deliver.alerting import plan
    from brokerlens.platform.settings import AlertSettings

    cfg = AlertSettings(
        groups=[{"name": "payments", "namespaces": ["payments/*"], "to": ["p@x"]},
                {"name": "all-prod", "namespaces": ["*/prod-*", "payments/orders"], "to": ["o@x"]}],
        default_group={"name": "ops", "to": ["ops@x"]},
    )
    alert = lambda ns, sub: {"cluster": "c1", "namespace": ns, "topic": f"persistent://{ns}/t", "subscription": sub}  # noqa: E731
    alerts = [alert("payments/orders", "a"), alert("payments/refunds", "b"), alert("search/prod-eu", "c"),
              alert("search/dev", "d")]
    accepted = {("payments", "c1", "persistent://payments/refunds/t", "b"): {"p@x"}}
    got = {g.group.name: [a["subscription"] for a in g.alerts] for g in plan(D1, cfg, alerts, accepted)}
    assert got == {"all-prod": ["a", "c"], "ops": ["d"], "payments": ["a"]}


def notifications(day: date) -> list:
    return read_table("alert_notifications").filter(f"day = '{day}'").collect()


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
    rows = notifications(D1)
    assert sorted((r["group_name"], r["subscription"], r["status"]) for r in rows) == [
        ("ops", "audit", "sent"), ("ops", "billing", "sent")]
    assert {r["message_id"] for r in rows} == {first["Message-ID"]}
    notified = {r["subscription"]: r["notified"] for r in read_table("hole_alerts").collect()}
    assert notified == {"audit": True, "billing": True, "charges": False}

    inbox.drop_after = None
    out = run_alert("--date", str(D1))
    assert out.exit_code == 0, out.output
    assert [rcpt for rcpt, _ in inbox.messages] == [["ops@example.com", "sre@example.com"], ["pay-oncall@example.com"]]
    second = inbox.messages[1][1]
    assert sorted((r["group_name"], r["subscription"], r["message_id"]) for r in notifications(D1)) == [
        ("ops", "audit", first["Message-ID"]), ("ops", "billing", first["Message-ID"]),
        ("payments", "charges", second["Message-ID"])]


def test_refused_recipient_is_not_recorded_and_a_rerun_mails_only_it(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_days(spark, {D1: DAY1_RANGES})
    inbox.refuse = {"sre@example.com"}

    out = run_alert("--date", str(D1))
    assert out.exit_code == 1
    assert "refused sre@example.com" in out.stderr and "2 of 2 alert message(s) sent" in out.stderr
    assert sorted(rcpt for rcpt, _ in inbox.messages) == [["ops@example.com"], ["pay-oncall@example.com"]]
    recorded = {(r["group_name"], r["subscription"]): r["recipients"] for r in notifications(D1)}
    assert recorded == {("ops", "audit"): ["ops@example.com"], ("ops", "billing"): ["ops@example.com"],
                        ("payments", "charges"): ["pay-oncall@example.com"]}

    # The re-run mails the ops alerts to sre only: another message (another Message-ID).
    inbox.refuse = set()
    inbox.messages.clear()
    out = run_alert("--date", str(D1))
    assert out.exit_code == 0, out.output
    [(rcpt, msg)] = inbox.messages
    assert rcpt == ["sre@example.com"] and msg["To"] == "sre@example.com"
    assert "billing" in parts(msg)[0] and "audit" in parts(msg)[0]
    rows = notifications(D1)
    assert sorted((r["group_name"], r["subscription"], tuple(r["recipients"])) for r in rows) == [
        ("ops", "audit", ("ops@example.com",)), ("ops", "audit", ("sre@example.com",)),
        ("ops", "billing", ("ops@example.com",)), ("ops", "billing", ("sre@example.com",)),
        ("payments", "charges", ("pay-oncall@example.com",))]
    assert len({r["message_id"] for r in rows}) == 3
    assert run_alert("--date", str(D1)).exit_code == 0 and len(inbox.messages) == 1


@pytest.mark.slow
def test_a_crash_between_sending_and_recording_never_mails_twice(spark, smtp_server, monkeypatch, settings,
                                                                 brokerlens_command):
    """`brokerlens alert` killed (os._exit, as by SIGKILL) right after the server accepted the
    first message, then killed before sending the second, then run to the end: each message
    reaches the server exactly once, and the record ends as what the server received."""
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_days(spark, {D1: DAY1_RANGES})

    def alert(crash_at: str | None) -> subprocess.CompletedProcess:
        env = {**os.environ, "BROKERLENS_SPARK__SHUFFLE_PARTITIONS": "2"}
        env.pop("BROKERLENS_TEST_ALERT_CRASH_AT", None)
        if crash_at:
            env["BROKERLENS_TEST_ALERT_CRASH_AT"] = crash_at
        return subprocess.run(brokerlens_command("alert", "--date", str(D1)), env=env, capture_output=True,
                              text=True, timeout=600)

    # 1. Killed after the server accepted ops' message: recorded as pending only.
    assert alert("accepted").returncode == 137
    [(rcpt, ops)] = inbox.messages
    ops_id = ops["Message-ID"]
    assert rcpt == ["ops@example.com", "sre@example.com"]
    assert {(r["group_name"], r["status"], r["message_id"]) for r in notifications(D1)} == {("ops", "pending", ops_id)}

    # 2. Settles ops as sent without mailing it again; killed before handing payments' over.
    run = alert("pending-recorded")
    assert run.returncode == 137, run.stderr[-3000:]
    assert len(inbox.messages) == 1
    assert sorted((r["group_name"], r["status"]) for r in notifications(D1)) == [
        ("ops", "sent"), ("ops", "sent"), ("payments", "pending")]

    # 3. Mails payments (never accepted before), and only it.
    run = alert(None)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "accepted before an earlier run stopped" not in run.stdout
    assert "not sent by an earlier run that stopped; mailed now" in run.stdout
    received = [m["Message-ID"] for _, m in inbox.messages]
    assert len(received) == len(set(received)) == 2
    rows = notifications(D1)
    assert {r["status"] for r in rows} == {"sent"}
    assert {r["message_id"] for r in rows} == set(received)
    assert all(r["notified"] for r in read_table("hole_alerts").collect())


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
    assert [r["day"] for r in read_table("alert_notifications").orderBy("day").collect()] == [D1, d3]


@pytest.fixture
def self_signed_cert(tmp_path):
    """A certificate for 127.0.0.1 that this test's clients trust (SSL_CERT_FILE)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_starttls_and_auth_against_a_real_server_never_show_the_password(spark, monkeypatch, settings, caplog,
                                                                           self_signed_cert, capfd):
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
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), tls_context=tls, require_starttls=True,
                            authenticator=authenticator, auth_required=True, auth_require_tls=True)
    controller.start()
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        write_snapshots(spark, [snap(at(D1, 5), None, sub="billing", reported=10_001, source="topic-stats")], D1)
        build_holes(D1, get_settings())
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
    seen = "\n".join([wrong.output, wrong.stderr, ok.output, ok.stderr, *logged, *capfd.readouterr(),
                      *(str(r) for r in read_table("alert_notifications").collect()),
                      *(p.read_text(errors="replace") for p in settings.outbox.rglob("*.eml"))])
    for secret in (password, password + "-wrong"):
        raw = secret.encode()
        forms = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret),
                 base64.b64encode(raw).decode(), base64.b64encode(b"\0alerts\0" + raw).decode(),
                 base64.b64encode(b"alerts\0" + raw).decode()}
        assert not [f for f in forms if f in seen], "password shown"


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
        write_snapshots(spark, rows, d)
        build_holes(d, get_settings())
        out = run_alert("--date", str(d))
        assert out.exit_code == 0, out.output

    day(D1, {"audit": 9_000, "search": 10})
    assert len(inbox.messages) == 1
    inbox.messages.clear()

    day(D2, {"search": 10})
    stale = read_table("hole_alerts").filter(f"day = '{D2}'").collect()
    assert [(r["subscription"], r["state"], r["severity"], r["stale_since"]) for r in stale] == [
        ("audit", "stale", "warning", D2)]
    assert stale[0]["reason"].startswith(f"no data since {D1} 02:00 UTC")
    assert len(inbox.messages) == 1
    msg = inbox.messages[0][1]
    assert msg["Subject"] == f"[brokerlens] Pulsar unacked-range alerts {D2}: 1 no data"
    assert f"no data since {D1} 02:00 UTC" in parts(msg)[0]
    inbox.messages.clear()

    day(d3, {"search": 10})
    again = read_table("hole_alerts").filter(f"day = '{d3}'").collect()
    assert [(r["state"], r["stale_since"], r["first_seen"]) for r in again] == [("stale", D2, D1)]
    assert inbox.messages == []  # one "no data" mail per stretch, not one per day

    day(d4, {"audit": 300, "search": 10})
    back = read_table("hole_alerts").filter(f"day = '{d4}'").collect()
    assert [(r["state"], r["previous_severity"]) for r in back] == [("resolved", "warning")]
    assert read_table("alert_notifications").filter("subscription = 'audit'").count() == 3  # new, no data, resolved
