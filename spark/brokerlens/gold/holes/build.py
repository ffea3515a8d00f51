"""The holes build step: the day's ``cursor_ranges`` (with growth over the window reaching into
yesterday), quarantine rows for malformed ``individuallyDeletedMessages``, then ``hole_alerts``
and ``reload_events``."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.gold.brokers import version_metrics
from brokerlens.gold.holes.settings import HolesStepSettings
from brokerlens.platform.spark import persisted
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import WriteResult, read_table, write_table

from .alerts import hole_alerts_frame
from .cursor_ranges import cursor_ranges_frame, parsed_snapshots, with_growth
from .persistence import SNAPSHOT_KEY
from .reloads import reload_events_frame

QUARANTINE_RAW_CHARS = 64 * 1024


def _quarantine_rows(malformed: DataFrame, day: date) -> DataFrame:
    detail = F.concat(
        F.lit("individuallyDeletedMessages of "),
        F.col("topic"),
        F.lit(" subscription "),
        F.col("subscription"),
        F.lit(" at "),
        F.date_format("snapshot_at", "yyyy-MM-dd'T'HH:mm:ss'Z'"),
        F.lit(": "),
        F.when(
            ~F.col("outline_ok"),
            F.lit("not a list of (ledger:entry..ledger:entry] ranges in [ ], separated by commas"),
        ).otherwise(F.concat(F.col("bad_ranges").cast("string"), F.lit(" range(s) empty, overlapping or out of order"))),
        F.lit("; ranges fall back to the reported count "),
        F.coalesce(F.col("ranges_reported").cast("string"), F.lit("(none reported)")),
    )
    return malformed.select(
        F.lit(day).alias("day"),
        F.lit("build").alias("stage"),
        F.lit("cursor_ranges").alias("kind"),
        "source_file",
        F.lit(None).cast("int").alias("line"),
        F.lit("malformed-ranges").alias("reason"),
        detail.alias("detail"),
        F.substring("raw", 1, QUARANTINE_RAW_CHARS).alias("raw"),
        F.current_timestamp().alias("ingested_at"),
    )


def replace_quarantine(spark: SparkSession, rows: DataFrame, day: date, stage: str, kind: str, settings: HolesStepSettings) -> WriteResult:
    """Replace this (day, stage, kind)'s quarantine rows, keeping other kinds of the same stage."""
    others = read_table("quarantine", spark=spark, settings=settings).filter((F.col("day") == F.lit(day)) & (F.col("stage") == stage) & (F.col("kind") != kind))
    return write_table(others.unionByName(rows), "quarantine", mode="replace", partitions=[{"day": day, "stage": stage}], settings=settings)


def build_holes(spark: SparkSession, day: date, settings: HolesStepSettings) -> StageResult:
    from brokerlens.platform.schemas import table_schema

    result = StageResult("holes", day)
    alerts = settings.alerts
    on_day = F.col("day") == F.lit(day)
    snapshots = read_table("cursor_snapshots", spark=spark, settings=settings).filter(on_day)
    policies = read_table("bronze_policies", spark=spark, settings=settings).where(F.col("day") <= F.lit(day))
    # Read twice by cursor_ranges_frame, and again for the malformed ones' quarantine rows; kept
    # on local disk, as land keeps its parsed rows (range strings can be megabytes).
    parsing = parsed_snapshots(snapshots, policies, version_metrics(spark, day, settings), day, alerts)
    with persisted(parsing, StorageLevel.DISK_ONLY) as parsed:
        rows, _ = cursor_ranges_frame(parsed)
        window_start = datetime.combine(day, time(), tzinfo=timezone.utc) - timedelta(hours=alerts.growth_window_hours)
        previous = read_table("cursor_ranges", spark=spark, settings=settings).filter(
            (F.col("day") == F.lit(day - timedelta(days=1))) & (F.col("snapshot_at") >= F.lit(window_start))
        )
        cursor_ranges = with_growth(rows, previous, day, alerts).select(*table_schema("cursor_ranges").column_names)
        result.writes.append(write_table(cursor_ranges, "cursor_ranges", mode="replace", partitions=[{"day": day}], settings=settings))
        built = read_table("cursor_ranges", spark=spark, settings=settings).filter(on_day)

        # Only the few malformed snapshots' ranges are looked at again, for the quarantine's detail and
        # raw text (and a re-run that finds none clears the earlier rows).
        bad_keys = built.filter("ranges_malformed").select(*SNAPSHOT_KEY)
        result.metrics["malformed_ranges"] = bad_keys.count()
        quarantined_before = read_table("quarantine", spark=spark, settings=settings).filter(
            on_day & (F.col("stage") == "build") & (F.col("kind") == "cursor_ranges")
        )
        if result.metrics["malformed_ranges"] or not quarantined_before.isEmpty():
            _, malformed = cursor_ranges_frame(parsed.join(bad_keys, SNAPSHOT_KEY, "left_semi"))
            result.writes.append(replace_quarantine(spark, _quarantine_rows(malformed, day), day, "build", "cursor_ranges", settings))

    hole_alerts = hole_alerts_frame(
        built,
        read_table("hole_alerts", spark=spark, settings=settings).filter(F.col("day") == F.lit(day - timedelta(days=1))),
        read_table("alert_notifications", spark=spark, settings=settings).filter(F.col("status") == "sent"),
        day,
        alerts,
    )
    result.writes.append(write_table(hole_alerts, "hole_alerts", mode="replace", partitions=[{"day": day}], settings=settings))
    counts = read_table("hole_alerts", spark=spark, settings=settings).filter(on_day).groupBy("severity", "state").count().collect()
    for r in sorted(counts, key=lambda r: (r["severity"] or "", r["state"])):
        result.metrics[f"alerts_{r['severity'] or 'none'}_{r['state']}"] = r["count"]
    # Reloads: the previous day's snapshots give the first one of the day its predecessor.
    days = (F.col("day") >= F.lit(day - timedelta(days=1))) & (F.col("day") <= F.lit(day))
    reloads = reload_events_frame(
        read_table("cursor_ranges", spark=spark, settings=settings).filter(days),
        read_table("bronze_topic_stats", spark=spark, settings=settings).filter(days),
        read_table("bronze_internal_stats", spark=spark, settings=settings).filter(days),
        day,
    ).select(*table_schema("reload_events").column_names)
    result.writes.append(write_table(reloads, "reload_events", mode="replace", partitions=[{"day": day}], settings=settings))
    lost = (
        read_table("reload_events", spark=spark, settings=settings)
        .filter(on_day)
        .agg(F.count("*").alias("n"), F.sum(F.col("lost_acknowledgements").cast("int")).alias("lost"))
        .first()
    )
    result.metrics["reloads"], result.metrics["reloads_lost_acks"] = lost["n"], lost["lost"] or 0
    if result.metrics["malformed_ranges"]:
        result.lines.append(
            f"{result.metrics['malformed_ranges']} cursor snapshots with malformed individuallyDeletedMessages "
            "quarantined (reason malformed-ranges); their range count is the reported one"
        )
    return result
