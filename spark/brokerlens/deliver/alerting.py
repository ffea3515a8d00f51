"""`brokerlens alert`: mail the day's hole-risk alerts, one message per recipient group.

What is mailed: new, escalated and resolved alerts of ``hole_alerts`` for the day, stale ones on
their first day without data ("no data since …", once per stretch without data), and ongoing ones
whose last mail is at least ``alerts.reminder_days`` old (or that were never mailed).

Each message goes out at most once, also across a crash. Before it is handed to the SMTP server
its rows are recorded in ``alert_notifications`` as ``pending``, with a Message-ID derived from
the day, the group, the alerts and the recipients (the same on every run); once the server has
accepted it, its copy is written under the outbox and the rows become ``sent``. A run that finds
pending rows, left by a run that stopped in between, settles them first: a message whose outbox
copy exists was accepted (recorded as sent, not mailed again), one without was not (mailed by
this run). Recipients the server refuses are left out of the record, so a re-run mails only what
the server did not accept. One window remains, between the server's reply and the outbox write:
a crash exactly there mails the message again, with the same Message-ID, which mail systems
recognise as a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from email.utils import parseaddr
from fnmatch import fnmatchcase
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.gold.holes.alerts import SEVERITY_RANK
from brokerlens.gold.holes.persistence import KEY
from brokerlens.gold.holes.settings import AlertSettings, RecipientGroup
from brokerlens.platform.frames import rows_frame
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.stage import StageFailed, StageResult
from brokerlens.platform.tables import merge_table, read_table, sql_equals
from brokerlens.platform.times import collect, minute

from .mail import MailError, build_message, send, smtp_session, smtp_target
from .report.links import report_url, subscription_anchor

log = logging.getLogger(__name__)

MAILED_STATES = ("new", "escalated", "resolved")
PENDING, SENT = "pending", "sent"
# Crash tests: the process dies at this point of sending ("pending-recorded": before the server
# has the message; "accepted": after it accepted it, before it is recorded as sent).
CRASH_ENV = "BROKERLENS_TEST_ALERT_CRASH_AT"


# ------------------------------------------------------------------------------ rendering


def _num(value) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _rate(value) -> str:
    return "not enough snapshots" if value is None else f"{value:+,.0f} ranges/h"


def _forecast(alert: dict) -> str:
    hours = alert.get("hours_to_cap")
    if hours is None:
        return "not growing"
    if hours == 0:
        return "at or over the cap"
    when = f" ({minute(alert['forecast_cap_at'])})" if alert.get("forecast_cap_at") else ""
    return f"cap in {hours:,.1f} h{when}"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("brokerlens.deliver", "templates"),
        autoescape=lambda name: bool(name and name.endswith(".html.j2")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, ts=minute, rate=_rate, forecast=_forecast, anchor=lambda a: subscription_anchor(a["cluster"], a["topic"], a["subscription"]))
    return env


def summary(alerts: list[dict]) -> str:
    counts: dict[str, int] = {}
    for a in alerts:
        label = {"resolved": "resolved", "stale": "no data"}.get(a["state"], a["severity"])
        counts[label] = counts.get(label, 0) + 1
    order = ["critical", "warning", "forecast", "no data", "resolved"]
    return ", ".join(f"{counts[k]} {k}" for k in order if k in counts)


def render(day: date, group: RecipientGroup, alerts: list[dict], settings: DeliverStepSettings,
           limiters: Sequence[dict] = ()) -> tuple[str, str, str]:  # fmt: skip
    """(subject, plain text, HTML) of one group's message. ``limiters``: ``dispatch_limiters`` of
    the day; the summary names those of the clusters the message is about."""
    cfg = settings.alerts
    clusters = {a["cluster"] for a in alerts}
    limiters = [lim for lim in limiters if lim["cluster"] in clusters]
    text_summary = summary(alerts)
    subject = f"{cfg.subject_prefix} Pulsar unacked-range alerts {day}: {text_summary}".strip()
    env = _environment()
    context = {
        "day": day,
        "group": group.name,
        "alerts": alerts,
        "summary": text_summary,
        "subject": subject,
        "report_url": report_url(day, settings),
        "limiters": limiters,
    }
    return (
        subject,
        env.get_template("hole_alerts.txt.j2").render(context),
        env.get_template("hole_alerts.html.j2").render(context),
    )


def dispatch_limiters(spark: SparkSession, day: date, settings: DeliverStepSettings) -> list[dict]:
    """The dispatch rate limiter each broker was judged with on ``day`` (dispatch_daily: one model
    per broker and day) and how it was chosen, for the mail summary."""
    daily = read_table("dispatch_daily", spark=spark, settings=settings).filter(F.col("day") == F.lit(day))
    rows = daily.select("cluster", "broker", "limiter_model", "limiter_model_source").distinct()
    return [r.asDict() for r in collect(rows.orderBy("cluster", "broker"))]  # one row per broker


# ------------------------------------------------------------------------------ who gets what


def groups_for(namespace: str, cfg: AlertSettings) -> list[RecipientGroup]:
    """Every group whose globs match the namespace, else the default group."""
    matched = [g for g in cfg.groups if any(fnmatchcase(namespace, glob) for glob in g.namespaces)]
    return matched or [cfg.default_group]


def _sort_key(alert: dict) -> tuple:
    resolved = alert["state"] in ("resolved", "stale")
    return (resolved, -SEVERITY_RANK.get(alert["severity"] or "", 0), -(alert["ranges"] or 0), alert["topic"], alert["subscription"])


def due_alerts(spark: SparkSession, day: date, settings: DeliverStepSettings) -> list[dict]:
    """The day's alerts to mail (a few rows per subscription in trouble: collected)."""
    cfg = settings.alerts
    notifications = read_table("alert_notifications", spark=spark, settings=settings).filter(F.col("status") == SENT)
    last = notifications.filter(F.col("day") < F.lit(day)).groupBy(*KEY).agg(F.max("day").alias("last_notified"))
    since = F.datediff(F.lit(day), F.col("last_notified"))
    reminder = F.col("last_notified").isNull() | (F.lit(cfg.reminder_days > 0) & (since >= F.lit(cfg.reminder_days)))
    due = (
        read_table("hole_alerts", spark=spark, settings=settings)
        .filter(F.col("day") == F.lit(day))
        .join(last, KEY, "left")
        .filter(
            F.col("state").isin(*MAILED_STATES)
            | ((F.col("state") == "ongoing") & reminder)
            | ((F.col("state") == "stale") & (F.col("stale_since") == F.lit(day)))
        )
    )
    # The day's reloads that lost acknowledgements (reload_events), one mail line each.
    lost = (
        read_table("reload_events", spark=spark, settings=settings)
        .filter((F.col("day") == F.lit(day)) & F.col("lost_acknowledgements"))
        .groupBy(*KEY)
        .agg(
            F.sort_array(
                F.collect_list(
                    F.struct(
                        "after_at",
                        "observed_lost",
                        "predicted_unload_exposure",
                        "predicted_crash_exposure",
                        "explained_by",
                    )
                )
            ).alias("lost_reloads")
        )
    )
    rows = []
    for r in collect(due.join(lost, KEY, "left")):
        row = {k: v for k, v in r.asDict().items() if k != "lost_reloads"}
        row["lost_reloads"] = [e.asDict() for e in r["lost_reloads"] or []]
        rows.append(row)
    return sorted(rows, key=_sort_key)


