"""`brokerlens alert`: mail the day's hole-risk alerts, one message per recipient group.

What is mailed: new, escalated and resolved alerts of ``hole_alerts`` for the day, stale ones on
their first day without data ("no data since …", once per stretch without data), and ongoing ones
whose last mail is at least ``alerts.reminder_days`` old (or that were never mailed). Every message
sent is recorded in ``alert_notifications`` (and copied as an .eml under the outbox) right after
the SMTP server accepted it, so a re-run of the day sends nothing twice, and a failure part-way
leaves exactly the messages that went out recorded.
"""

from __future__ import annotations

import logging
import re
from datetime import date, datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from pyspark.sql import functions as F

from .holes import KEY, SEVERITY_RANK
from .mail import MailError, build_message, send, smtp_session, smtp_target
from .report import report_url, subscription_anchor
from .settings import AlertSettings, RecipientGroup, Settings, get_settings
from .spark import get_spark
from .stage import StageFailed, StageResult
from .schemas import table_schema
from .tables import read_table, write_table

log = logging.getLogger(__name__)

MAILED_STATES = ("new", "escalated", "resolved")


# ------------------------------------------------------------------------------ rendering


def _num(value) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _ts(value) -> str:
    return "n/a" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


def _rate(value) -> str:
    return "not enough snapshots" if value is None else f"{value:+,.0f} ranges/h"


def _forecast(alert: dict) -> str:
    hours = alert.get("hours_to_cap")
    if hours is None:
        return "not growing"
    if hours == 0:
        return "at or over the cap"
    when = f" ({_ts(alert['forecast_cap_at'])})" if alert.get("forecast_cap_at") else ""
    return f"cap in {hours:,.1f} h{when}"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("brokerlens", "templates"),
        autoescape=lambda name: bool(name and name.endswith(".html.j2")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, ts=_ts, rate=_rate, forecast=_forecast,
                       anchor=lambda a: subscription_anchor(a["cluster"], a["topic"], a["subscription"]))
    return env


def summary(alerts: list[dict]) -> str:
    counts: dict[str, int] = {}
    for a in alerts:
        label = {"resolved": "resolved", "stale": "no data"}.get(a["state"], a["severity"])
        counts[label] = counts.get(label, 0) + 1
    order = ["critical", "warning", "forecast", "no data", "resolved"]
    return ", ".join(f"{counts[k]} {k}" for k in order if k in counts)


def render(day: date, group: RecipientGroup, alerts: list[dict], cfg: AlertSettings) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of one group's message."""
    text_summary = summary(alerts)
    subject = f"{cfg.subject_prefix} Pulsar unacked-range alerts {day}: {text_summary}".strip()
    env = _environment()
    context = {"day": day, "group": group.name, "alerts": alerts, "summary": text_summary, "subject": subject,
               "report_url": report_url(day, get_settings())}
    return (
        subject,
        env.get_template("hole_alerts.txt.j2").render(context),
        env.get_template("hole_alerts.html.j2").render(context),
    )


# ------------------------------------------------------------------------------ who gets what


def groups_for(namespace: str, cfg: AlertSettings) -> list[RecipientGroup]:
    """Every group whose globs match the namespace, else the default group."""
    matched = [g for g in cfg.groups if any(fnmatchcase(namespace, glob) for glob in g.namespaces)]
    return matched or [cfg.default_group]


def _sort_key(alert: dict) -> tuple:
    resolved = alert["state"] in ("resolved", "stale")
    return (resolved, -SEVERITY_RANK.get(alert["severity"] or "", 0), -(alert["ranges"] or 0),
            alert["topic"], alert["subscription"])


def due_alerts(day: date, cfg: AlertSettings) -> list[dict]:
    """The day's alerts to mail (a few rows per subscription in trouble: collected)."""
    notifications = read_table("alert_notifications")
    last = (
        notifications.filter(F.col("day") < F.lit(day))
        .groupBy(*KEY)
        .agg(F.max("day").alias("last_notified"))
    )
    since = F.datediff(F.lit(day), F.col("last_notified"))
    reminder = F.col("last_notified").isNull() | (
        F.lit(cfg.reminder_days > 0) & (since >= F.lit(cfg.reminder_days))
    )
    due = (
        read_table("hole_alerts")
        .filter(F.col("day") == F.lit(day))
        .join(last, KEY, "left")
        .filter(
            F.col("state").isin(*MAILED_STATES)
            | ((F.col("state") == "ongoing") & reminder)
            | ((F.col("state") == "stale") & (F.col("stale_since") == F.lit(day)))
        )
    )
    return sorted((r.asDict() for r in due.collect()), key=_sort_key)


