"""The report and the alert mail at desktop and phone widths in headless Chromium (nothing wider
than the page; charts with titles, axis units and legends), and the links the mail carries."""

from __future__ import annotations

import pytest

import base64
import json
import re
from datetime import timedelta
from html import unescape
from xml.etree import ElementTree

from brokerlens.deliver.report.links import report_path
from brokerlens.deliver.report.page import report_day
from report_data import (
    DAY,
    S1,
    T0,
    Page,
    daily,
    period,
    put,
    run_chromium,
)

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


@pytest.mark.slow
def test_report_and_alert_mail_fit_desktop_and_phone(spark, settings, seeded_day, tmp_path):
    from brokerlens.deliver.alerting import render
    from brokerlens.deliver.report.links import report_url, subscription_anchor
    from brokerlens.platform.tables import read_table

    report_day(spark, DAY, settings)
    report = report_path(DAY, settings)
    alerts = [r.asDict() for r in read_table("hole_alerts", settings=settings, spark=spark).orderBy("subscription").collect()]
    _, text, html = render(DAY, settings.alerts.default_group, alerts, settings)
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
                problems.append(f"{page.name} at {width}px: page {layout['scrollWidth']}px wide in a {layout['width']}px viewport; {layout['overflowing']}")
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
    from brokerlens.settings import reload_settings

    monkeypatch.setenv("BROKERLENS_REPORT__BASE_URL", "https://ops.example.com/brokerlens/")
    # The report's path below the reports folder, under the base URL (one slash between).
    assert report_url(DAY, reload_settings()) == "https://ops.example.com/brokerlens/2026-11-21/brokerlens-2026-11-21.html"


@pytest.mark.slow
def test_scrape_grain_scopes_are_called_a_lower_bound(spark, settings):
    from brokerlens.deliver.report.dispatch import dispatch_section

    # One 60 s scrape interval of S1 against a quota of 10 msg/s prorated to 600: 900 delivered, 300 over.
    row = dict(period(S1, T0 + timedelta(hours=10), 900, 600, 0), interval_seconds=60.0, grain="scrape", rate_period_seconds=1, source="metrics-counters")
    put(spark, "dispatch_periods", [row], settings)
    put(spark, "dispatch_daily", [dict(daily(S1, [row]), grain="scrape")], settings)
    section = dispatch_section(spark, DAY, settings, [])
    caption = section.tables[0].caption
    assert section.tables[0].rows[0][3] == "300"
    assert "From scrape-grain counters" in caption and "billing" in caption and "lower bound" in caption
