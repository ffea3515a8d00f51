"""A real local SMTP server (aiosmtpd) and the gold days the alert tests mail about."""

from __future__ import annotations

import email
import json
import shutil
from datetime import date, timedelta
from email import policy
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from typer.testing import CliRunner

from brokerlens import cli
from brokerlens.gold.holes.build import build_holes
from brokerlens.settings import get_settings, reload_settings
from holes_data import at, snap, write_snapshots
from pulsar_broker import free_port  # below the ephemeral range (infra/pulsar/standalone.py)
from brokerlens.platform.frames import rows_frame

D1 = date(2026, 11, 21)
D2 = D1 + timedelta(days=1)
PAY_TOPIC = "persistent://payments/orders/charges-partition-0"


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


# The lake of each set of days built in this session, copied into a folder of the session's own
# (a passing test's tmp_path goes when it ends): a later test with the same days and settings gets
# a copy, not another build. The lake's folders are all there is to it (platform/tables.py).
_built: dict[str, Path] = {}
_built_root: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def built_days_folder(tmp_path_factory):
    _built_root.append(tmp_path_factory.mktemp("built-days"))


def build_days(spark, ranges_by_day: dict[date, dict[str, int]]) -> None:
    """hole_alerts for each day from three snapshots per subscription (charges in payments/*,
    the others in t/ns, i.e. the default group)."""
    settings = get_settings()
    key = repr((sorted(ranges_by_day.items()), settings.model_dump_json(exclude={"home"})))
    if key in _built and not settings.lake.exists():
        shutil.copytree(_built[key], settings.lake)
        return
    for d, ranges in ranges_by_day.items():
        rows = []
        for h in (20, 21, 22) if d == D1 else (1, 2, 3):
            rows += [
                snap(
                    at(d, h),
                    None,
                    sub="charges",
                    topic=PAY_TOPIC,
                    namespace="payments/orders",
                    reported=ranges["charges"],
                    source="topic-stats",
                    sub_type="Key_Shared",
                ),
                snap(at(d, h), None, sub="billing", reported=ranges["billing"], source="topic-stats", delayed=50),
                snap(at(d, h), None, sub="audit", reported=ranges["audit"], source="topic-stats", sub_type="Failover"),
                snap(at(d, h), None, sub="search", reported=ranges["search"], source="topic-stats"),
            ]
        write_snapshots(spark, rows, d, settings)
        build_holes(spark, d, settings)
    if key not in _built:
        _built[key] = _built_root[0] / str(len(_built))
        shutil.copytree(settings.lake, _built[key])


DAY1_RANGES = {"charges": 12_000, "billing": 8_200, "audit": 9_000, "search": 10}


def build_two_days(spark) -> None:
    # Day 1: charges critical, billing warning, audit warning. Day 2: charges unchanged (ongoing),
    # billing escalates, audit resolves, search is new.
    build_days(spark, {D1: DAY1_RANGES, D2: {"charges": 12_000, "billing": 10_400, "audit": 300, "search": 8_800}})


def write_limiters(spark, day: date, settings) -> None:
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
    write_table(rows_frame(spark, rows, schema.struct), "dispatch_daily", "replace", [{"day": day}], settings=settings)


def run_alert(*args):
    return CliRunner().invoke(cli.app, ["alert", *args])


def parts(msg):
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    return text, html