def plan(day: date, cfg: AlertSettings, alerts: list[dict], already_sent: set[tuple]) -> list[tuple[RecipientGroup, list[dict]]]:
    """(group, alerts) per message, leaving out what was already mailed to that group today."""
    by_group: dict[str, tuple[RecipientGroup, list[dict]]] = {}
    for alert in alerts:
        for group in groups_for(alert["namespace"], cfg):
            if (group.name, *(alert[k] for k in KEY)) in already_sent:
                continue
            by_group.setdefault(group.name, (group, []))[1].append(alert)
    return [by_group[name] for name in sorted(by_group)]


# ------------------------------------------------------------------------------ the stage


def _outbox_file(settings: Settings, day: date, group: str, sent_at: datetime) -> Path:
    folder = settings.outbox / "alerts" / day.isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", group)
    return folder / f"{sent_at:%Y%m%dT%H%M%S%f}-{safe}.eml"


def _record(day: date, group: RecipientGroup, alerts: list[dict], subject: str, message_id: str,
            outbox_file: Path, sent_at: datetime) -> None:
    schema = table_schema("alert_notifications")
    rows = [
        {
            "day": day, "group_name": group.name, "recipients": list(group.to), "cluster": a["cluster"],
            "namespace": a["namespace"], "topic": a["topic"], "subscription": a["subscription"],
            "severity": a["severity"], "state": a["state"], "subject": subject, "message_id": message_id,
            "outbox_file": str(outbox_file), "sent_at": sent_at.replace(tzinfo=None),
        }
        for a in alerts
    ]
    frame = get_spark().createDataFrame([tuple(r[c] for c in schema.column_names) for r in rows], schema.struct)
    write_table(frame, "alert_notifications", mode="append")


def _mark_notified(day: date) -> None:
    """hole_alerts.notified for the day, from what alert_notifications holds."""
    on_day = F.col("day") == F.lit(day)
    sent = read_table("alert_notifications").filter(on_day).select(*KEY).distinct().withColumn("sent", F.lit(True))
    alerts = read_table("hole_alerts").filter(on_day)
    updated = (
        alerts.join(sent, KEY, "left")
        .withColumn("notified", F.col("notified") | F.coalesce(F.col("sent"), F.lit(False)))
        .select(*table_schema("hole_alerts").column_names)
    )
    write_table(updated, "hole_alerts", mode="replace", partitions=[{"day": day}])


def alert_day(day: date, settings: Settings, dry_run: bool = False) -> StageResult:
    cfg = settings.alerts
    result = StageResult("alert", day)
    alerts = due_alerts(day, cfg)
    sent_today = read_table("alert_notifications").filter(F.col("day") == F.lit(day))
    already = {tuple(r) for r in sent_today.select("group_name", *KEY).collect()}
    messages = plan(day, cfg, alerts, already)
    result.metrics.update(alerts_due=len(alerts), messages=len(messages))
    if not messages:
        result.lines.append("nothing to send" + (" (already sent today)" if already else ""))
        if read_table("cursor_ranges").filter(F.col("day") == F.lit(day)).isEmpty():
            result.lines.append(f"cursor_ranges has no rows for {day}: was `brokerlens build --date {day}` run?")
        return result

    target = smtp_target(settings)
    if dry_run:
        result.lines.append(f"dry run: would send {len(messages)} message(s) via {target}; nothing sent or recorded")
        for group, group_alerts in messages:
            subject, text, _ = render(day, group, group_alerts, cfg)
            result.lines.append(f"to {group.name} <{', '.join(group.to)}>: {subject}")
            result.lines += [f"    {line}" if line else "" for line in text.splitlines()]
        return result

    sent = 0
    try:
        with smtp_session(target) as client:
            for group, group_alerts in messages:
                subject, text, html = render(day, group, group_alerts, cfg)
                msg = build_message(subject, target.mail_from, list(group.to), text, html)
                send(client, target, msg)
                sent_at = datetime.now(timezone.utc)
                outbox = _outbox_file(settings, day, group.name, sent_at)
                outbox.write_bytes(msg.as_bytes())
                _record(day, group, group_alerts, subject, msg["Message-ID"], outbox, sent_at)
                sent += 1
                result.lines.append(f"sent to {group.name} <{', '.join(group.to)}>: {subject} ({outbox})")
    except MailError as exc:
        raise StageFailed(
            f"{exc}\n{sent} of {len(messages)} alert message(s) sent and recorded; the others were not "
            "sent and will be sent by a re-run"
        ) from None
    finally:
        if sent:
            _mark_notified(day)
    result.metrics["sent"] = sent
    return result
