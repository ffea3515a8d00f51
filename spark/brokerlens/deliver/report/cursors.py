"""Report section "Closest to the unacked-range cap": subscriptions by acknowledged ranges after
markDeletePosition against managedLedgerMaxUnackedRangesToPersist, the entries exposed to
redelivery, and each top subscription's trend towards the cap."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.frames import rows_frame
from brokerlens.platform.tables import read_table
from brokerlens.platform.times import collect, first

from .blocks import SUBSCRIPTION, Number, Section, Table, day_rows, fmt, fmt_bytes, hhmm, limited, pct, short_topic
from .charts import cursor_chart

CURSOR_BUCKET_SECONDS = 600


def cursor_section(spark: SparkSession, day: date, settings: DeliverStepSettings, headline: list[Number]) -> Section:
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

    today = day_rows(spark, "cursor_ranges", day, settings)
    by_sub = Window.partitionBy(*SUBSCRIPTION)
    last = (
        today.withColumn("_n", F.row_number().over(by_sub.orderBy(F.desc("snapshot_at"))))
        .withColumn("peak", F.max("ranges").over(by_sub))
        .withColumn("peak_over_cap", F.max("over_cap").over(by_sub))
        .where(F.col("_n") == 1)
        .withColumn("share_of_cap", F.col("ranges") / F.col("cap"))
    )
    s = first(
        last.agg(
            F.count(F.lit(1)).alias("subscriptions"),
            F.sum(F.when(F.col("peak_over_cap") > 0, 1).otherwise(0)).alias("over_cap"),
            F.sum(F.when(F.col("peak") >= settings.alerts.warning_ranges, 1).otherwise(0)).alias("over_warning"),
            F.max("peak").alias("max_ranges"),
            F.sum("exposure_entries").alias("exposure"),
        )
    )
    if not s["subscriptions"]:
        section.empty = f"No cursor data for {day}: cursor_ranges has no rows for this day."
        headline.append(Number("subscriptions over the cap", "no data"))
        return section
    section.numbers = [
        Number("subscriptions measured", fmt(s["subscriptions"])),
        Number("over the cap (peak)", fmt(s["over_cap"]), "bad" if s["over_cap"] else "good"),
        Number(f"at or over {settings.alerts.warning_ranges:,} ranges (peak)", fmt(s["over_warning"]), "bad" if s["over_warning"] else ""),
        Number("most ranges (peak)", fmt(s["max_ranges"])),
        Number("entries exposed to redelivery (last snapshot)", fmt(s["exposure"] or 0), "bad" if s["exposure"] else ""),
    ]
    headline += [section.numbers[1], section.numbers[3]]

    alerts = day_rows(spark, "hole_alerts", day, settings).select(*SUBSCRIPTION, "warning_threshold")
    ranked = (
        last.where(F.col("ranges") > 0)
        .join(alerts, list(SUBSCRIPTION), "left")
        .orderBy(F.desc("share_of_cap"), F.asc_nulls_last("hours_to_cap"), *SUBSCRIPTION)
        .select(
            "*",
            F.unix_timestamp("snapshot_at").alias("last_epoch"),
            F.unix_timestamp("forecast_cap_at").alias("forecast_epoch"),
        )
    )
    rows, more = limited(ranked, settings.report.max_rows)
    if not rows:
        section.tables.append(Table(["result"], [[f"No subscription had acknowledged ranges (holes) on {day}."]]))
        return section
    section.tables.append(
        Table(
            [
                "subscription",
                "type",
                "ranges (last)",
                "ranges (peak)",
                "cap",
                "of cap",
                "over cap",
                "exposure (entries)",
                "persisted as (mode)",
                "serialized",
                "growth /h",
                "hours to cap",
                "cap reached (UTC)",
            ],
            [
                [
                    f"{short_topic(r['topic'])} · {r['subscription']}",
                    r["subscription_type"] or "—",
                    fmt(r["ranges"]),
                    fmt(r["peak"]),
                    fmt(r["cap"]),
                    pct(r["share_of_cap"]),
                    fmt(r["over_cap"]),
                    fmt(r["exposure_entries"]),
                    f"{r['persisted_as'] or '—'} ({r['persist_mode'] or '—'})",
                    fmt_bytes(r["serialized_bytes"]) + (" (est.)" if r["serialized_bytes_source"] != "reported" else ""),
                    fmt(r["growth_per_hour"], 1),
                    fmt(r["hours_to_cap"], 1),
                    hhmm(r["forecast_cap_at"]),
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
    top_df = rows_frame(spark, [tuple(r[k] for k in SUBSCRIPTION) for r in top], today.select(*SUBSCRIPTION).schema)
    buckets = collect(
        read_table("cursor_ranges", spark=spark, settings=settings)
        .where(F.col("day").between(F.lit(first_day), F.lit(day)) & F.col("ranges").isNotNull())
        .join(F.broadcast(top_df), list(SUBSCRIPTION))
        .withColumn(
            "bucket",
            F.floor(F.unix_timestamp("snapshot_at") / CURSOR_BUCKET_SECONDS) * CURSOR_BUCKET_SECONDS,
        )
        .groupBy(*SUBSCRIPTION, "bucket")
        .agg(F.max("ranges").alias("ranges"))
    )
    series: dict[tuple, list] = {}
    for b in buckets:
        series.setdefault(tuple(b[k] for k in SUBSCRIPTION), []).append((int(b["bucket"]), b["ranges"]))
    window = (
        datetime(first_day.year, first_day.month, first_day.day, tzinfo=timezone.utc),
        datetime(day.year, day.month, day.day, tzinfo=timezone.utc) + timedelta(days=1, hours=settings.alerts.horizon_hours),
    )
    for r in top:
        section.charts.append(
            cursor_chart(
                f"{short_topic(r['topic'])} · {r['subscription']}",
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
