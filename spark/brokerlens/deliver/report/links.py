"""Where a day's report lives and how it is linked: its file, its address in the alert mail, and
the anchor of a subscription's row in the alerts section."""

from __future__ import annotations

import re
from datetime import date

from brokerlens.deliver.settings import DeliverStepSettings


def report_path(day: date, settings: DeliverStepSettings):
    """Where the report of ``day`` is written (the alert mail links to it)."""
    return settings.reports / day.isoformat() / f"brokerlens-{day.isoformat()}.html"


def report_url(day: date, settings: DeliverStepSettings) -> str:
    """The report's address in the alert mail: under ``report.base_url`` when the reports folder
    is served, else the file's own URL."""
    path = report_path(day, settings)
    base = settings.report.base_url
    if base:
        return f"{base.rstrip('/')}/{path.relative_to(settings.reports).as_posix()}"
    return path.as_uri()


def subscription_anchor(cluster: str, topic: str, subscription: str) -> str:
    """The id of a subscription's row in the report's alerts section (the mail links to it)."""
    return "sub-" + re.sub(r"[^A-Za-z0-9_]+", "-", f"{cluster}-{topic}-{subscription}").strip("-")
