"""`brokerlens report`: the HTML a person opens, rendered by headless Chromium.

Gold tables are seeded with a small day whose numbers the tests compute from their own input;
the report must show those numbers, one chart per worst scope and per subscription closest to
the cap, every section, and a readable page in a real browser.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from datetime import date, datetime, timedelta, timezone
from html import unescape
from html.parser import HTMLParser
from xml.etree import ElementTree

import pytest

from brokerlens.deliver.report.links import report_path
from brokerlens.deliver.report.page import report_day
from brokerlens.platform.tables import table_schema, write_table

DAY = date(2026, 11, 21)
T0 = datetime(2026, 11, 21, tzinfo=timezone.utc)
SECTION_IDS = ["headline", "dispatch", "cursors", "reloads", "alerts", "producers", "quarantine", "quality"]

S1 = dict(level="subscription", cluster="c1", broker="broker-1:8080",
          topic="persistent://shop/orders/orders-partition-0", subscription="billing")
T1 = dict(level="topic", cluster="c1", broker="broker-1:8080",
          topic="persistent://shop/orders/orders-partition-1", subscription=None)
B1 = dict(level="broker", cluster="c1", broker="broker-2:8080", topic=None, subscription=None)


def put(spark, table: str, rows: list[dict]) -> None:
    """Append rows given by column name (absent columns are null) to a table."""
    schema = table_schema(table)
    data = [tuple(r.get(c) for c in schema.column_names) for r in rows]
    write_table(spark.createDataFrame(data, schema.struct), table, "append")


def period(scope, at, msgs, quota, debt_in):
    allowed = max(0, quota - debt_in)
    return dict(
        day=DAY, **scope, period_start=at, interval_seconds=1.0, grain="period", rate_period_seconds=1,
        count_unit="msgs", msgs=msgs, bytes=msgs * 100, counted_msgs=msgs, msg_limit=quota,
        quota_msgs=quota, debt_in_msgs=debt_in, allowed_msgs=allowed, over_msgs=max(0, msgs - allowed),
        debt_out_msgs=max(0, debt_in + msgs - quota), debt_in_bytes=0, over_bytes=0, debt_out_bytes=0,
        starved=allowed == 0, over_batch_msgs=0, over_redelivery_msgs=0, over_redelivery_bytes=0,
        over_approx_bytes=0, source="dispatch", limiter_model="classic", starved_empty_periods=0,
        counted_bytes=msgs * 100, charge_rule="charged", filtered_entries_charged=False,
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
        day=DAY, **scope, grain="period", periods=len(periods), msgs=sum(p["msgs"] for p in periods),
        bytes=sum(p["bytes"] for p in periods),
        periods_over=sum(p["over_msgs"] > 0 for p in periods),
        periods_over_msgs=sum(p["over_msgs"] > 0 for p in periods), periods_over_bytes=0,
        excess_msgs=sum(p["over_msgs"] for p in periods), excess_bytes=0,
        max_debt_msgs=max((p["debt_out_msgs"] for p in periods), default=0), max_debt_bytes=0,
        periods_starved=sum(p["starved"] for p in periods), opening_debt_msgs=0, opening_debt_bytes=0,
        closing_debt_msgs=0, closing_debt_bytes=0, share_other_msgs=1.0 if periods else None,
        main_cause="other" if any(p["over_msgs"] for p in periods) else None,
        limiter_model="classic", periods_exhausted=sum(p["msgs"] >= p["allowed_msgs"] for p in periods),
        periods_not_charged=0,
    )


def cursor(sub, at, ranges, cap=10000, growth=None):
    hours = (cap - ranges) / growth if growth and growth > 0 and ranges < cap else (0.0 if ranges >= cap else None)
    return dict(
        day=at.date(), snapshot_at=at, cluster="c1", broker="broker-1:8080", namespace="shop/orders",
        topic="persistent://shop/orders/orders-partition-0", subscription=sub, subscription_type="Shared",
        ranges=ranges, ranges_source="individuallyDeletedMessages", ranges_reported=ranges,
        ranges_malformed=False, cap=cap, cap_source="default", over_cap=max(0, ranges - cap),
        exposure_entries=max(0, ranges - cap) * 3, serialized_bytes=ranges * 26,
        serialized_bytes_source="estimated", growth_per_hour=growth, growth_snapshots=3,
        hours_to_cap=hours, forecast_cap_at=at + timedelta(hours=hours) if hours is not None else None,
    )


@pytest.fixture
def seeded_day(spark):
    """A small day in every gold table the report reads; returns the expected numbers."""
    s1 = (periods_for(S1, T0 + timedelta(hours=10), [30, 5, 25, 0, 12], quota=10)
          + periods_for(S1, T0 + timedelta(hours=15, minutes=30), [14, 14], quota=10))
    t1 = periods_for(T1, T0 + timedelta(hours=3), [120, 80], quota=100)
    b1 = periods_for(B1, T0 + timedelta(hours=1), [50, 50], quota=1000)
    put(spark, "dispatch_periods", s1 + t1 + b1)
    # S1's broker runs 4.1 (token bucket in dispatch_daily) and Pulsar counted 6 throttle events.
    s1_daily = {**daily(S1, s1), "limiter_model": "token-bucket", "pulsar_throttled_msg_events": 6,
                "pulsar_throttled_bytes_events": 0}
    put(spark, "dispatch_daily", [s1_daily, daily(T1, t1), daily(B1, b1)])

    # "drifting" grows 250 ranges an hour towards the cap; "stuck" is over the cap all day.
    cursors = [cursor("drifting", T0 + timedelta(hours=h), 2000 + 250 * h, growth=250.0) for h in range(-20, 24, 2)]
    cursors += [cursor("stuck", T0 + timedelta(hours=h), 12000 + h, growth=1.0) for h in range(0, 24, 4)]
    cursors += [cursor("healthy", T0 + timedelta(hours=h), 40, growth=0.0) for h in range(0, 24, 6)]
    put(spark, "cursor_ranges", cursors)
    # "stuck" moved to another broker at 10:00 and 21 acknowledgements came back, as predicted.
    put(spark, "reload_events", [dict(
        day=DAY, cluster="c1", namespace="shop/orders", topic="persistent://shop/orders/orders-partition-0",
        subscription="stuck", before_at=T0 + timedelta(hours=10), after_at=T0 + timedelta(hours=10, minutes=5),
        broker_before="broker-1:8080", broker_after="broker-2:8080", signals=["counters-reset", "broker-changed"],
        ranges_before=12_008, cap=10_000, persist_mode="ranges", predicted_unload_exposure=21,
        predicted_crash_exposure=21, backlog_before=100, backlog_after=121, backlog_jump=21, acks_lost=21,
        msg_out_after=121, observed_lost=21, explained_by="unload-or-crash", lost_acknowledgements=True,
    )])

    alert_base = dict(day=DAY, cluster="c1", namespace="shop/orders",
                      topic="persistent://shop/orders/orders-partition-0", subscription_type="Shared",
                      warning_threshold=8000, horizon_hours=24.0, first_seen=DAY, cap=10000, notified=True)
    put(spark, "hole_alerts", [
        dict(alert_base, subscription="stuck", severity="critical", state="new", ranges=12020,
             reason="12,020 ranges >= cap 10,000", hint="Shared: bound unacked messages per consumer."),
        dict(alert_base, subscription="drifting", severity="forecast", state="ongoing", ranges=7500,
             reason="cap within 24 h", notified=False),
        dict(alert_base, subscription="old", severity=None, state="resolved", ranges=None,
             reason="back under the warning threshold", notified=False),
    ])
    put(spark, "alert_notifications", [dict(
        day=DAY, group_name="payments", recipients=["ops@example.com", "sre@example.com"], cluster="c1",
        namespace="shop/orders", topic="persistent://shop/orders/orders-partition-0", subscription="stuck",
        severity="critical", state="new", subject="[brokerlens] critical: stuck", message_id="<1@x>",
        status="sent", outbox_file="outbox/1.eml", sent_at=T0 + timedelta(hours=23, minutes=5))])
    lint_base = dict(day=DAY, cluster="c1", topic="persistent://shop/orders/orders", config_hash="h",
                     first_seen=T0, last_seen=T0 + timedelta(hours=23), snapshots=24, partitions=8)
    put(spark, "producer_lint", [
        dict(lint_base, producer_name="orders-app-1", rule="batch-never-fills-by-count", severity="error",
             setting="batchingMaxMessages", configured="1000", bound=500.0, suggested="250",
             message="batchingMaxMessages 1000 > maxPendingMessages 500"),
        dict(lint_base, producer_name="orders-app-1", rule="queue-full-fails-fast", severity="warning",
             setting="blockIfQueueFull", configured="false", suggested="true",
             message="blockIfQueueFull=false with 3 send failures"),
    ])
    health_base = dict(day=DAY, cluster="c1", topic="persistent://shop/orders/orders", partitions=8,
                       snapshots=24, configurations=1)
    put(spark, "producer_health", [
        dict(health_base, producer_name="orders-app-1", msgs_sent=12000, batches_sent=400, msgs_per_batch=30.0,
             batching_max_messages=1000, batch_fill_ratio=0.03, send_failed=3, send_failed_queue_full=3,
             lint_findings=2),
        dict(health_base, producer_name="orders-app-2", msgs_sent=9000, batches_sent=10, msgs_per_batch=900.0,
             batching_max_messages=1000, batch_fill_ratio=0.9, send_failed=0, lint_findings=0),
    ])
    put(spark, "quarantine", [
        dict(day=DAY, stage="land", kind="dispatch", source_file=f"2026-11-21/dispatch/a.jsonl", line=i,
             reason=reason, detail=f"line {i}", raw="{}", ingested_at=T0)
        for i, reason in enumerate(["duplicate", "duplicate", "negative-counter"], start=1)
    ])
    # Two validation runs: only the later one is the day's result.
    checks = [("bronze_dispatch", "expect_column_values_to_not_be_null", "msgs", "critical"),
              ("bronze_dispatch", "expect_column_values_to_be_between", "msgs", "critical"),
              ("cursor_snapshots", "expect_column_values_to_be_in_set", "subscription_type", "warning")]
    put(spark, "validation_results", [
        dict(day=DAY, run_at=T0 + timedelta(days=1, hours=run), table_name=t, expectation=e, column_name=c,
             severity=sev, success=not (run == 0 or c == "subscription_type"), rows=1000,
             unexpected_count=0 if (run == 1 and c != "subscription_type") else 7, detail=f"run {run}")
        for run in (0, 1) for t, e, c, sev in checks
    ])
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
        pytest.fail("headless Chromium is needed: run infra/install-test-tools.sh (as root), "
                    f"or set {SKIP_BROWSER}=1 to skip the browser checks")
    return path


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
        capture_output=True, text=True, timeout=180,
    )


def test_report_numbers_sections_and_charts(spark, settings, seeded_day, tmp_path):
    result = report_day(DAY, settings)
    path = report_path(DAY, settings)
    assert path == settings.reports / "2026-11-21" / "brokerlens-2026-11-21.html"
    assert f"report: {path}" in result.lines
    page = Page(path.read_text())
    assert page.sections == SECTION_IDS
    assert result.metrics["charts"] == 5 and result.metrics["empty_sections"] == 0

    # Headline: the numbers this test's input implies.
    s1, t1 = seeded_day["s1"], seeded_day["t1"]
    excess = sum(p["over_msgs"] for p in s1 + t1)
    headline = page.joined("headline")
    assert f"{excess:,} | messages over quota" in headline
    assert "2 | scopes over quota" in headline  # the broker stayed within its quota
    assert "1 | over the cap (peak)" in headline  # "stuck"
    assert "3 | records quarantined" in headline
    assert "1 | new or escalated alerts" in headline
    assert "1 | producers with findings" in headline
    assert "1 | reloads that lost acknowledgements" in headline
    reloads = page.joined("reloads")
    assert "shop/orders/orders-partition-0 | stuck | 10:00:00 – 10:05:00 | counters-reset, broker-changed | 12,008" in reloads
    assert "21 / 21 | 21 | unload-or-crash" in reloads

    # Dispatch: the worst scopes first, one chart each with its own totals, none for the broker.
    charts = [i for i in page.images if i["section"] == "dispatch"]
    assert [c["alt"].split(":")[0] for c in charts] == ["subscription", "topic"]
    for chart, rows in zip(charts, (s1, t1)):
        over = sum(p["over_msgs"] for p in rows)
        debt = max(p["debt_out_msgs"] for p in rows)
        assert chart["alt"].endswith(f"{over:,} msgs over quota in the day, debt up to {debt:,} msgs")
        svg = base64.b64decode(chart["src"].removeprefix("data:image/svg+xml;base64,")).decode()
        assert "<svg" in svg and "over quota" in svg
    dispatch = page.joined("dispatch")
    assert dispatch.index("shop/orders/orders-partition-0 · billing") < dispatch.index("| shop/orders/orders-partition-1 |")
    assert "broker-2:8080" not in dispatch
    # s1: 30, 5, 25, 0, 12 then 14, 14 at 10/s: allowances 10, 0, 0, 0, 0 and 10, 6: all but the
    # 0 delivered against 0 allowed used theirs up, that one too (0 >= 0): 7 periods.
    assert "| token-bucket | 7 / 6, 0 |" in dispatch
    assert "| classic | 2 / —, — |" in dispatch  # t1: 120 >= 100 and 80 >= 80; no counters

    # Cursors: closest to the cap first ("stuck" is over it), "healthy" charted last.
    cursors = page.joined("cursors")
    assert cursors.index("· stuck") < cursors.index("· drifting") < cursors.index("· healthy")
    stuck_last = max((c for c in seeded_day["cursors"] if c["subscription"] == "stuck"), key=lambda c: c["snapshot_at"])
    assert f"{stuck_last['ranges']:,}" in cursors and f"{stuck_last['over_cap']:,}" in cursors
    cursor_charts = [i for i in page.images if i["section"] == "cursors"]
    assert [c["alt"].split(":")[0] for c in cursor_charts] == [f"shop/orders/orders-partition-0 · {s}" for s in ("stuck", "drifting", "healthy")]
    drifting_peak = max(c["ranges"] for c in seeded_day["cursors"] if c["subscription"] == "drifting" and c["day"] == DAY)
    assert any(f"up to {drifting_peak:,} ranges against a cap of 10,000" in c["alt"] for c in cursor_charts)

    # Alerts, producers, quarantine.
    alerts = page.joined("alerts")
    assert alerts.index("critical") < alerts.index("forecast") < alerts.index("resolved")
    assert "ops@example.com, sre@example.com" in alerts and "1 to 1 group" in alerts
    producers = page.joined("producers")
    assert producers.index("batch-never-fills-by-count") < producers.index("queue-full-fails-fast")
    assert "orders-app-1" in producers and "3%" in producers and "orders-app-2" not in producers
    quarantine = page.joined("quarantine")
    assert "duplicate | 2" in quarantine and "negative-counter | 1" in quarantine
    quality = page.joined("quality")
    assert "3 | expectations checked" in quality and "0 | critical failed" in quality
    assert "1 | warnings failed" in quality and "2026-11-22 01:00 | run at (UTC)" in quality
    assert "expect_column_values_to_be_in_set | subscription_type | warning | 1,000 | 7 | run 1" in quality
    assert "run 0" not in quality
    assert "1 | failed expectations" in page.joined("headline")

    check_in_chromium(path, tmp_path, charts=5)


def check_in_chromium(path, tmp_path, charts: int) -> None:
    """Render the page as a person would see it: a screenshot that is not blank, and the DOM."""
    url = path.as_uri()
    shot = tmp_path / "report.png"
    proc = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,4000", url)
    assert shot.is_file(), proc.stderr[-2000:]

    import matplotlib.image as mpimg

    pixels = mpimg.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (4000, 1280)
    # Not blank: text, charts and tables put dark and coloured pixels on the page.
    assert pixels.std() > 0.05
    dark = (pixels.mean(axis=2) < 0.5).mean()
    assert 0.005 < dark < 0.5
    # The charts' colours (over-quota red, debt/ranges blue) are painted.
    red = ((pixels[..., 0] > 0.7) & (pixels[..., 1] < 0.6) & (pixels[..., 2] < 0.5)).sum()
    blue = ((pixels[..., 2] > 0.5) & (pixels[..., 0] < 0.3)).sum()
    assert red > 500 and blue > 500
    if os.environ.get("BROKERLENS_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["BROKERLENS_KEEP_SCREENSHOT"])

    # The DOM as Chromium built it: every section, every chart image decoded by the browser.
    dom = run_chromium(tmp_path, "--dump-dom", "--virtual-time-budget=5000", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page(dom.stdout)
    assert page.sections == SECTION_IDS
    assert len([i for i in page.images if i["src"].startswith("data:image/svg+xml;base64,")]) == charts


def test_report_on_empty_tables_says_no_data(spark, settings):
    from typer.testing import CliRunner

    from brokerlens import cli

    out = CliRunner().invoke(cli.app, ["report", "--date", DAY.isoformat()])
    assert out.exit_code == 0, out.output
    assert f"report: {report_path(DAY, settings)}" in out.stdout and "charts=0" in out.stdout
    page = Page(report_path(DAY, settings).read_text())
    assert page.sections == SECTION_IDS
    assert page.images == []
    for section in ("dispatch", "cursors", "alerts", "producers"):
        assert re.search(r"No (\w+ )?(data|hole-risk alerts) for 2026-11-21", page.joined(section)), section
    assert "Nothing was quarantined on 2026-11-21." in page.joined("quarantine")
    assert "No data-quality results for 2026-11-21" in page.joined("quality")
    assert "no data" in page.joined("headline")


# Appended to a copy of a page: once it has loaded, measure it as the browser laid it out and
# hand the result to the frame around it (HARNESS). An element wider than the viewport is an
# overflow unless a scrolling box (the report's .table-wrap) holds it.
LAYOUT_PROBE = """
<script>
addEventListener("load", () => {
  const root = document.documentElement, width = root.clientWidth;
  const scrolls = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const overflowing = [...document.body.querySelectorAll("*")]
    .filter((el) => el.getBoundingClientRect().right > width + 1 && !scrolls(el))
    .slice(0, 10)
    .map((el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}: right edge ${Math.round(el.getBoundingClientRect().right)}px`);
  const images = [...document.images].map((img) => ({alt: img.alt, width: img.naturalWidth}));
  parent.postMessage(JSON.stringify({width, scrollWidth: root.scrollWidth, overflowing, images,
                     ids: [...document.querySelectorAll("[id]")].map((el) => el.id)}), "*");
});
</script>
"""
# Headless Chromium's window is at least 500 px wide, so a phone's viewport is an iframe of that
# width: the page inside lays out exactly as in a 390 px viewport. --dump-dom shows the result.
HARNESS = """<!DOCTYPE html><html><body style="margin: 0">
<iframe src="{src}" style="width: {width}px; height: 1600px; border: 0; display: block"></iframe>
<script>
addEventListener("message", (event) => {{
  const out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = event.data;
  document.body.appendChild(out);
}});
</script></body></html>
"""
WIDTHS = (1280, 390)
# Units an axis label must name (the charts' own: messages, bytes, ranges, per minute, UTC).
UNITS = re.compile(r"\b(msgs|bytes|ranges|UTC)\b|/min\b|/h\b")


def at_width(page, tmp_path, width: int):
    """A page that shows ``page`` (with LAYOUT_PROBE) in a ``width`` px viewport."""
    probe = tmp_path / f"probe-{page.name}"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    harness = tmp_path / f"{page.stem}-at-{width}.html"
    harness.write_text(HARNESS.format(src=probe.as_uri(), width=width))
    return harness


def layout_in_chromium(page, tmp_path, width: int) -> tuple[dict, object]:
    """(the page laid out at ``width`` px by Chromium, measured by LAYOUT_PROBE; a screenshot)."""
    harness = at_width(page, tmp_path, width)
    shot = tmp_path / f"{page.stem}-{width}.png"
    window = f"--window-size={max(width, 500) + 20},1600"
    run_chromium(tmp_path, f"--screenshot={shot}", window, harness.as_uri())
    dom = run_chromium(tmp_path, "--dump-dom", "--virtual-time-budget=5000", window, harness.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"the layout probe did not run in {harness}: {dom.stdout[-500:]}"
    return json.loads(unescape(found.group(1))), shot


def chart_parts(svg: str) -> dict[str, list[str]]:
    """Texts of a chart's parts, by the ids report._svg gives them (title, x-label, y-label-N,
    legend-N)."""
    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ElementTree.fromstring(svg)
    parts: dict[str, list[str]] = {}
    for group in root.iterfind(".//svg:g[@id]", ns):
        gid = group.get("id")
        if gid == "title" or gid.startswith(("x-label", "y-label", "legend")):
            parts[gid] = ["".join(t.itertext()).strip() for t in group.iterfind(".//svg:text", ns)]
    return parts


def test_report_and_alert_mail_fit_desktop_and_phone(spark, settings, seeded_day, tmp_path):
    from brokerlens.deliver.alerting import render
    from brokerlens.deliver.report.links import report_url, subscription_anchor
    from brokerlens.platform.tables import read_table

    report_day(DAY, settings)
    report = report_path(DAY, settings)
    alerts = [r.asDict() for r in read_table("hole_alerts").orderBy("subscription").collect()]
    _, text, html = render(DAY, settings.alerts.default_group, alerts, settings.alerts)
    mail = tmp_path / "hole-alerts-mail.html"
    mail.write_text(html)

    # The mail links to the day's report and to each subscription's row in it.
    url = report_url(DAY, settings)
    assert url == report.as_uri()
    stuck = subscription_anchor("c1", "persistent://shop/orders/orders-partition-0", "stuck")
    assert f'href="{url}#{stuck}"' in html and f"{url}#{stuck}" in text and f'href="{url}#alerts"' in html

    problems, shots = [], []
    for page in (report, mail):
        for width in WIDTHS:
            layout, shot = layout_in_chromium(page, tmp_path, width)
            shots.append(shot)
            # The viewport is as wide as asked (a scrollbar may take a few pixels).
            assert width - 20 <= layout["width"] <= width, layout["width"]
            if layout["scrollWidth"] > layout["width"] or layout["overflowing"]:
                problems.append(f"{page.name} at {width}px: page {layout['scrollWidth']}px wide in a "
                                f"{layout['width']}px viewport; {layout['overflowing']}")
            if not all(img["width"] > 0 for img in layout["images"]):
                problems.append(f"{page.name} at {width}px: images not drawn: {layout['images']}")
            if page == report:
                assert stuck in layout["ids"] and "alerts" in layout["ids"]
                assert len(layout["images"]) == 5
    if problems:
        print("screenshots:\n" + "\n".join(f"  {s}" for s in shots if s.is_file()))
    assert not problems, "\n".join(problems)

    # Every chart: a title, axes labelled with their units, a legend.
    for img in Page(report.read_text()).images:
        svg = base64.b64decode(img["src"].removeprefix("data:image/svg+xml;base64,")).decode()
        parts = chart_parts(svg)
        assert parts.get("title") and img["alt"].startswith(parts["title"][0] + ":"), (img["alt"], parts)
        assert parts.get("x-label") and UNITS.search(parts["x-label"][0]), (img["alt"], parts)
        ylabels = [v[0] for k, v in parts.items() if k.startswith("y-label") and v]
        assert ylabels and all(UNITS.search(y) for y in ylabels), (img["alt"], parts)
        legends = [v for k, v in parts.items() if k.startswith("legend")]
        assert legends and all(legends), (img["alt"], parts)


def test_mail_links_use_the_configured_base_url(monkeypatch):
    from brokerlens.deliver.report.links import report_url
    from brokerlens.platform.settings import reload_settings

    monkeypatch.setenv("BROKERLENS_REPORT__BASE_URL", "https://ops.example.com/brokerlens/")
    # The report's path below the reports folder, under the base URL (one slash between).
    assert report_url(DAY, reload_settings()) == "https://ops.example.com/brokerlens/2026-11-21/brokerlens-2026-11-21.html"


def test_scrape_grain_scopes_are_called_a_lower_bound(spark, settings):
    from brokerlens.deliver.report.dispatch import dispatch_section

    # One 60 s scrape interval of S1 against a quota of 10 msg/s prorated to 600: 900 delivered, 300 over.
    row = dict(period(S1, T0 + timedelta(hours=10), 900, 600, 0), interval_seconds=60.0, grain="scrape",
               rate_period_seconds=1, source="metrics-counters")
    put(spark, "dispatch_periods", [row])
    put(spark, "dispatch_daily", [dict(daily(S1, [row]), grain="scrape")])
    section = dispatch_section(DAY, settings, [])
    caption = section.tables[0].caption
    assert section.tables[0].rows[0][3] == "300"
    assert "From scrape-grain counters" in caption and "billing" in caption and "lower bound" in caption
