"""`brokerlens report`: the HTML a person opens, rendered by headless Chromium.

Gold tables are seeded with a small day whose numbers the tests compute from their own input;
the report must show those numbers, one chart per worst scope and per subscription closest to
the cap, every section, and a readable page in a real browser.
"""

from __future__ import annotations

import pytest

import base64
import os
import re
import shutil

from brokerlens.deliver.report.links import report_path
from brokerlens.deliver.report.page import report_day
from report_data import (
    DAY,
    SECTION_IDS,
    Page,
    run_chromium,
)


@pytest.mark.slow
def test_report_numbers_sections_and_charts(spark, settings, seeded_day, tmp_path):
    result = report_day(spark, DAY, settings)
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
