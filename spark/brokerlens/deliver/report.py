"""`brokerlens report`: one self-contained HTML file for a day, readable offline.

``<reports>/<day>/brokerlens-<day>.html`` holds the headline numbers, the worst dispatch scopes
with their over-delivery and debt over the day, the subscriptions closest to the unacked-range
cap with their trend towards it, hole-risk alerts and their state, producer lint findings,
quarantine counts and data-quality results. Charts are matplotlib SVGs inlined as data URIs.

Everything is aggregated in Spark; only bounded results reach the driver: the top N scopes and
subscriptions (settings ``report``), their series downsampled to per-minute (dispatch) or
per-10-minute (cursors) maxima, and tables cut at ``report.max_rows`` rows.
"""

from __future__ import annotations

import base64
import io
import logging
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerlens.platform.progress import progress
from brokerlens.platform.schemas import table_schemas
from brokerlens.platform.settings import Settings
from brokerlens.platform.spark import get_spark
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, table_version

log = logging.getLogger(__name__)

# The columns that name a dispatch scope (dispatch_periods, dispatch_daily, debt_state).
SCOPE = ("level", "cluster", "broker", "topic", "subscription")
SUBSCRIPTION = ("cluster", "topic", "subscription")
CURSOR_BUCKET_SECONDS = 600
SEVERITY_ORDER = {"critical": 0, "error": 0, "warning": 1, "forecast": 2}


def report_path(day: date, settings: Settings):
    """Where the report of ``day`` is written (the alert mail links to it)."""
    return settings.reports / day.isoformat() / f"brokerlens-{day.isoformat()}.html"


def report_url(day: date, settings: Settings) -> str:
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


# ------------------------------------------------------------------------- page model


@dataclass
class Number:
    label: str
    value: str
    # "bad" for numbers a person must act on when non-zero, "good" when all is well.
    tone: str = ""


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    # Columns aligned right (numbers).
    numeric: set[int] = field(default_factory=set)
    # Columns of prose that wrap (reasons, hints); the others stay on one line.
    prose: set[int] = field(default_factory=set)
    caption: str = ""
    # Rows left out because of report.max_rows.
    more: int = 0
    # An id per row, for links into the report (the alert mail's, to a subscription).
    row_ids: list[str] = field(default_factory=list)


@dataclass
class Chart:
    title: str
    svg_base64: str
    alt: str


@dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    numbers: list[Number] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    # Set when the section's tables hold nothing for the day.
    empty: str | None = None


# ---------------------------------------------------------------------------- helpers


def _day_rows(name: str, day: date) -> DataFrame:
    return read_table(name).where(F.col("day") == F.lit(day))


def _fmt(value, digits: int = 0) -> str:
    """Numbers as an operator reads them: thousands separators, '—' for unknown."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if digits or abs(value) >= 100 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _bytes(value) -> str:
    if value is None:
        return "—"
    units = ("B", "KiB", "MiB", "GiB")
    step = 0
    while abs(value) >= 1024 and step < len(units) - 1:
        value, step = value / 1024, step + 1
    return f"{value:,.0f} B" if step == 0 else f"{value:,.1f} {units[step]}"


def _short_topic(topic: str | None) -> str:
    return (topic or "").removeprefix("persistent://").removeprefix("non-persistent://")


def scope_label(level: str, broker: str | None, topic: str | None, subscription: str | None) -> str:
    """The scope without its level: broker address, topic partition, or partition · subscription."""
    if level == "broker":
        return broker or "—"
    if level == "topic":
        return _short_topic(topic)
    return f"{_short_topic(topic)} · {subscription}"


def _epoch(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp())


def _hhmm(column: str) -> Column:
    return F.date_format(F.col(column), "yyyy-MM-dd HH:mm")


def _limited(df: DataFrame, limit: int) -> tuple[list, int]:
    """At most ``limit`` rows of an ordered DataFrame, and how many were left out."""
    rows = df.limit(limit + 1).collect()
    if len(rows) <= limit:
        return rows, 0
    return rows[:limit], df.count() - limit


def _null_safe_join(left: DataFrame, right: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Join on key columns that may be null (broker-level scopes have no topic)."""
    r = right.select(*[F.col(k).alias(f"_k_{k}") for k in keys], *[c for c in right.columns if c not in keys])
    cond = None
    for k in keys:
        term = left[k].eqNullSafe(r[f"_k_{k}"])
        cond = term if cond is None else cond & term
    return left.join(F.broadcast(r), cond).drop(*[f"_k_{k}" for k in keys])


# ----------------------------------------------------------------------------- charts