@dataclass
class Outgoing:
    """One message: a group's alerts, to those of its addresses that have not had them today."""

    group: RecipientGroup
    to: tuple[str, ...]
    alerts: list[dict] = field(default_factory=list)


def plan(day: date, cfg: AlertSettings, alerts: list[dict], accepted: dict[tuple, set[str]]) -> list[Outgoing]:
    """A message per group and recipient set, each alert to every address of its groups that
    the server has not yet accepted it for today (``accepted``: (group, *KEY) -> addresses)."""
    messages: dict[tuple[str, tuple[str, ...]], Outgoing] = {}
    for alert in alerts:
        for group in groups_for(alert["namespace"], cfg):
            done = accepted.get((group.name, *(alert[k] for k in KEY)), set())
            to = tuple(a for a in group.to if a not in done)
            if to:
                messages.setdefault((group.name, to), Outgoing(group, to)).alerts.append(alert)
    return [messages[k] for k in sorted(messages)]


def message_id(day: date, out: Outgoing, mail_from: str) -> str:
    """The same on every run for the same day, group, alerts and recipients."""
    facts = [day.isoformat(), out.group.name, sorted(out.to), sorted([a[k] for k in KEY] for a in out.alerts)]
    digest = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]
    domain = parseaddr(mail_from)[1].rpartition("@")[2] or "localhost"
    return f"<brokerlens.{day:%Y%m%d}.{digest}@{domain}>"


