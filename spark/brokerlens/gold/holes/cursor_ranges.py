"""Gold `cursor_ranges`: unacked ranges (holes) per cursor snapshot against the persistence cap.

A cursor's progress is ``markDeletePosition`` plus ``individuallyDeletedMessages``, the acknowledged
ranges after it, written by Pulsar as ``[(3:4..3:6], (3:7..3:9]]`` (open below, closed above).
Only part of them is persisted: past the cap ``managedLedgerMaxUnackedRangesToPersist``,
acknowledgements are lost on a topic reload and those entries are delivered again.

How the cursor ledger holds the state depends on ``managedLedgerPersistIndividualAckAsLongArray``
(``persist_mode``, from Pulsar's ``ManagedCursorImpl``, checked against a live broker):

* ranges: ``PositionInfo.individualDeletedMessages``, the first ``cap + 1`` ranges in position order
  (the loop adds a range, then stops once it holds more than ``cap``); later ranges are exposed.
* long-array: ``OpenLongPairRangeSet.toRanges(cap)`` walks the ledgers in id order and keeps a
  ledger while the acknowledged entries of the ledgers before it (bitset cardinalities, not
  ranges) number at most ``cap``: the first ledger is always kept, and every ledger after the
  first one past that count is left out (exposed). Each kept ledger is a ``LongListMap``: its
  bitset as 64-bit words from entry 0 to its last acknowledged entry, so the size grows with the
  entry span, not the holes. If the entry exceeds BookKeeper's frame limit the ledger write fails
  and the metadata store gets the first ``cap + 1`` ranges.

A crash recovers the cursor ledger's last entry (``exposure_entries``). A graceful close (topic
unload, broker shutdown) goes through ``persistPositionWhenClosing``: with at most
``managedLedgerMaxUnackedRangesToPersistInMetadataStore`` ranges it writes the ranges, always in
range format and cut at ``cap + 1``, to the metadata store, whatever the mode; with more it
writes the cursor ledger as above (``unload_exposure_entries``).
"""

from __future__ import annotations

from datetime import date, datetime, time, timezone

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from brokerlens.gold.holes.settings import AlertSettings
from brokerlens.platform.jars import GROWTH_SLOPES_FUNCTION

from .persistence import KEY, LONG_ARRAY, METADATA_STORE, RANGES, SNAPSHOT_KEY, with_persistence
from .ranges import with_range_stats

# A cursor-ledger entry larger than BookKeeper's nettyMaxFrameSizeBytes fails to be written: Pulsar's
# default is maxMessageSize (5 MiB) + MESSAGE_SIZE_FRAME_PADDING (10 KiB) (PR #7116).
ENTRY_LIMIT_BYTES = 5 * 1024 * 1024 + 10 * 1024
# About 200,000 ranges serialize to the 5 MB (5 MiB, Pulsar's maxMessageSize) limit.
ESTIMATED_BYTES_PER_RANGE = 5 * 1024 * 1024 / 200_000
# Forecasts further out than this are not a date anyone acts on (and would overflow timestamps).
MAX_FORECAST_HOURS = 10 * 365 * 24.0


