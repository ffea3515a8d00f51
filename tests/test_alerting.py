"""`brokerlens alert` against a real local SMTP server (aiosmtpd): what is mailed, to whom, once."""

from __future__ import annotations

import pytest

import email
import json

from alert_helpers import (
    D1,
    D2,
    build_two_days,
    configure,
    free_port,
    parts,
    run_alert,
    write_limiters,
)
from brokerlens.deliver.mail import smtp_target
from brokerlens.gold.holes.alerts import HINTS
from brokerlens.gold.holes.build import build_holes
from brokerlens.settings import Settings, get_settings, reload_settings
from brokerlens.platform.tables import read_table
from holes_data import at, snap, write_snapshots


@pytest.mark.slow
def test_alert_mails_new_then_changes_and_never_twice(spark, smtp_server, monkeypatch, settings):
    controller, inbox = smtp_server
    configure(monkeypatch, controller.port)
    build_two_days(spark)
    write_limiters(spark, D1, settings)

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

    notes = read_table("alert_notifications", settings=settings, spark=spark).collect()
    assert sorted((r["group_name"], r["subscription"], r["state"]) for r in notes) == [
        ("ops", "audit", "new"),
        ("ops", "billing", "new"),
        ("payments", "charges", "new"),
    ]
    assert {r["message_id"] for r in notes} == {m["Message-ID"] for _, m in inbox.messages}
    assert {r["status"] for r in notes} == {"sent"}
    eml = sorted((settings.outbox / "alerts" / str(D1)).glob("*.eml"))
    assert len(eml) == 2 and {email.message_from_bytes(p.read_bytes())["Message-ID"] for p in eml} == {m["Message-ID"] for _, m in inbox.messages}
    assert all(r["notified"] for r in read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{D1}'").collect())

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
    day2 = {r["subscription"]: r for r in read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{D2}'").collect()}
    assert {k: (v["state"], v["notified"]) for k, v in day2.items()} == {
        "charges": ("ongoing", False),
        "billing": ("escalated", True),
        "audit": ("resolved", True),
        "search": ("new", True),
    }

    # A re-run of day 2 sends nothing and records nothing more.
    inbox.messages.clear()
    out = run_alert("--date", str(D2))
    assert out.exit_code == 0, out.output
    assert inbox.messages == [] and "nothing to send" in out.output
    assert read_table("alert_notifications", settings=settings, spark=spark).count() == 6


@pytest.mark.slow
def test_dry_run_and_smtp_down_fail_clearly_and_record_nothing(spark, monkeypatch, settings):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", f"smtp://alerts:pa%24%24word@127.0.0.1:{port}?disable_ssl=true")
    reload_settings()
    write_snapshots(spark, [snap(at(D1, 5), None, sub="billing", reported=10_001, source="topic-stats")], D1, settings)
    build_holes(spark, D1, get_settings())

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
    assert read_table("alert_notifications", settings=settings, spark=spark).count() == 0
    assert not (settings.outbox / "alerts").exists()
    assert not read_table("hole_alerts", settings=settings, spark=spark).first()["notified"]


def test_smtp_target_reads_airflow_connection_forms():
    settings = Settings(smtp={"host": "relay.local", "port": 2525, "mail_from": "bl@local"})
    assert str(smtp_target(settings, environ={})) == "smtp://relay.local:2525 (plain, from settings.smtp)"
    uri = smtp_target(settings, environ={"AIRFLOW_CONN_SMTP_DEFAULT": "smtp://u%40x:p%2Fw@mail.example.com:587?disable_ssl=true"})
    assert (uri.host, uri.port, uri.login, uri.password.get_secret_value()) == ("mail.example.com", 587, "u@x", "p/w")
    assert (uri.ssl, uri.starttls, uri.mail_from, uri.timeout) == (False, True, "bl@local", 30.0)
    assert "p/w" not in str(uri) and "p/w" not in repr(uri)
    conn = {
        "conn_type": "smtp",
        "host": "smtp.example.com",
        "login": "a",
        "password": "secret",
        "extra": json.dumps({"from_email": "alerts@example.com", "timeout": 5}),
    }
    js = smtp_target(settings, environ={"AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(conn)})
    # Airflow's SMTP provider defaults: SSL unless disable_ssl, standard port when none is given.
    assert (js.ssl, js.starttls, js.port, js.mail_from, js.timeout) == (True, False, None, "alerts@example.com", 5.0)
    assert str(js) == "smtp://a@smtp.example.com:465 (SSL, from Airflow connection smtp_default)"


def test_groups_by_namespace_glob_with_default_and_dedup():
    from brokerlens.deliver.alerting import plan
    from brokerlens.gold.holes.settings import AlertSettings

    cfg = AlertSettings(
        groups=[
            {"name": "payments", "namespaces": ["payments/*"], "to": ["p@x"]},
            {"name": "all-prod", "namespaces": ["*/prod-*", "payments/orders"], "to": ["o@x"]},
        ],
        default_group={"name": "ops", "to": ["ops@x"]},
    )
    alert = lambda ns, sub: {"cluster": "c1", "namespace": ns, "topic": f"persistent://{ns}/t", "subscription": sub}  # noqa: E731
    alerts = [alert("payments/orders", "a"), alert("payments/refunds", "b"), alert("search/prod-eu", "c"), alert("search/dev", "d")]
    accepted = {("payments", "c1", "persistent://payments/refunds/t", "b"): {"p@x"}}
    got = {g.group.name: [a["subscription"] for a in g.alerts] for g in plan(D1, cfg, alerts, accepted)}
    assert got == {"all-prod": ["a", "c"], "ops": ["d"], "payments": ["a"]}