# ------------------------------------------------------------------------------ the record


def _outbox_file(settings: DeliverStepSettings, day: date, group: str, msg_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", group)
    return settings.outbox / "alerts" / day.isoformat() / f"{safe}-{hashlib.sha256(msg_id.encode()).hexdigest()[:16]}.eml"


def _rows(day: date, out: Outgoing, subject: str, msg_id: str, outbox: Path, status: str, recipients: list[str], sent_at: datetime | None) -> list[dict]:
    return [
        {
            "day": day,
            "group_name": out.group.name,
            "recipients": recipients,
            "cluster": a["cluster"],
            "namespace": a["namespace"],
            "topic": a["topic"],
            "subscription": a["subscription"],
            "severity": a["severity"],
            "state": a["state"],
            "subject": subject,
            "message_id": msg_id,
            "status": status,
            "outbox_file": str(outbox),
            "sent_at": sent_at,
        }
        for a in out.alerts
    ]


def record(spark: SparkSession, day: date, msg_id: str, rows: list[dict], settings: DeliverStepSettings) -> None:
    """The one state change of ``alert_notifications``, a MERGE: the message's pending rows are
    replaced by ``rows`` (pending rows before it is sent, sent rows once accepted, none when the
    server did not take it); sent rows are never replaced."""
    schema = table_schema("alert_notifications")
    # sent_at is aware (UTC), as rows_frame needs: it would read a naive one as UTC.
    new = rows_frame(spark, rows, schema.struct)
    pending = f"t.status = '{PENDING}'"
    merge_table(
        new,
        "alert_notifications",
        partitions=[{"day": day}],
        settings=settings,
        update_when=pending,
        delete_when=f"{pending} AND t.message_id {sql_equals(msg_id)}",
    )


def settle_pending(spark: SparkSession, day: date, settings: DeliverStepSettings) -> list[str]:
    """Messages left pending by a run that stopped: sent if their outbox copy exists (the server
    had accepted them), else dropped, to be mailed again. A line per message."""
    pending: dict[str, list[dict]] = {}
    for r in collect(read_table("alert_notifications", spark=spark, settings=settings).filter((F.col("day") == F.lit(day)) & (F.col("status") == PENDING))):
        pending.setdefault(r["message_id"], []).append(r.asDict())
    lines = []
    for msg_id, rows in sorted(pending.items()):
        copy, group = Path(rows[0]["outbox_file"]), rows[0]["group_name"]
        if copy.is_file():
            sent_at = datetime.fromtimestamp(copy.stat().st_mtime, timezone.utc)
            record(spark, day, msg_id, [r | {"status": SENT, "sent_at": sent_at} for r in rows], settings)
            lines.append(f"{msg_id} to {group}: accepted before an earlier run stopped; recorded as sent, not mailed again")
        else:
            record(spark, day, msg_id, [], settings)
            lines.append(f"{msg_id} to {group}: not sent by an earlier run that stopped; mailed now")
    return lines


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(137)


def _mark_notified(spark: SparkSession, day: date, settings: DeliverStepSettings) -> None:
    """hole_alerts.notified for the day, from what alert_notifications holds as sent."""
    on_day = F.col("day") == F.lit(day)
    sent = (
        read_table("alert_notifications", spark=spark, settings=settings)
        .filter(on_day & (F.col("status") == SENT))
        .select(*KEY)
        .distinct()
        .withColumn("sent", F.lit(True))
    )
    alerts = read_table("hole_alerts", spark=spark, settings=settings).filter(on_day)
    updated = (
        alerts.join(sent, KEY, "left")
        .withColumn("notified", F.col("notified") | F.coalesce(F.col("sent"), F.lit(False)))
        .select(*table_schema("hole_alerts").column_names)
    )
    merge_table(updated, "hole_alerts", partitions=[{"day": day}], settings=settings, update_when="t.notified <> s.notified")


# ------------------------------------------------------------------------------ the stage


def alert_day(spark: SparkSession, day: date, settings: DeliverStepSettings, dry_run: bool = False) -> StageResult:
    cfg = settings.alerts
    result = StageResult("alert", day)
    settled = [] if dry_run else settle_pending(spark, day, settings)
    result.lines += settled
    alerts = due_alerts(spark, day, settings)
    sent_today = read_table("alert_notifications", spark=spark, settings=settings).filter((F.col("day") == F.lit(day)) & (F.col("status") == SENT))
    accepted: dict[tuple, set[str]] = {}
    for r in collect(sent_today.select("group_name", *KEY, "recipients")):
        accepted.setdefault(tuple(r)[:-1], set()).update(r["recipients"])
    messages = plan(day, cfg, alerts, accepted)
    result.metrics.update(alerts_due=len(alerts), messages=len(messages))
    if not messages:
        result.lines.append("nothing to send" + (" (already sent today)" if accepted else ""))
        if settled:
            _mark_notified(spark, day, settings)
        if read_table("cursor_ranges", spark=spark, settings=settings).filter(F.col("day") == F.lit(day)).isEmpty():
            result.lines.append(f"cursor_ranges has no rows for {day}: was `brokerlens build --date {day}` run?")
        return result

    target = smtp_target(settings)
    limiters = dispatch_limiters(spark, day, settings)
    if dry_run:
        result.lines.append(f"dry run: would send {len(messages)} message(s) via {target}; nothing sent or recorded")
        for out in messages:
            subject, text, _ = render(day, out.group, out.alerts, settings, limiters)
            result.lines.append(f"to {out.group.name} <{', '.join(out.to)}>: {subject}")
            result.lines += [f"    {line}" if line else "" for line in text.splitlines()]
        return result

    sent, problems = 0, []
    try:
        with smtp_session(target) as client:
            for out in messages:
                subject, text, html = render(day, out.group, out.alerts, settings, limiters)
                msg_id = message_id(day, out, target.mail_from)
                copy = _outbox_file(settings, day, out.group.name, msg_id)
                msg = build_message(subject, target.mail_from, list(out.to), text, html, message_id=msg_id)
                record(spark, day, msg_id, _rows(day, out, subject, msg_id, copy, PENDING, list(out.to), None), settings)
                _crash_point("pending-recorded")
                try:
                    refused = send(client, target, msg, partial=True)
                except MailError as exc:
                    record(spark, day, msg_id, [], settings)  # the server did not take it: left for a re-run
                    problems.append(str(exc))
                    continue
                sent_at = datetime.now(timezone.utc)
                # The copy is the mark that the server accepted the message: written before the
                # record, it tells a run after a crash here not to mail it again.
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(msg.as_bytes())
                _crash_point("accepted")
                to = [a for a in out.to if a not in refused]
                record(spark, day, msg_id, _rows(day, out, subject, msg_id, copy, SENT, to, sent_at), settings)
                sent += 1
                result.lines.append(f"sent to {out.group.name} <{', '.join(to)}>: {subject} ({copy})")
                if refused:
                    problems.append(f"SMTP server {target} refused {', '.join(refused)} for {subject!r}")
    except MailError as exc:
        problems.append(str(exc))
    finally:
        if sent or settled:
            _mark_notified(spark, day, settings)
    result.metrics["sent"] = sent
    if problems:
        raise StageFailed(
            "\n".join(problems) + f"\n{sent} of {len(messages)} alert message(s) sent and recorded; what the "
            "server did not accept was not recorded and will be sent by a re-run"
        )
    return result
