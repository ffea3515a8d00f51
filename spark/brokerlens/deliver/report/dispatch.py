"""Report section "Over-delivery and debt": the dispatch scopes (broker, topic, subscription) that
went over dispatchThrottlingRate*, with the debt Pulsar carried into the following periods and
per-minute charts of the worst ones."""

from __future__ import annotations

from datetime import date, datetime, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.frames import rows_frame
from brokerlens.platform.times import collect, first

from .blocks import Number, Section, Table, day_rows, fmt, fmt_bytes, limited, pct, short_topic
from .charts import dispatch_chart

# The columns that name a dispatch scope (dispatch_periods, dispatch_daily, debt_state).
SCOPE = ("level", "cluster", "broker", "topic", "subscription")


def scope_label(level: str, broker: str | None, topic: str | None, subscription: str | None) -> str:
    """The scope without its level: broker address, topic partition, or partition · subscription."""
    if level == "broker":
        return broker or "—"
    if level == "topic":
        return short_topic(topic)
    return f"{short_topic(topic)} · {subscription}"


def _epoch(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp())


def _null_safe_join(left: DataFrame, right: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Join on key columns that may be null (broker-level scopes have no topic)."""
    r = right.select(*[F.col(k).alias(f"_k_{k}") for k in keys], *[c for c in right.columns if c not in keys])
    cond = None
    for k in keys:
        term = left[k].eqNullSafe(r[f"_k_{k}"])
        cond = term if cond is None else cond & term
    return left.join(F.broadcast(r), cond).drop(*[f"_k_{k}" for k in keys])


def _scrape_note(rows: list) -> str:
    """Scopes measured only from counters at scrape grain: what they say is a lower bound."""
    scraped = [scope_label(r["level"], r["broker"], r["topic"], r["subscription"]) for r in rows if r["grain"] != "period"]
    if not scraped:
        return ""
    return (
        f" From scrape-grain counters (topic stats or /metrics, not per period): {', '.join(scraped)}; "
        "over-delivery over a scrape interval (e.g. 60 s) is a lower bound of the per-period figure."
    )


def dispatch_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
    section = Section(
        "dispatch",
        "Over-delivery and debt",
        "Scopes whose dispatch went over the quota in force (dispatchThrottlingRate*), worst first. "
        "Pulsar charges the excess to the following periods as debt; a scope with no allowance left "
        "is starved. Charts: over-delivery per minute and the debt carried out, for the worst scopes.",
    )
    daily = day_rows(spark, "dispatch_daily", day, settings, keep=True)
    s = first(
        daily.agg(
            F.count(F.lit(1)).alias("scopes"),
            F.sum(F.when(F.col("periods_over") > 0, 1).otherwise(0)).alias("scopes_over"),
            F.sum("periods_over").alias("periods_over"),
            F.sum("excess_msgs").alias("excess_msgs"),
            F.sum("excess_bytes").alias("excess_bytes"),
            F.max("max_debt_msgs").alias("max_debt_msgs"),
            F.sum("periods_starved").alias("periods_starved"),
        )
    )
    if not s["scopes"]:
        section.empty = f"No dispatch data for {day}: dispatch_daily has no rows for this day."
        headline.append(Number("scopes over quota", "no data"))
        return section
    section.numbers = [
        Number("scopes measured", fmt(s["scopes"])),
        Number("scopes over quota", fmt(s["scopes_over"]), "bad" if s["scopes_over"] else "good"),
        Number("periods over quota", fmt(s["periods_over"])),
        Number("messages over quota", fmt(s["excess_msgs"])),
        Number("bytes over quota", fmt_bytes(s["excess_bytes"])),
        Number("largest debt (messages)", fmt(s["max_debt_msgs"])),
        Number("periods starved by debt", fmt(s["periods_starved"]), "bad" if s["periods_starved"] else ""),
    ]
    headline += [section.numbers[1], section.numbers[3], section.numbers[6]]

    worst = daily.where((F.col("periods_over") > 0) | (F.col("periods_starved") > 0)).orderBy(
        F.desc("excess_msgs"), F.desc("excess_bytes"), F.desc("periods_starved"), *SCOPE
    )
    rows, more = limited(worst, settings.report.max_rows)
    if not rows:
        section.tables.append(Table(["result"], [[f"Every scope stayed within its quota on {day}."]]))
        return section
    section.tables.append(
        Table(
            [
                "level",
                "scope",
                "periods over",
                "msgs over",
                "bytes over",
                "max debt msgs",
                "max debt bytes",
                "starved",
                "closing debt msgs",
                "limiter",
                "allowance used up / Pulsar throttled (msg, byte events)",
                "causes (share of msgs over)",
            ],
            [
                [
                    r["level"],
                    scope_label(r["level"], r["broker"], r["topic"], r["subscription"]),
                    fmt(r["periods_over"]),
                    fmt(r["excess_msgs"]),
                    fmt_bytes(r["excess_bytes"]),
                    fmt(r["max_debt_msgs"]),
                    fmt_bytes(r["max_debt_bytes"]),
                    fmt(r["periods_starved"]),
                    fmt(r["closing_debt_msgs"]),
                    r["limiter_model"],
                    f"{fmt(r['periods_exhausted'])} / {fmt(r['pulsar_throttled_msg_events'])}, {fmt(r['pulsar_throttled_bytes_events'])}",
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
    top_df = rows_frame(spark, [tuple(r[k] for k in SCOPE) for r in top], daily.select(*SCOPE).schema)
    minutes = collect(
        _null_safe_join(day_rows(spark, "dispatch_periods", day, settings), top_df, SCOPE)
        .withColumn("minute", F.floor((F.unix_timestamp("period_start") - _epoch(day)) / 60).cast("int"))
        .groupBy(*SCOPE, "minute")
        .agg(
            F.sum("over_msgs").alias("over_msgs"),
            F.max("debt_out_msgs").alias("debt_msgs"),
            F.sum("over_bytes").alias("over_bytes"),
            F.max("debt_out_bytes").alias("debt_bytes"),
        )
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
        f"{name} {pct(r[col])}"
        for name, col in (("batch", "share_batch_msgs"), ("redelivery", "share_redelivery_msgs"), ("other", "share_other_msgs"))
        if r[col]
    ]
    main = f"main: {r['main_cause']}" if r["main_cause"] else ""
    return "; ".join(p for p in (main, ", ".join(shares)) if p) or "—"