def parsed_snapshots(snapshots: DataFrame, policies: DataFrame, metrics: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    """The day's cursor_snapshots with the persistence settings in force (``policies``,
    ``metrics``: as :func:`~.persistence.with_persistence` takes them) and the stats of their
    ranges (:func:`~.ranges.with_range_stats`): what :func:`cursor_ranges_frame` reads."""
    return with_range_stats(with_persistence(snapshots, policies, metrics, day, alerts))


def cursor_ranges_frame(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(cursor_ranges rows without growth, malformed snapshots) for :func:`parsed_snapshots`'
    rows; both read ``parsed`` (a caller that has not persisted it computes it twice)."""
    has_string = F.col("individually_deleted_messages").isNotNull()
    joined = parsed.withColumn(
        "ranges_malformed",
        has_string & (~F.col("outline_ok") | (F.coalesce(F.col("bad_ranges"), F.lit(0)) > 0)),
    )
    parsed_ok = has_string & ~F.col("ranges_malformed")
    # An empty set `[]` explodes to nothing: zero ranges, zero entries.
    zero = F.lit(0).cast("bigint")
    no_ranges = F.col("ranges_parsed").isNull()
    ranges = F.when(parsed_ok, F.coalesce("ranges_parsed", zero)).otherwise(F.col("ranges_reported"))
    reported_source = (
        F.when(F.col("ranges_source") == "internal-stats", F.lit("totalNonContiguousDeletedMessagesRange"))
        .when(F.col("ranges_source") == "metrics", F.lit("pulsar_ml_cursor_nonContiguousDeletedMessagesRange"))
        .otherwise(F.lit("nonContiguousDeletedMessagesRanges"))
    )
    # What the cursor ledger holds after this snapshot (see the module docstring); in long-array mode
    # unknown without the parsed ranges. Pulsar's reported serialized size is the range encoding's.
    long_array = F.col("persist_mode") == LONG_ARRAY
    persisted_as = (
        F.when(~long_array, F.lit(RANGES))
        .when(~parsed_ok, F.lit(None))
        .when(no_ranges | (F.col("long_array_ledgers") == 0), F.lit(RANGES))
        .when(F.col("long_array_bytes") > ENTRY_LIMIT_BYTES, F.lit(METADATA_STORE))
        .when(F.col("long_array_ledgers") > 0, F.lit(LONG_ARRAY))
    )
    range_exposure = F.when(no_ranges, zero).otherwise(F.col("exposure_entries"))
    exposure = F.when(F.col("persisted_as") == LONG_ARRAY, F.col("long_array_exposure")).when(F.col("persisted_as").isNotNull(), range_exposure)
    closes_to_store = ranges <= F.col("metadata_store_cap")
    long_array_size = F.col("persisted_as").isin(LONG_ARRAY, METADATA_STORE)
    out = joined.withColumn("persisted_as", persisted_as).select(
        "day",
        "snapshot_at",
        "cluster",
        "broker",
        "namespace",
        "topic",
        "subscription",
        "subscription_type",
        "mark_delete_position",
        ranges.alias("ranges"),
        F.when(parsed_ok, F.lit("individuallyDeletedMessages")).otherwise(reported_source).alias("ranges_source"),
        "ranges_reported",
        "ranges_malformed",
        "cap",
        "cap_source",
        F.greatest(ranges - F.col("cap"), zero).alias("over_cap"),
        "persist_mode",
        "persist_mode_source",
        "persisted_as",
        F.when(parsed_ok & long_array, F.coalesce("long_array_ledgers", F.when(no_ranges, F.lit(0)))).alias("long_array_ledgers"),
        "metadata_store_cap",
        closes_to_store.alias("closes_to_metadata_store"),
        F.when(parsed_ok, exposure).alias("exposure_entries"),
        F.when(parsed_ok, F.when(closes_to_store, range_exposure).otherwise(exposure)).alias("unload_exposure_entries"),
        F.when(parsed_ok, F.when(no_ranges, zero).otherwise(F.col("acked_entries"))).alias("acked_entries"),
        F.when(long_array_size, F.col("long_array_bytes"))
        .otherwise(F.coalesce(F.col("serialized_size_reported"), F.round(ranges * ESTIMATED_BYTES_PER_RANGE).cast("bigint")))
        .alias("serialized_bytes"),
        F.when(long_array_size, F.lit("estimated-long-array"))
        .when(F.col("serialized_size_reported").isNotNull(), F.lit("reported"))
        .otherwise(F.lit("estimated"))
        .alias("serialized_bytes_source"),
        F.when(parsed_ok, F.coalesce("ledgers", F.lit(0))).alias("ledgers"),
        F.when(parsed_ok, F.coalesce("max_ranges_per_ledger", zero)).alias("max_ranges_per_ledger"),
        F.when(parsed_ok, F.coalesce("ranges_per_ledger", F.create_map().cast("map<bigint,bigint>"))).alias("ranges_per_ledger"),
        "msg_delayed",
        "unacked_messages",
        "msg_backlog",
        "consumers",
    )
    malformed = joined.filter("ranges_malformed").select(
        "day",
        "snapshot_at",
        "cluster",
        "topic",
        "subscription",
        "source_file",
        "outline_ok",
        "bad_ranges",
        "ranges_reported",
        F.col("individually_deleted_messages").alias("raw"),
    )
    return out, malformed


def with_growth(today: DataFrame, previous: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    """Growth (least-squares slope, ranges per hour) over the window ending at each snapshot, and
    the forecast time to the cap. ``previous`` holds earlier snapshots (key, snapshot_at, ranges)
    so that the first snapshots of the day have a history."""
    origin = datetime.combine(day, time(), tzinfo=timezone.utc)
    hours = (F.unix_micros("snapshot_at") - F.lit(int(origin.timestamp() * 1_000_000))) / F.lit(3.6e9)
    points = today.select(*SNAPSHOT_KEY, "ranges").unionByName(previous.select(*SNAPSHOT_KEY, "ranges"))
    # Each cursor's frames (its last growth_window_hours at every snapshot) folded in one call, in a
    # tight loop (GrowthSlopes.scala): a window's range frame re-folds each frame through Spark's
    # generic aggregate machinery, a cost that grows with the day's snapshots times the window's.
    # The slope is fitted on hours; frames are bounded in microseconds.
    point = F.struct(F.unix_micros("snapshot_at").alias("at_us"), hours.alias("x"), F.col("ranges"))
    window_us = F.lit(int(alerts.growth_window_hours * 3.6e9)).cast("bigint")
    folded = F.call_function(GROWTH_SLOPES_FUNCTION, F.collect_list(point), window_us)
    # One row per cursor and instant, joined back to the day's snapshots.
    slopes = points.groupBy(*KEY).agg(folded.alias("_growth")).select(*KEY, F.inline("_growth"))
    enough = F.col("growth_snapshots") >= alerts.growth_min_snapshots
    grown = (
        today.withColumn("at_us", F.unix_micros("snapshot_at"))
        .join(slopes, [*KEY, "at_us"])
        .withColumn("growth_per_hour", F.when(enough, F.col("slope")))
        .drop("slope", "at_us")
    )
    hours_to_cap = F.when(F.col("ranges") >= F.col("cap"), F.lit(0.0)).when(
        F.col("growth_per_hour") > 0, (F.col("cap") - F.col("ranges")) / F.col("growth_per_hour")
    )
    forecast_at = F.when(
        F.col("hours_to_cap") <= MAX_FORECAST_HOURS,
        F.timestamp_micros(F.unix_micros("snapshot_at") + (F.col("hours_to_cap") * 3.6e9).cast("bigint")),
    )
    return grown.withColumn("hours_to_cap", hours_to_cap).withColumn("forecast_cap_at", forecast_at)
