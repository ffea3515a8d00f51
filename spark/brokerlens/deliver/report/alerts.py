"""Report section "Hole-risk alerts": the day's alerts by severity and state, each row anchored
for the alert mail's links, and the emails sent for the day."""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.gold.holes.alerts import SEVERITY_RANK
from brokerlens.platform.times import collect, first

from .blocks import SUBSCRIPTION, Number, Section, Table, day_rows, fmt, hhmm, limited, short_topic
from .links import subscription_anchor

STATE_ORDER = {"escalated": 0, "new": 1, "ongoing": 2, "resolved": 3}


def alert_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "alerts",
        "Hole-risk alerts",
        "One alert per subscription and day: critical at or over the cap, warning from the warning "
        "threshold, forecast when the trend reaches the cap within the horizon. The state follows "
        "the alert across days, so an unchanged alert is not mailed every day.",
    )
    alerts = day_rows(spark, "hole_alerts", day, settings, keep=True)
    counts = collect(alerts.groupBy("state", "severity").count())
    sent = day_rows(spark, "alert_notifications", day, settings, keep=True).where(F.col("status") == "sent")
    mails = first(sent.agg(F.count(F.lit(1)).alias("mails"), F.countDistinct("group_name").alias("groups")))
    by_state = {s: sum(c["count"] for c in counts if c["state"] == s) for s in STATE_ORDER}
    by_severity = {s: sum(c["count"] for c in counts if c["severity"] == s) for s in ("critical", "warning", "forecast")}
    if not counts:
        section.empty = f"No hole-risk alerts for {day}: hole_alerts has no rows for this day."
        headline.append(Number("alerts", "none", "good"))
        return section
    section.numbers = [
        Number("critical", fmt(by_severity["critical"]), "bad" if by_severity["critical"] else "good"),
        Number("warning", fmt(by_severity["warning"]), "bad" if by_severity["warning"] else ""),
        Number("forecast", fmt(by_severity["forecast"])),
        Number("new", fmt(by_state["new"])),
        Number("escalated", fmt(by_state["escalated"]), "bad" if by_state["escalated"] else ""),
        Number("ongoing", fmt(by_state["ongoing"])),
        Number("resolved", fmt(by_state["resolved"]), "good" if by_state["resolved"] else ""),
        Number("emails sent", f"{mails['mails']:,} to {mails['groups']:,} group{'s' if mails['groups'] != 1 else ''}" if mails["mails"] else "none"),
    ]
    headline += [
        Number("new or escalated alerts", fmt(by_state["new"] + by_state["escalated"]), "bad" if by_state["new"] + by_state["escalated"] else "good"),
        section.numbers[-1],
    ]
    # Most severe first (holes rank forecast < warning < critical); resolved rows (no severity) last.
    severity_rank = F.coalesce(*[F.when(F.col("severity") == k, F.lit(-v)) for k, v in SEVERITY_RANK.items()], F.lit(9))
    state_rank = F.coalesce(*[F.when(F.col("state") == k, F.lit(v)) for k, v in STATE_ORDER.items()], F.lit(9))
    ordered = alerts.orderBy(severity_rank, state_rank, F.desc_nulls_last("ranges"), *SUBSCRIPTION)
    rows, more = limited(ordered, settings.report.max_rows)
    section.tables.append(
        Table(
            ["severity", "state", "subscription", "type", "ranges (peak)", "cap", "growth /h", "cap reached (UTC)", "since", "mailed", "reason", "hint"],
            [
                [
                    r["severity"] or "—",
                    r["state"],
                    f"{short_topic(r['topic'])} · {r['subscription']}",
                    r["subscription_type"] or "—",
                    fmt(r["ranges"]),
                    fmt(r["cap"]),
                    fmt(r["growth_per_hour"], 1),
                    hhmm(r["forecast_cap_at"]),
                    r["first_seen"].isoformat(),
                    fmt(r["notified"]),
                    r["reason"],
                    r["hint"] or "—",
                ]
                for r in rows
            ],
            numeric={4, 5, 6},
            prose={10, 11},
            caption="Most severe first; escalated and new before ongoing and resolved.",
            more=more,
            row_ids=[subscription_anchor(r["cluster"], r["topic"], r["subscription"]) for r in rows],
        )
    )
    mail_rows, mail_more = limited(
        sent.orderBy("sent_at", "group_name", *SUBSCRIPTION).select("*", F.array_join("recipients", ", ").alias("to")),
        settings.report.max_rows,
    )
    if mail_rows:
        section.tables.append(
            Table(
                ["sent (UTC)", "group", "to", "subscription", "state", "subject"],
                [
                    [hhmm(m["sent_at"]), m["group_name"], m["to"], f"{short_topic(m['topic'])} · {m['subscription']}", m["state"], m["subject"]]
                    for m in mail_rows
                ],
                prose={2, 5},
                caption="Emails sent for this day (alert_notifications).",
                more=mail_more,
            )
        )
    return section