def _figure(height: float = 2.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, crisp in any browser
            "svg.hashsalt": "brokerlens",  # same data, same file
            "font.family": "sans-serif",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.titlesize": 10,
            "axes.titleweight": "bold",
            "axes.titlelocation": "left",
        }
    )
    fig, ax = plt.subplots(figsize=(11, height), layout="constrained")
    return fig, ax


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    # Ids for the chart's parts, so that a test (or a reader's tool) finds its axis labels and
    # legend in the SVG: x-label, y-label-N, legend-N (and "title", set with the title).
    fig.axes[0].xaxis.label.set_gid("x-label")
    for i, ax in enumerate(fig.axes):
        ax.yaxis.label.set_gid(f"y-label-{i}")
    for i, legend in enumerate(fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]):
        legend.set_gid(f"legend-{i}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _time_axis(ax, start: datetime, end: datetime) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import StrMethodFormatter

    ax.set_xlim(start, end)
    if (end - start) <= timedelta(days=1):
        ax.xaxis.set_major_locator(mdates.HourLocator(interval=2, tz=timezone.utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=timezone.utc))
        ax.set_xlabel("UTC")
    else:
        ax.xaxis.set_major_locator(mdates.DayLocator(tz=timezone.utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%d %b", tz=timezone.utc))
        ax.xaxis.set_minor_locator(mdates.HourLocator(byhour=[6, 12, 18], tz=timezone.utc))
        ax.grid(axis="x", which="major", alpha=0.3)
        ax.set_xlabel("UTC (days from 00:00)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(axis="y", alpha=0.3)


def dispatch_chart(day: date, label: str, unit: str, minutes: dict[int, tuple[int, int]]) -> Chart:
    """Over-delivery per minute (area) and the debt carried out (line) of one scope."""
    import numpy as np

    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
    from matplotlib.ticker import StrMethodFormatter

    times = [start + timedelta(minutes=m) for m in range(1440)]
    over = np.zeros(1440)
    # Debt drains through minutes without a record; the line is broken there, not interpolated.
    debt = np.full(1440, np.nan)
    for m, (o, d) in minutes.items():
        over[m], debt[m] = o, d
    fig, ax = _figure()
    busy = np.nonzero(over)[0]
    # One vertical stroke per minute over quota: visible even for a single minute in a day.
    ax.vlines([times[m] for m in busy], 0, over[busy], color="#d6604d", linewidth=1.6,
              label=f"over quota ({unit} per minute)")
    ax.set_ylabel(f"over quota, {unit}/min")
    ax.set_ylim(0, max(1, over.max()) * 1.1)
    ax2 = ax.twinx()
    # Markers keep isolated minutes visible; a busy day reads as a line without them.
    ax2.plot(times, debt, color="#2166ac", linewidth=1.1, marker="o" if len(minutes) < 120 else None, markersize=2,
             label=f"debt carried out ({unit}, max per minute)")
    ax2.set_ylabel(f"debt, {unit}")
    ax2.set_ylim(0, max(1, np.nanmax(debt) if len(minutes) else 1) * 1.1)
    ax2.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    _time_axis(ax, start, start + timedelta(days=1))
    ax.set_title(label, gid="title")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="outside upper right", ncols=2, frameon=False, fontsize=8)
    total_over = int(over.sum())
    peak_debt = max((d for _, d in minutes.values()), default=0)
    return Chart(
        label,
        _svg(fig),
        f"{label}: {total_over:,} {unit} over quota in the day, debt up to {peak_debt:,} {unit}",
    )


def cursor_chart(
    label: str,
    points: list[tuple[int, int]],
    cap: int,
    warning: int,
    last: tuple[int, int] | None,
    growth_per_hour: float | None,
    forecast_at: int | None,
    window: tuple[datetime, datetime],
) -> Chart:
    """Ranges over the last days against the cap and the warning threshold, with the forecast."""
    points = sorted(points)
    times = [datetime.fromtimestamp(t, tz=timezone.utc) for t, _ in points]
    start, end = window
    fig, ax = _figure(2.8)
    ax.plot(times, [r for _, r in points], color="#2166ac", linewidth=1.3,
            label="ranges (max per 10 min)")
    ax.axhline(cap, color="#b2182b", linewidth=1.2, label=f"cap {cap:,}")
    ax.axhline(warning, color="#ef8a62", linewidth=1, linestyle="--", label=f"warning {warning:,}")
    if last is not None and growth_per_hour and growth_per_hour > 0:
        t0 = datetime.fromtimestamp(last[0], tz=timezone.utc)
        reach = datetime.fromtimestamp(forecast_at, tz=timezone.utc) if forecast_at else end
        t1 = min(reach, end)
        r1 = last[1] + growth_per_hour * (t1 - t0).total_seconds() / 3600
        ax.plot([t0, t1], [last[1], r1], color="#2166ac", linestyle=":", linewidth=1.3,
                label=f"trend {growth_per_hour:+,.0f}/h")
        if forecast_at and last[1] < cap and reach <= end:
            ax.plot([reach], [cap], marker="o", color="#b2182b")
            ax.annotate(f"cap at {reach:%d %b %H:%M} UTC", (reach, cap), textcoords="offset points",
                        xytext=(-4, 6), ha="right", fontsize=8, color="#b2182b")
    top = max([cap, *(r for _, r in points)]) * 1.12
    ax.set_ylim(0, top)
    ax.set_ylabel("ranges")
    _time_axis(ax, start, end)
    ax.set_title(label, gid="title")
    fig.legend(loc="outside upper right", frameon=False, fontsize=8, ncols=4)
    peak = max((r for _, r in points), default=0)
    return Chart(label, _svg(fig), f"{label}: up to {peak:,} ranges against a cap of {cap:,}")


# --------------------------------------------------------------------------- sections


def _scrape_note(rows: list) -> str:
    """Scopes measured only from counters at scrape grain: what they say is a lower bound."""
    scraped = [scope_label(r["level"], r["broker"], r["topic"], r["subscription"]) for r in rows if r["grain"] != "period"]
    if not scraped:
        return ""
    return (
        f" From scrape-grain counters (topic stats or /metrics, not per period): {', '.join(scraped)}; "
        "over-delivery over a scrape interval (e.g. 60 s) is a lower bound of the per-period figure."
    )


def dispatch_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "dispatch",
        "Over-delivery and debt",
        "Scopes whose dispatch went over the quota in force (dispatchThrottlingRate*), worst first. "
        "Pulsar charges the excess to the following periods as debt; a scope with no allowance left "
        "is starved. Charts: over-delivery per minute and the debt carried out, for the worst scopes.",
    )
    daily = _day_rows("dispatch_daily", day)
    s = daily.agg(
        F.count(F.lit(1)).alias("scopes"),
        F.sum(F.when(F.col("periods_over") > 0, 1).otherwise(0)).alias("scopes_over"),
        F.sum("periods_over").alias("periods_over"),
        F.sum("excess_msgs").alias("excess_msgs"),
        F.sum("excess_bytes").alias("excess_bytes"),
        F.max("max_debt_msgs").alias("max_debt_msgs"),
        F.sum("periods_starved").alias("periods_starved"),
    ).first()
    if not s["scopes"]:
        section.empty = f"No dispatch data for {day}: dispatch_daily has no rows for this day."
        headline.append(Number("scopes over quota", "no data"))
        return section
    section.numbers = [
        Number("scopes measured", _fmt(s["scopes"])),
        Number("scopes over quota", _fmt(s["scopes_over"]), "bad" if s["scopes_over"] else "good"),
        Number("periods over quota", _fmt(s["periods_over"])),
        Number("messages over quota", _fmt(s["excess_msgs"])),
        Number("bytes over quota", _bytes(s["excess_bytes"])),
        Number("largest debt (messages)", _fmt(s["max_debt_msgs"])),
        Number("periods starved by debt", _fmt(s["periods_starved"]), "bad" if s["periods_starved"] else ""),
    ]
    headline += [section.numbers[1], section.numbers[3], section.numbers[6]]

    worst = daily.where((F.col("periods_over") > 0) | (F.col("periods_starved") > 0)).orderBy(
        F.desc("excess_msgs"), F.desc("excess_bytes"), F.desc("periods_starved"), *SCOPE
    )
    rows, more = _limited(worst, settings.report.max_rows)
    if not rows:
        section.tables.append(Table(["result"], [[f"Every scope stayed within its quota on {day}."]]))
        return section
    section.tables.append(
        Table(
            ["level", "scope", "periods over", "msgs over", "bytes over", "max debt msgs",
             "max debt bytes", "starved", "closing debt msgs", "limiter",
             "allowance used up / Pulsar throttled (msg, byte events)", "causes (share of msgs over)"],
            [
                [
                    r["level"], scope_label(r["level"], r["broker"], r["topic"], r["subscription"]),
                    _fmt(r["periods_over"]), _fmt(r["excess_msgs"]), _bytes(r["excess_bytes"]),
                    _fmt(r["max_debt_msgs"]), _bytes(r["max_debt_bytes"]), _fmt(r["periods_starved"]),
                    _fmt(r["closing_debt_msgs"]), r["limiter_model"],
                    f"{_fmt(r['periods_exhausted'])} / {_fmt(r['pulsar_throttled_msg_events'])}, "
                    f"{_fmt(r['pulsar_throttled_bytes_events'])}",
                    _causes(r),
                ]
                for r in rows
            ],
            numeric={2, 3, 4, 5, 6, 7, 8},
            prose={11},
            caption="Worst scopes by messages over quota, then bytes over quota." + _scrape_note(rows),
            more=more,
        )
    )

    top = rows[: settings.report.top_scopes]
    top_df = get_spark().createDataFrame([tuple(r[k] for k in SCOPE) for r in top], daily.select(*SCOPE).schema)
    minutes = (
        _null_safe_join(_day_rows("dispatch_periods", day), top_df, SCOPE)
        .withColumn("minute", F.floor((F.unix_timestamp("period_start") - _epoch(day)) / 60).cast("int"))
        .groupBy(*SCOPE, "minute")
        .agg(
            F.sum("over_msgs").alias("over_msgs"),
            F.max("debt_out_msgs").alias("debt_msgs"),
            F.sum("over_bytes").alias("over_bytes"),
            F.max("debt_out_bytes").alias("debt_bytes"),
        )
        .collect()
    )
    series: dict[tuple, list] = {}
    for m in minutes:
        series.setdefault(tuple(m[k] for k in SCOPE), []).append(m)
    for r in top:
        key = tuple(r[k] for k in SCOPE)
        label = scope_label(r["level"], r["broker"], r["topic"], r["subscription"])
        # Chart the unit the scope went over in: messages, else bytes (a byte-only limit).
        in_msgs = bool(r["excess_msgs"] or r["max_debt_msgs"])
        unit, over_col, debt_col = ("msgs", "over_msgs", "debt_msgs") if in_msgs else ("bytes", "over_bytes", "debt_bytes")
        points = {m["minute"]: (m[over_col], m[debt_col]) for m in series.get(key, []) if 0 <= m["minute"] < 1440}
        section.charts.append(dispatch_chart(day, f"{r['level']}: {label}", unit, points))
    return section


def _causes(r) -> str:
    """Main cause first, then the message shares of each cause."""
    shares = [
        f"{name} {_pct(r[col])}"
        for name, col in (("batch", "share_batch_msgs"), ("redelivery", "share_redelivery_msgs"),
                          ("other", "share_other_msgs"))
        if r[col]
    ]
    main = f"main: {r['main_cause']}" if r["main_cause"] else ""
    return "; ".join(p for p in (main, ", ".join(shares)) if p) or "—"


def cursor_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "cursors",
        "Closest to the unacked-range cap",
        "Subscriptions by acknowledged ranges after markDeletePosition (holes) at the day's last "
        "snapshot, against managedLedgerMaxUnackedRangesToPersist. Ranges beyond the cap are not "
        "persisted: their acknowledgements are lost on a topic reload and those entries are "
        "delivered again (exposure). In long-array mode (managedLedgerPersistIndividualAckAsLongArray, "
        "default from Pulsar 4.1) the cap counts acknowledged entries per ledger instead; exposure is "
        "computed for the mode in force. Charts: ranges over the last days and the trend towards the cap.",
    )
    from pyspark.sql import Window

    today = _day_rows("cursor_ranges", day)
    by_sub = Window.partitionBy(*SUBSCRIPTION)
    last = (
        today.withColumn("_n", F.row_number().over(by_sub.orderBy(F.desc("snapshot_at"))))
        .withColumn("peak", F.max("ranges").over(by_sub))
        .withColumn("peak_over_cap", F.max("over_cap").over(by_sub))
        .where(F.col("_n") == 1)
        .withColumn("share_of_cap", F.col("ranges") / F.col("cap"))
    )
    s = last.agg(
        F.count(F.lit(1)).alias("subscriptions"),
        F.sum(F.when(F.col("peak_over_cap") > 0, 1).otherwise(0)).alias("over_cap"),
        F.sum(F.when(F.col("peak") >= settings.alerts.warning_ranges, 1).otherwise(0)).alias("over_warning"),
        F.max("peak").alias("max_ranges"),
        F.sum("exposure_entries").alias("exposure"),
    ).first()
    if not s["subscriptions"]:
        section.empty = f"No cursor data for {day}: cursor_ranges has no rows for this day."
        headline.append(Number("subscriptions over the cap", "no data"))
        return section
    section.numbers = [
        Number("subscriptions measured", _fmt(s["subscriptions"])),
        Number("over the cap (peak)", _fmt(s["over_cap"]), "bad" if s["over_cap"] else "good"),
        Number(f"at or over {settings.alerts.warning_ranges:,} ranges (peak)", _fmt(s["over_warning"]),
               "bad" if s["over_warning"] else ""),
        Number("most ranges (peak)", _fmt(s["max_ranges"])),
        Number("entries exposed to redelivery (last snapshot)", _fmt(s["exposure"] or 0),
               "bad" if s["exposure"] else ""),
    ]
    headline += [section.numbers[1], section.numbers[3]]

    alerts = _day_rows("hole_alerts", day).select(*SUBSCRIPTION, "warning_threshold")
    ranked = (
        last.where(F.col("ranges") > 0)
        .join(alerts, list(SUBSCRIPTION), "left")
        .orderBy(F.desc("share_of_cap"), F.asc_nulls_last("hours_to_cap"), *SUBSCRIPTION)
        .select(
            "*",
            _hhmm("forecast_cap_at").alias("forecast_text"),
            F.unix_timestamp("snapshot_at").alias("last_epoch"),
            F.unix_timestamp("forecast_cap_at").alias("forecast_epoch"),
        )
    )
    rows, more = _limited(ranked, settings.report.max_rows)
    if not rows:
        section.tables.append(Table(["result"], [[f"No subscription had acknowledged ranges (holes) on {day}."]]))
        return section
    section.tables.append(
        Table(
            ["subscription", "type", "ranges (last)", "ranges (peak)", "cap", "of cap", "over cap",
             "exposure (entries)", "persisted as (mode)", "serialized", "growth /h", "hours to cap",
             "cap reached (UTC)"],
            [
                [
                    f"{_short_topic(r['topic'])} · {r['subscription']}", r["subscription_type"] or "—",
                    _fmt(r["ranges"]), _fmt(r["peak"]), _fmt(r["cap"]), _pct(r["share_of_cap"]),
                    _fmt(r["over_cap"]), _fmt(r["exposure_entries"]),
                    f"{r['persisted_as'] or '—'} ({r['persist_mode'] or '—'})",
                    _bytes(r["serialized_bytes"]) + (" (est.)" if r["serialized_bytes_source"] != "reported" else ""),
                    _fmt(r["growth_per_hour"], 1), _fmt(r["hours_to_cap"], 1), r["forecast_text"] or "—",
                ]
                for r in rows
            ],
            numeric={2, 3, 4, 5, 6, 7, 9, 10, 11},
            caption="Closest to the cap first (ranges at the last snapshot over the cap in force).",
            more=more,
        )
    )

    top = rows[: settings.report.top_subscriptions]
    first_day = day - timedelta(days=settings.report.trend_days - 1)
    top_df = get_spark().createDataFrame(
        [tuple(r[k] for k in SUBSCRIPTION) for r in top], today.select(*SUBSCRIPTION).schema
    )
    buckets = (
        read_table("cursor_ranges")
        .where(F.col("day").between(F.lit(first_day), F.lit(day)) & F.col("ranges").isNotNull())
        .join(F.broadcast(top_df), list(SUBSCRIPTION))
        .withColumn(
            "bucket",
            F.floor(F.unix_timestamp("snapshot_at") / CURSOR_BUCKET_SECONDS) * CURSOR_BUCKET_SECONDS,
        )
        .groupBy(*SUBSCRIPTION, "bucket")
        .agg(F.max("ranges").alias("ranges"))
        .collect()
    )
    series: dict[tuple, list] = {}
    for b in buckets:
        series.setdefault(tuple(b[k] for k in SUBSCRIPTION), []).append((int(b["bucket"]), b["ranges"]))
    window = (
        datetime(first_day.year, first_day.month, first_day.day, tzinfo=timezone.utc),
        datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        + timedelta(days=1, hours=settings.alerts.horizon_hours),
    )
    for r in top:
        section.charts.append(
            cursor_chart(
                f"{_short_topic(r['topic'])} · {r['subscription']}",
                series.get(tuple(r[k] for k in SUBSCRIPTION), []),
                r["cap"],
                r["warning_threshold"] or settings.alerts.warning_ranges,
                (r["last_epoch"], r["ranges"]),
                r["growth_per_hour"],
                r["forecast_epoch"],
                window,
            )
        )
    return section


STATE_ORDER = {"escalated": 0, "new": 1, "ongoing": 2, "resolved": 3}


def alert_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "alerts",
        "Hole-risk alerts",
        "One alert per subscription and day: critical at or over the cap, warning from the warning "
        "threshold, forecast when the trend reaches the cap within the horizon. The state follows "
        "the alert across days, so an unchanged alert is not mailed every day.",
    )
    alerts = _day_rows("hole_alerts", day)
    counts = alerts.groupBy("state", "severity").count().collect()
    sent = _day_rows("alert_notifications", day).where(F.col("status") == "sent")
    mails = sent.agg(F.count(F.lit(1)).alias("mails"), F.countDistinct("group_name").alias("groups")).first()
    by_state = {s: sum(c["count"] for c in counts if c["state"] == s) for s in STATE_ORDER}
    by_severity = {s: sum(c["count"] for c in counts if c["severity"] == s) for s in ("critical", "warning", "forecast")}
    if not counts:
        section.empty = f"No hole-risk alerts for {day}: hole_alerts has no rows for this day."
        headline.append(Number("alerts", "none", "good"))
        return section
    section.numbers = [
        Number("critical", _fmt(by_severity["critical"]), "bad" if by_severity["critical"] else "good"),
        Number("warning", _fmt(by_severity["warning"]), "bad" if by_severity["warning"] else ""),
        Number("forecast", _fmt(by_severity["forecast"])),
        Number("new", _fmt(by_state["new"])),
        Number("escalated", _fmt(by_state["escalated"]), "bad" if by_state["escalated"] else ""),
        Number("ongoing", _fmt(by_state["ongoing"])),
        Number("resolved", _fmt(by_state["resolved"]), "good" if by_state["resolved"] else ""),
        Number("emails sent", f"{mails['mails']:,} to {mails['groups']:,} group{'s' if mails['groups'] != 1 else ''}"
               if mails["mails"] else "none"),
    ]
    headline += [
        Number("new or escalated alerts", _fmt(by_state["new"] + by_state["escalated"]),
               "bad" if by_state["new"] + by_state["escalated"] else "good"),
        section.numbers[-1],
    ]
    severity_rank = F.coalesce(*[F.when(F.col("severity") == k, F.lit(v)) for k, v in SEVERITY_ORDER.items()], F.lit(9))
    state_rank = F.coalesce(*[F.when(F.col("state") == k, F.lit(v)) for k, v in STATE_ORDER.items()], F.lit(9))
    ordered = alerts.orderBy(severity_rank, state_rank, F.desc_nulls_last("ranges"), *SUBSCRIPTION).select(
        "*", _hhmm("forecast_cap_at").alias("forecast_text")
    )
    rows, more = _limited(ordered, settings.report.max_rows)
    section.tables.append(
        Table(
            ["severity", "state", "subscription", "type", "ranges (peak)", "cap", "growth /h",
             "cap reached (UTC)", "since", "mailed", "reason", "hint"],
            [
                [
                    r["severity"] or "—", r["state"], f"{_short_topic(r['topic'])} · {r['subscription']}",
                    r["subscription_type"] or "—", _fmt(r["ranges"]), _fmt(r["cap"]),
                    _fmt(r["growth_per_hour"], 1), r["forecast_text"] or "—", r["first_seen"].isoformat(),
                    _fmt(r["notified"]), r["reason"], r["hint"] or "—",
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
    mail_rows, mail_more = _limited(
        sent.orderBy("sent_at", "group_name", *SUBSCRIPTION).select(
            "*", _hhmm("sent_at").alias("sent_text"), F.array_join("recipients", ", ").alias("to")
        ),
        settings.report.max_rows,
    )
    if mail_rows:
        section.tables.append(
            Table(
                ["sent (UTC)", "group", "to", "subscription", "state", "subject"],
                [
                    [m["sent_text"], m["group_name"], m["to"], f"{_short_topic(m['topic'])} · {m['subscription']}",
                     m["state"], m["subject"]]
                    for m in mail_rows
                ],
                prose={2, 5},
                caption="Emails sent for this day (alert_notifications).",
                more=mail_more,
            )
        )
    return section


def producer_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "producers",
        "Producer lint findings",
        "Producer configurations checked against seed 003's relations (batch size against the "
        "pending queue, pending messages across partitions, memory limit, batch bytes, partition "
        "switch frequency, blockIfQueueFull), and how the producers behaved over the day.",
    )
    lint = _day_rows("producer_lint", day)
    health = _day_rows("producer_health", day)
    s = lint.agg(
        F.sum(F.when(F.col("severity") == "error", 1).otherwise(0)).alias("errors"),
        F.sum(F.when(F.col("severity") == "warning", 1).otherwise(0)).alias("warnings"),
        F.countDistinct("cluster", "topic", "producer_name").alias("producers_flagged"),
    ).first()
    h = health.agg(
        F.count(F.lit(1)).alias("producers"),
        F.sum("send_failed").alias("send_failed"),
        F.sum(F.when(F.col("batch_fill_ratio") < 0.5, 1).otherwise(0)).alias("underfilled"),
    ).first()
    if not h["producers"] and not s["producers_flagged"]:
        section.empty = f"No producer data for {day}: producer_health and producer_lint have no rows for this day."
        headline.append(Number("producers with lint findings", "no data"))
        return section
    errors, warnings = s["errors"] or 0, s["warnings"] or 0
    section.numbers = [
        Number("producers seen", _fmt(h["producers"])),
        Number("producers with findings", _fmt(s["producers_flagged"]), "bad" if s["producers_flagged"] else "good"),
        Number("errors", _fmt(errors), "bad" if errors else ""),
        Number("warnings", _fmt(warnings)),
        Number("batches under half full", _fmt(h["underfilled"] or 0)),
        Number("send failures", _fmt(h["send_failed"] or 0), "bad" if h["send_failed"] else ""),
    ]
    headline.append(section.numbers[1])
    rows, more = _limited(
        lint.orderBy(F.when(F.col("severity") == "error", 0).otherwise(1), "topic", "producer_name", "rule"),
        settings.report.max_rows,
    )
    section.tables.append(
        Table(
            ["producer", "topic", "severity", "rule", "setting", "configured", "suggested", "why"],
            [
                [r["producer_name"], _short_topic(r["topic"]), r["severity"], r["rule"], r["setting"],
                 r["configured"], r["suggested"], r["message"]]
                for r in rows
            ],
            prose={7},
            caption="Errors first. A producer whose configuration passes every rule has no row.",
            more=more,
        )
        if rows
        else Table(["result"], [["Every producer configuration passed seed 003's rules."]])
    )
    watch = health.where(
        (F.col("lint_findings") > 0) | (F.col("send_failed") > 0) | (F.col("batch_fill_ratio") < 0.5)
        | (F.col("pending_saturation_share") > 0)
    ).orderBy(F.desc_nulls_last("send_failed"), F.asc_nulls_last("batch_fill_ratio"), "topic", "producer_name")
    rows, more = _limited(watch, settings.report.max_rows)
    if rows:
        section.tables.append(
            Table(
                ["producer", "topic", "partitions", "msgs sent", "msgs / batch", "batchingMaxMessages",
                 "batch fill", "pending saturated", "send failed", "failures by kind", "p99 max ms",
                 "partition skew"],
                [
                    [r["producer_name"], _short_topic(r["topic"]), _fmt(r["partitions"]), _fmt(r["msgs_sent"]),
                     _fmt(r["msgs_per_batch"], 1), _fmt(r["batching_max_messages"]), _pct(r["batch_fill_ratio"]),
                     _pct(r["pending_saturation_share"]), _fmt(r["send_failed"]), _failure_kinds(r),
                     _fmt(r["send_latency_ms_p99_max"], 1), _fmt(r["partition_skew"], 2)]
                    for r in rows
                ],
                numeric={2, 3, 4, 5, 6, 7, 8, 10, 11},
                prose={9},
                caption="Producers with send failures, under-filled batches, a saturated pending queue or lint findings.",
                more=more,
            )
        )
    return section


def _failure_kinds(r) -> str:
    kinds = [
        f"{name} {r[col]:,}"
        for name, col in (("ProducerQueueIsFullError", "send_failed_queue_full"),
                          ("MemoryBufferIsFullError", "send_failed_memory_full"),
                          ("TimeoutException", "send_failed_timeout"), ("other", "send_failed_other"))
        if r[col]
    ]
    return ", ".join(kinds) or "—"


def quarantine_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "quarantine",
        "Quarantined records",
        "Landing records that could not be used, by stage, landing kind and reason. Nothing is "
        "dropped silently: each record is in the quarantine table with its file, line and reason.",
    )
    q = _day_rows("quarantine", day)
    counts = q.groupBy("stage", "kind", "reason").count().orderBy(F.desc("count"), "stage", "kind", "reason")
    total = q.count()
    rows, more = _limited(counts, settings.report.max_rows)
    headline.append(Number("records quarantined", _fmt(total), "bad" if total else "good"))
    if not rows:
        section.empty = f"Nothing was quarantined on {day}."
        return section
    section.numbers = [Number("records quarantined", _fmt(total), "bad")]
    section.tables.append(
        Table(["stage", "kind", "reason", "records"],
              [[r["stage"], r["kind"], r["reason"], _fmt(r["count"])] for r in rows],
              numeric={3}, more=more)
    )
    examples, more = _limited(q.orderBy("source_file", "line"), min(10, settings.report.max_rows))
    section.tables.append(
        Table(
            ["file", "line", "reason", "detail"],
            [[e["source_file"], _fmt(e["line"]), e["reason"], e["detail"] or "—"] for e in examples],
            numeric={1},
            prose={3},
            caption="First records by file and line (the raw text is in the quarantine table).",
            more=more,
        )
    )
    return section


def quality_section(day: date, settings: Settings, headline: list[Number]) -> Section:
    section = Section(
        "quality",
        "Data-quality results",
        "Great Expectations suites run by `brokerlens validate` on the day's partitions (each table's "
        "latest run of the day; every run is kept in validation_results). A failed critical expectation "
        "stops the pipeline; a failed warning is reported.",
    )
    from pyspark.sql import Window

    results = _day_rows("validation_results", day)
    # Per table: the daily DAG validates bronze and silver in two runs.
    latest = (
        results.withColumn("_last_run", F.max("run_at").over(Window.partitionBy("table_name")))
        .where(F.col("run_at") == F.col("_last_run"))
        .drop("_last_run")
    )
    if latest.isEmpty():
        section.empty = f"No data-quality results for {day}: `brokerlens validate` has not run for this day."
        headline.append(Number("failed expectations", "no data"))
        return section
    s = latest.agg(
        F.count(F.lit(1)).alias("expectations"),
        F.countDistinct("table_name").alias("tables"),
        F.sum(F.when(~F.col("success") & (F.col("severity") == "critical"), 1).otherwise(0)).alias("critical"),
        F.sum(F.when(~F.col("success") & (F.col("severity") != "critical"), 1).otherwise(0)).alias("warning"),
        F.date_format(F.max("run_at"), "yyyy-MM-dd HH:mm").alias("run_at"),
    ).first()
    failed = s["critical"] + s["warning"]
    section.numbers = [
        Number("expectations checked", _fmt(s["expectations"])),
        Number("tables validated", _fmt(s["tables"])),
        Number("critical failed", _fmt(s["critical"]), "bad" if s["critical"] else "good"),
        Number("warnings failed", _fmt(s["warning"]), "bad" if s["warning"] else ""),
        Number("run at (UTC)", s["run_at"]),
    ]
    headline.append(Number("failed expectations", _fmt(failed), "bad" if failed else "good"))
    rows, more = _limited(
        latest.where(~F.col("success")).orderBy(
            F.when(F.col("severity") == "critical", 0).otherwise(1), "table_name", "expectation", "column_name"
        ),
        settings.report.max_rows,
    )
    section.tables.append(
        Table(
            ["table", "expectation", "column", "severity", "rows", "unexpected", "detail"],
            [[r["table_name"], r["expectation"], r["column_name"] or "—", r["severity"], _fmt(r["rows"]),
              _fmt(r["unexpected_count"]), r["detail"] or "—"] for r in rows],
            numeric={4, 5},
            prose={6},
            caption="Failed expectations, critical first.",
            more=more,
        )
        if rows
        else Table(["result"], [[f"All {s['expectations']:,} expectations on {s['tables']:,} tables held."]])
    )
    per_table = latest.groupBy("table_name").agg(
        F.count(F.lit(1)).alias("expectations"),
        F.sum(F.when(F.col("success"), 0).otherwise(1)).alias("failed"),
        F.max("rows").alias("rows"),
    ).orderBy(F.desc("failed"), "table_name")
    tables, more = _limited(per_table, settings.report.max_rows)
    section.tables.append(
        Table(["table", "expectations", "failed", "rows"],
              [[t["table_name"], _fmt(t["expectations"]), _fmt(t["failed"]), _fmt(t["rows"])] for t in tables],
              numeric={1, 2, 3}, caption="Per table.", more=more)
    )
    return section


# ----------------------------------------------------------------------------- the page

SECTIONS = (dispatch_section, cursor_section, alert_section, producer_section, quarantine_section, quality_section)
# The tables the report reads, listed with their Delta versions at the foot of the page.
SOURCE_TABLES = (
    "dispatch_daily", "dispatch_periods", "cursor_ranges", "hole_alerts", "alert_notifications",
    "producer_lint", "producer_health", "quarantine", "validation_results",
)


def render_html(day: date, sections: list[Section], headline: list[Number], sources: list[tuple[str, str]]) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("brokerlens.deliver", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2").render(
        day=day.isoformat(),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        headline=headline,
        sections=sections,
        sources=sources,
    )


def _source_versions() -> list[tuple[str, str]]:
    out = []
    for name in SOURCE_TABLES:
        if name in table_schemas():
            version = table_version(name)
            out.append((name, "not written yet" if version is None else f"version {version}"))
    return out


def report_day(day: date, settings: Settings) -> StageResult:
    """Write the day's HTML report; the result says where it is."""
    result = StageResult("report", day)
    headline: list[Number] = []
    sections = []
    with progress(f"report {day}", total=len(SECTIONS), unit="sections") as step:
        for build in SECTIONS:
            section = build(day, settings, headline)
            step.note(f"{section.id} ({len(section.charts)} charts)")
            step.advance()
            sections.append(section)
    html = render_html(day, sections, headline, _source_versions())
    path = report_path(day, settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: the file a mail links to is never half written.
    partial = path.with_suffix(".html.partial")
    partial.write_text(html, encoding="utf-8")
    partial.replace(path)
    result.metrics.update(
        sections=len(sections),
        charts=sum(len(s.charts) for s in sections),
        empty_sections=sum(s.empty is not None for s in sections),
        bytes=len(html.encode("utf-8")),
    )
    result.lines.append(f"report: {path}")
    result.lines += [f"{n.label}: {n.value}" for n in headline]
    return result
