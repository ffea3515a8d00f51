"""The small day the report tests seed into the gold tables, and the page parsed or rendered in
headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import date, datetime, timedelta, timezone
from html.parser import HTMLParser

import pytest

from brokerlens.platform.tables import table_schema, write_table
from brokerlens.platform.frames import rows_frame

DAY = date(2026, 11, 21)
T0 = datetime(2026, 11, 21, tzinfo=timezone.utc)
SECTION_IDS = ["headline", "dispatch", "cursors", "reloads", "alerts", "producers", "quarantine", "quality"]
S1 = dict(level="subscription", cluster="c1", broker="broker-1:8080", topic="persistent://shop/orders/orders-partition-0", subscription="billing")
T1 = dict(level="topic", cluster="c1", broker="broker-1:8080", topic="persistent://shop/orders/orders-partition-1", subscription=None)
B1 = dict(level="broker", cluster="c1", broker="broker-2:8080", topic=None, subscription=None)


def put(spark, table: str, rows: list[dict], settings) -> None:
    """Append rows given by column name (absent columns are null) to a table."""
    schema = table_schema(table)
    data = [tuple(r.get(c) for c in schema.column_names) for r in rows]
    write_table(rows_frame(spark, data, schema.struct), table, "append", settings=settings)


def period(scope, at, msgs, quota, debt_in):
    allowed = max(0, quota - debt_in)
    return dict(
        day=DAY,
        **scope,
        period_start=at,
        interval_seconds=1.0,
        grain="period",
        rate_period_seconds=1,
        count_unit="msgs",
        msgs=msgs,
        bytes=msgs * 100,
        counted_msgs=msgs,
        msg_limit=quota,
        quota_msgs=quota,
        debt_in_msgs=debt_in,
        allowed_msgs=allowed,
        credit_in_msgs=0,
        over_msgs=max(0, msgs - allowed),
        debt_out_msgs=max(0, debt_in + msgs - quota),
        debt_in_bytes=0,
        credit_in_bytes=0,
        over_bytes=0,
        debt_out_bytes=0,
        starved=allowed == 0,
        over_batch_msgs=0,
        over_redelivery_msgs=0,
        over_redelivery_bytes=0,
        over_approx_bytes=0,
        source="dispatch",
        limiter_model="classic",
        starved_empty_periods=0,
        counted_bytes=msgs * 100,
        charge_rule="charged",
        filtered_entries_charged=False,
    )


def periods_for(scope, start, delivered, quota):
    """Consecutive one-second periods with Lindley's recursion, computed here, not by brokerlens."""
    out, debt = [], 0
    for i, msgs in enumerate(delivered):
        row = period(scope, start + timedelta(seconds=i), msgs, quota, debt)
        debt = row["debt_out_msgs"]
        out.append(row)
    return out


def daily(scope, periods):
    return dict(
        day=DAY,
        **scope,
        grain="period",
        periods=len(periods),
        msgs=sum(p["msgs"] for p in periods),
        bytes=sum(p["bytes"] for p in periods),
        periods_over=sum(p["over_msgs"] > 0 for p in periods),
        periods_over_msgs=sum(p["over_msgs"] > 0 for p in periods),
        periods_over_bytes=0,
        excess_msgs=sum(p["over_msgs"] for p in periods),
        excess_bytes=0,
        max_debt_msgs=max((p["debt_out_msgs"] for p in periods), default=0),
        max_debt_bytes=0,
        periods_starved=sum(p["starved"] for p in periods),
        opening_debt_msgs=0,
        opening_debt_bytes=0,
        closing_debt_msgs=0,
        closing_debt_bytes=0,
        share_other_msgs=1.0 if periods else None,
        main_cause="other" if any(p["over_msgs"] for p in periods) else None,
        limiter_model="classic",
        periods_exhausted=sum(p["msgs"] >= p["allowed_msgs"] for p in periods),
        periods_not_charged=0,
    )


def cursor(sub, at, ranges, cap=10000, growth=None):
    hours = (cap - ranges) / growth if growth and growth > 0 and ranges < cap else (0.0 if ranges >= cap else None)
    return dict(
        day=at.date(),
        snapshot_at=at,
        cluster="c1",
        broker="broker-1:8080",
        namespace="shop/orders",
        topic="persistent://shop/orders/orders-partition-0",
        subscription=sub,
        subscription_type="Shared",
        ranges=ranges,
        ranges_source="individuallyDeletedMessages",
        ranges_reported=ranges,
        ranges_malformed=False,
        cap=cap,
        cap_source="default",
        over_cap=max(0, ranges - cap),
        exposure_entries=max(0, ranges - cap) * 3,
        serialized_bytes=ranges * 26,
        serialized_bytes_source="estimated",
        growth_per_hour=growth,
        growth_snapshots=3,
        hours_to_cap=hours,
        forecast_cap_at=at + timedelta(hours=hours) if hours is not None else None,
    )


@pytest.fixture
def seeded_day(spark, settings):
    """A small day in every gold table the report reads; returns the expected numbers."""
    s1 = periods_for(S1, T0 + timedelta(hours=10), [30, 5, 25, 0, 12], quota=10) + periods_for(S1, T0 + timedelta(hours=15, minutes=30), [14, 14], quota=10)
    t1 = periods_for(T1, T0 + timedelta(hours=3), [120, 80], quota=100)
    b1 = periods_for(B1, T0 + timedelta(hours=1), [50, 50], quota=1000)
    put(spark, "dispatch_periods", s1 + t1 + b1, settings)
    # S1's broker runs 4.1 (token bucket in dispatch_daily) and Pulsar counted 6 throttle events.
    s1_daily = {**daily(S1, s1), "limiter_model": "token-bucket", "pulsar_throttled_msg_events": 6, "pulsar_throttled_bytes_events": 0}
    put(spark, "dispatch_daily", [s1_daily, daily(T1, t1), daily(B1, b1)], settings)

    # "drifting" grows 250 ranges an hour towards the cap; "stuck" is over the cap all day.
    cursors = [cursor("drifting", T0 + timedelta(hours=h), 2000 + 250 * h, growth=250.0) for h in range(-20, 24, 2)]
    cursors += [cursor("stuck", T0 + timedelta(hours=h), 12000 + h, growth=1.0) for h in range(0, 24, 4)]
    cursors += [cursor("healthy", T0 + timedelta(hours=h), 40, growth=0.0) for h in range(0, 24, 6)]
    put(spark, "cursor_ranges", cursors, settings)
    # "stuck" moved to another broker at 10:00 and 21 acknowledgements came back, as predicted.
    reload = dict(day=DAY, cluster="c1", namespace="shop/orders", topic="persistent://shop/orders/orders-partition-0", subscription="stuck",
                  before_at=T0 + timedelta(hours=10), after_at=T0 + timedelta(hours=10, minutes=5), broker_before="broker-1:8080",
                  broker_after="broker-2:8080", signals=["counters-reset", "broker-changed"], ranges_before=12_008, cap=10_000,
                  persist_mode="ranges", predicted_unload_exposure=21, predicted_crash_exposure=21, backlog_before=100, backlog_after=121,
                  backlog_jump=21, acks_lost=21, msg_out_after=121, observed_lost=21, explained_by="unload-or-crash", lost_acknowledgements=True)  # fmt: skip
    put(spark, "reload_events", [reload], settings)

    alert_base = dict(
        day=DAY,
        cluster="c1",
        namespace="shop/orders",
        topic="persistent://shop/orders/orders-partition-0",
        subscription_type="Shared",
        warning_threshold=8000,
        horizon_hours=24.0,
        first_seen=DAY,
        cap=10000,
        notified=True,
    )
    put(
        spark,
        "hole_alerts",
        [
            dict(
                alert_base,
                subscription="stuck",
                severity="critical",
                state="new",
                ranges=12020,
                reason="12,020 ranges >= cap 10,000",
                hint="Shared: bound unacked messages per consumer.",
            ),
            dict(alert_base, subscription="drifting", severity="forecast", state="ongoing", ranges=7500, reason="cap within 24 h", notified=False),
            dict(alert_base, subscription="old", severity=None, state="resolved", ranges=None, reason="back under the warning threshold", notified=False),
        ],
        settings,
    )
    put(
        spark,
        "alert_notifications",
        [
            dict(
                day=DAY,
                group_name="payments",
                recipients=["ops@example.com", "sre@example.com"],
                cluster="c1",
                namespace="shop/orders",
                topic="persistent://shop/orders/orders-partition-0",
                subscription="stuck",
                severity="critical",
                state="new",
                subject="[brokerlens] critical: stuck",
                message_id="<1@x>",
                status="sent",
                outbox_file="outbox/1.eml",
                sent_at=T0 + timedelta(hours=23, minutes=5),
            )
        ],
        settings,
    )
    lint_base = dict(
        day=DAY,
        cluster="c1",
        topic="persistent://shop/orders/orders",
        config_hash="h",
        first_seen=T0,
        last_seen=T0 + timedelta(hours=23),
        snapshots=24,
        partitions=8,
    )
    put(
        spark,
        "producer_lint",
        [
            dict(
                lint_base,
                producer_name="orders-app-1",
                rule="batch-never-fills-by-count",
                severity="error",
                setting="batchingMaxMessages",
                configured="1000",
                bound=500.0,
                suggested="250",
                message="batchingMaxMessages 1000 > maxPendingMessages 500",
            ),
            dict(
                lint_base,
                producer_name="orders-app-1",
                rule="queue-full-fails-fast",
                severity="warning",
                setting="blockIfQueueFull",
                configured="false",
                suggested="true",
                message="blockIfQueueFull=false with 3 send failures",
            ),
        ],
        settings,
    )
    health_base = dict(day=DAY, cluster="c1", topic="persistent://shop/orders/orders", partitions=8, snapshots=24, configurations=1)
    put(
        spark,
        "producer_health",
        [
            dict(
                health_base,
                producer_name="orders-app-1",
                msgs_sent=12000,
                batches_sent=400,
                msgs_per_batch=30.0,
                batching_max_messages=1000,
                batch_fill_ratio=0.03,
                send_failed=3,
                send_failed_queue_full=3,
                lint_findings=2,
            ),
            dict(
                health_base,
                producer_name="orders-app-2",
                msgs_sent=9000,
                batches_sent=10,
                msgs_per_batch=900.0,
                batching_max_messages=1000,
                batch_fill_ratio=0.9,
                send_failed=0,
                lint_findings=0,
            ),
        ],
        settings,
    )
    put(
        spark,
        "quarantine",
        [
            dict(
                day=DAY,
                stage="land",
                kind="dispatch",
                source_file="2026-11-21/dispatch/a.jsonl",
                line=i,
                reason=reason,
                detail=f"line {i}",
                raw="{}",
                ingested_at=T0,
            )
            for i, reason in enumerate(["duplicate", "duplicate", "negative-counter"], start=1)
        ],
        settings,
    )
    # Two validation runs: only the later one is the day's result.
    checks = [
        ("bronze_dispatch", "expect_column_values_to_not_be_null", "msgs", "critical"),
        ("bronze_dispatch", "expect_column_values_to_be_between", "msgs", "critical"),
        ("cursor_snapshots", "expect_column_values_to_be_in_set", "subscription_type", "warning"),
    ]
    put(
        spark,
        "validation_results",
        [
            dict(
                day=DAY,
                run_at=T0 + timedelta(days=1, hours=run),
                table_name=t,
                expectation=e,
                column_name=c,
                severity=sev,
                success=not (run == 0 or c == "subscription_type"),
                rows=1000,
                unexpected_count=0 if (run == 1 and c != "subscription_type") else 7,
                detail=f"run {run}",
            )
            for run in (0, 1)
            for t, e, c, sev in checks
        ],
        settings,
    )
    return dict(s1=s1, t1=t1, b1=b1, cursors=cursors)


class Page(HTMLParser):
    """Sections, headline numbers, chart images and table cells of the report."""

    def __init__(self, html: str):
        super().__init__()
        self.sections: list[str] = []
        self.images: list[dict] = []
        self.text: dict[str, list[str]] = {}
        self._section = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self._section = attrs.get("id")
            self.sections.append(self._section)
            self.text[self._section] = []
        if tag == "img":
            self.images.append(dict(attrs, section=self._section))

    def handle_data(self, data):
        if self._section and data.strip():
            self.text[self._section].append(data.strip())

    def joined(self, section: str) -> str:
        return " | ".join(self.text[section])


SKIP_BROWSER = "BROKERLENS_SKIP_BROWSER_TESTS"


def chromium() -> str:
    """Headless Chromium; a missing browser fails the test unless BROKERLENS_SKIP_BROWSER_TESTS=1."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get(SKIP_BROWSER) == "1":
            pytest.skip(f"no Chromium and {SKIP_BROWSER}=1")
        pytest.fail(f"headless Chromium is needed: run infra/install-test-tools.sh (as root), or set {SKIP_BROWSER}=1 to skip the browser checks")
    return path


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
