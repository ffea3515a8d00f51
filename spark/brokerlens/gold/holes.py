"""Gold `cursor_ranges` and `hole_alerts`: unacked ranges (holes) against the persistence cap.

A cursor's progress is ``markDeletePosition`` plus ``individuallyDeletedMessages``, the acknowledged
ranges after it, written by Pulsar as ``[(3:4..3:6], (3:7..3:9]]`` (open below, closed above).
Only the first ``managedLedgerMaxUnackedRangesToPersist`` ranges are persisted (seed 004): past the
cap, acknowledgements are lost on a topic reload and those entries are delivered again.

How the cursor ledger holds the state depends on ``managedLedgerPersistIndividualAckAsLongArray``
(``persist_mode``, README "Ack-state persistence modes", from Pulsar's ``ManagedCursorImpl``):

* ranges: ``PositionInfo.individualDeletedMessages``, the first ``cap`` ranges in position order;
  the entries in later ranges are exposed.
* long-array (default from 4.1): ``OpenLongPairRangeSet.toRanges(cap)`` walks the ledgers in id
  order and keeps a ledger while the running count of acknowledged entries (the ledger bitset's
  cardinality, not its ranges) stays within ``cap``; the first ledger past it and every later one
  are left out (exposed). Each kept ledger is a ``LongListMap``: its bitset as 64-bit words from
  entry 0 to its last acknowledged entry, so the size grows with the entry span, not the holes.
  If no ledger fits, Pulsar writes ranges instead; if the entry exceeds BookKeeper's frame limit
  the ledger write fails and the metadata store gets the first ``cap`` ranges.

The range string can hold hundreds of thousands of ranges (megabytes in one field). It is parsed
with Spark SQL functions only (regexp_extract_all, posexplode, aggregates), whose cost grows
linearly with its length, and it never reaches the driver.
"""

from __future__ import annotations

import logging
from datetime import date, datetime, time, timedelta, timezone

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.platform.settings import AlertOverride, AlertSettings, Settings
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, write_table

from .brokers import version_choice, version_metrics

log = logging.getLogger(__name__)

CAP_KEY = "managedLedgerMaxUnackedRangesToPersist"
METADATA_STORE_CAP_KEY = "managedLedgerMaxUnackedRangesToPersistInMetadataStore"
LONG_ARRAY_KEY = "managedLedgerPersistIndividualAckAsLongArray"
# ServiceConfiguration: a cursor closing with at most this many ranges is written to the metadata store.
DEFAULT_METADATA_STORE_CAP = 1000
# PR #23888: managedLedgerPersistIndividualAckAsLongArray defaults to true from 4.1 (false before).
LONG_ARRAY_SINCE = (4, 1)
RANGES, LONG_ARRAY, METADATA_STORE = "ranges", "long-array", "metadata-store"
# A cursor-ledger entry larger than BookKeeper's nettyMaxFrameSizeBytes fails to be written: Pulsar's
# default is maxMessageSize (5 MiB) + MESSAGE_SIZE_FRAME_PADDING (10 KiB) (PR #7116).
ENTRY_LIMIT_BYTES = 5 * 1024 * 1024 + 10 * 1024
# LongListMap.values is a proto2 `repeated int64` (not packed): a tag byte + a varint per word. A
# word of entries all unacknowledged is 0 (1-byte varint); a word whose top entry is acknowledged is
# negative as int64 (10-byte varint), the bound used for every word from the first acknowledged one.
ZERO_WORD_BYTES, WORD_BYTES = 1 + 1, 1 + 10
# One range as Pulsar prints it: (lowerLedger:lowerEntry..upperLedger:upperEntry]. Entry ids can be
# -1 (the position before a ledger's first entry).
RANGE = r"\((-?\d+):(-?\d+)\.\.(-?\d+):(-?\d+)\]"
# Seed 004: about 200,000 ranges serialize to the 5 MB (5 MiB, Pulsar's maxMessageSize) limit.
ESTIMATED_BYTES_PER_RANGE = 5 * 1024 * 1024 / 200_000
QUARANTINE_RAW_CHARS = 64 * 1024
# Forecasts further out than this are not a date anyone acts on (and would overflow timestamps).
MAX_FORECAST_HOURS = 10 * 365 * 24.0
KEY = ["cluster", "topic", "subscription"]
SNAPSHOT_KEY = [*KEY, "snapshot_at"]

SEVERITY_RANK = {"forecast": 1, "warning": 2, "critical": 3}
# Seed 004's scenarios: why holes pile up for this kind of subscription and what to do about it.
HINTS = {
    "delayed-messages": (
        "Delayed messages: later messages whose delay expires first are acknowledged before "
        "earlier ones. Put delayed and normal messages on separate topics; keep delay times "
        "ordered (ideally increasing, e.g. a random-delay topic for up to 1 day plus fixed-delay "
        "topics), or send messages due on the same day to the same topic; make consumers idempotent."
    ),
    "key-shared": (
        "Key_Shared: messages of a slow or hot key cannot be dispatched while later keys are "
        "acknowledged. Scale consumers out quickly to avoid backlog, use many keys with an even "
        "distribution (no skewed or slow keys); make consumers idempotent."
    ),
    "exclusive-failover": (
        "Exclusive/Failover: the broker does not bound unacked messages here, so every message "
        "left unacknowledged leaves a hole. Use cumulative acknowledgement (acknowledgeCumulative); "
        "with individual acks make consumers idempotent, balance partitions and scale consumption "
        "(for Failover, more partitions help)."
    ),
    "shared-unacked": (
        "Shared: holes come from messages acknowledged out of order and are bounded by the max "
        "unacked messages (maxUnackedMessagesPerSubscription / maxUnackedMessagesPerConsumer); "
        "keep that bound below the cap and look for slow or stuck consumers and redeliveries."
    ),
    "unknown": (
        "Find slow or stuck consumers and messages acknowledged out of order; make consumers "
        "idempotent, since acknowledgements beyond the cap are lost on a topic reload."
    ),
}


# ------------------------------------------------------------------------------ settings → columns


def _override_chain(
    overrides: list[AlertOverride], field: str, fallback: Column, fallback_source: Column
) -> tuple[Column, Column]:
    """(value, source) of an alert setting per row: the most specific matching override wins."""
    specific = [o for o in overrides if getattr(o, field) is not None]
    # cluster+namespace before namespace before cluster; the first matching `when` wins.
    specific.sort(key=lambda o: (o.namespace is None, o.cluster is None))
    value, source = fallback, fallback_source
    for o in reversed(specific):
        cond = F.lit(True)
        if o.cluster is not None:
            cond = cond & (F.col("cluster") == o.cluster)
        if o.namespace is not None:
            cond = cond & (F.col("namespace") == o.namespace)
        label = "settings-namespace" if o.namespace is not None else "settings-cluster"
        value = F.when(cond, F.lit(getattr(o, field))).otherwise(value)
        source = F.when(cond, F.lit(label)).otherwise(source)
    return value, source


def broker_config_at(snapshots: DataFrame, day: date, keys: list[str]) -> DataFrame:
    """The broker.conf values in force at each snapshot: (snapshot key, one string column per key).

    Per key, the latest broker-config record that sets it (or removes the record) holds from its
    ``effective_at``; a record for the broker wins over a cluster-wide one (broker null), as in
    ``dispatch.limiter_models``. Records landed on earlier days stay in force, so every landing
    day up to ``day`` is read (the table is small).
    """
    policies = (
        read_table("bronze_policies")
        .filter((F.col("kind") == "broker-config") & (F.col("day") <= F.lit(day)))
        .select(
            F.col("cluster").alias("p_cluster"),
            F.col("broker").alias("p_broker"),
            "effective_at",
            "removed",
            "broker_config",
        )
    )
    matched = snapshots.select(*SNAPSHOT_KEY, "broker").join(
        F.broadcast(policies),
        (F.col("p_cluster") == F.col("cluster"))
        & (F.col("p_broker").isNull() | (F.col("p_broker") == F.col("broker")))
        & (F.col("effective_at") <= F.col("snapshot_at")),
    )
    ordering = F.struct(F.col("p_broker").isNotNull(), F.col("effective_at"))
    # max_by skips rows whose ordering is null: records that do not mention the key.
    sets = lambda key: F.col("removed") | F.map_contains_key("broker_config", F.lit(key))  # noqa: E731
    return matched.groupBy(*SNAPSHOT_KEY).agg(
        *(
            F.max_by(F.when(~F.col("removed"), F.col("broker_config")[k]), F.when(sets(k), ordering)).alias(k)
            for k in keys
        )
    )


def with_persistence(snapshots: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    """The persistence settings in force per snapshot: ``cap``/``cap_source`` (settings override >
    broker config > ``alerts.default_cap``), ``metadata_store_cap`` (broker config > 1,000) and
    ``persist_mode``/``persist_mode_source`` (settings ``alerts.persist_mode`` > broker config
    ``managedLedgerPersistIndividualAckAsLongArray`` > the broker's version, >= 4.1 long-array >
    ranges), chosen like the dispatch limiter model."""
    config = broker_config_at(snapshots, day, [CAP_KEY, METADATA_STORE_CAP_KEY, LONG_ARRAY_KEY])
    positive = lambda key: F.when(F.col(key).try_cast("bigint") > 0, F.col(key).try_cast("bigint"))  # noqa: E731
    flag = F.lower(F.trim(F.col(LONG_ARRAY_KEY)))
    versions = version_choice(version_metrics(day), day, LONG_ARRAY_SINCE, LONG_ARRAY, RANGES)
    df = (
        snapshots.join(config, SNAPSHOT_KEY, "left")
        .join(
            F.broadcast(versions),
            (F.col("cluster") == F.col("v_cluster")) & (F.col("broker") == F.col("v_broker")),
            "left",
        )
        .withColumn("policy_cap", positive(CAP_KEY))
        .withColumn("c_mode", F.when(flag == "true", F.lit(LONG_ARRAY)).when(flag == "false", F.lit(RANGES)))
    )
    fallback = F.coalesce(F.col("policy_cap"), F.lit(alerts.default_cap))
    fallback_source = F.when(F.col("policy_cap").isNotNull(), F.lit("broker-config")).otherwise(
        F.lit("default")
    )
    cap, source = _override_chain(alerts.overrides, "cap", fallback, fallback_source)
    if alerts.persist_mode != "auto":
        mode, mode_source = F.lit(alerts.persist_mode), F.lit("settings")
    else:
        mode = F.coalesce("c_mode", "v_choice", F.lit(RANGES))
        mode_source = (
            F.when(F.col("c_mode").isNotNull(), F.lit(f"broker-config {LONG_ARRAY_KEY}"))
            .when(F.col("v_choice").isNotNull(), F.col("v_source"))
            .otherwise(F.lit("default"))
        )
    return (
        df.withColumn("cap", cap.cast("bigint"))
        .withColumn("cap_source", source)
        .withColumn(
            "metadata_store_cap",
            F.coalesce(
                F.when(F.col(METADATA_STORE_CAP_KEY).try_cast("bigint") >= 0, F.col(METADATA_STORE_CAP_KEY).try_cast("bigint")),
                F.lit(DEFAULT_METADATA_STORE_CAP),
            ).cast("bigint"),
        )
        .withColumn("persist_mode", mode)
        .withColumn("persist_mode_source", mode_source)
        .drop(CAP_KEY, METADATA_STORE_CAP_KEY, LONG_ARRAY_KEY, "policy_cap", "c_mode",
              "v_cluster", "v_broker", "v_source", "v_choice")
    )


def with_alert_thresholds(df: DataFrame, alerts: AlertSettings) -> DataFrame:
    warning, _ = _override_chain(alerts.overrides, "warning_ranges", F.lit(alerts.warning_ranges), F.lit(""))
    horizon, _ = _override_chain(alerts.overrides, "horizon_hours", F.lit(alerts.horizon_hours), F.lit(""))
    return df.withColumn("warning_threshold", warning.cast("bigint")).withColumn(
        "horizon_hours", horizon.cast("double")
    )


# ------------------------------------------------------------------------------ range parsing


def parse_ranges(snapshots: DataFrame) -> DataFrame:
    """Per snapshot: the range string split into an array, and whether its outline is well formed.

    Well formed: ``[`` + ranges separated by commas + ``]`` (whitespace ignored). Checked without a
    backtracking pattern over the whole string: remove every range, and what remains must be
    exactly ``[`` + (n - 1) commas + ``]``.
    """
    # Pulsar before 2.x printed ranges with the two-dot leader U+2025 and a trailing ", ]".
    text = F.regexp_replace(F.col("individually_deleted_messages"), r"\s+", "")
    text = F.regexp_replace(F.regexp_replace(text, "\u2025", ".."), r",\]$", "]")
    matches = F.regexp_extract_all(text, F.lit(RANGE), 0)
    rest = F.regexp_replace(text, RANGE, "")
    expected = F.concat(F.lit("["), F.repeat(F.lit(","), F.greatest(F.size(matches) - 1, F.lit(0))), F.lit("]"))
    return snapshots.withColumn("range_list", matches).withColumn("outline_ok", rest == expected)


def _range_entries(lower_ledger: Column, lower_entry: Column, upper_ledger: Column, upper_entry: Column) -> Column:
    """Entries in (lower..upper]: b - a within a ledger; across ledgers the rest of the lower ledger,
    every ledger in between and entries 0..b of the upper ledger (null if a size is unknown)."""
    between = F.aggregate(
        F.map_values(F.map_filter("ledger_entries", lambda k, _: (k > lower_ledger) & (k < upper_ledger))),
        F.lit(0).cast("bigint"),
        lambda acc, x: acc + x,
    )
    across = (F.col("ledger_entries")[lower_ledger] - 1 - lower_entry) + between + (upper_entry + 1)
    return F.when(lower_ledger == upper_ledger, upper_entry - lower_entry).otherwise(across)


def _varint_bytes(x: Column) -> Column:
    """Bytes of a protobuf varint of a non-negative int64: 7 bits per byte, at most 9."""
    return F.lit(1) + sum((x >= F.lit(1 << (7 * k))).cast("int") for k in range(1, 9))


def _long_array(per_ledger: DataFrame) -> DataFrame:
    """Per ledger: ``kept`` by ``toRanges(cap)`` (the running count of acknowledged entries over the
    ledgers in id order, this one included, is within the cap; null when an entry count is unknown)
    and ``field_bytes``, its ``PositionInfo.individualDeletedMessageRanges`` field: a tag byte, the
    length, and the ``LongListMap`` (key tag + ledger id, then one word per 64 entry ids from entry 0
    to the last acknowledged one: words below the first acknowledged entry are 0)."""
    upto = Window.partitionBy(*SNAPSHOT_KEY).orderBy("ul").rowsBetween(Window.unboundedPreceding, 0)
    words = F.floor(F.col("last_acked") / 64) + 1
    zero_words = F.floor(F.col("first_acked") / 64)
    list_map = (
        F.lit(1) + _varint_bytes(F.col("ul"))
        + zero_words * ZERO_WORD_BYTES + (words - zero_words) * WORD_BYTES
    )
    return (
        per_ledger.withColumn(
            "kept",
            F.when(F.sum("entries_unknown").over(upto) == 0, F.sum("entries").over(upto) <= F.col("cap")),
        )
        .withColumn("_map", list_map.cast("bigint"))
        .withColumn("field_bytes", F.lit(1) + _varint_bytes(F.col("_map")) + F.col("_map"))
        .drop("_map")
    )


def range_stats(parsed: DataFrame) -> DataFrame:
    """Per snapshot with a well-formed outline: counts, entries and exposure from its ranges, and
    what the long-array format would keep (``long_array_*``).

    ``bad_ranges`` counts ranges that are empty or not strictly after the previous one (Pulsar
    prints them sorted and disjoint); any makes the string malformed. A range is counted in the
    ledger of its upper end: the long-array format needs Pulsar's open range set, whose ranges
    never span ledgers (only the older guava set prints such ranges).
    """
    exploded = parsed.filter(F.col("outline_ok")).select(
        *SNAPSHOT_KEY, "cap", "ledger_entries", F.posexplode("range_list").alias("pos", "r")
    )
    part = [F.regexp_extract("r", RANGE, i).cast("bigint") for i in (1, 2, 3, 4)]
    ll, le, ul, ue = (F.col(c) for c in ("ll", "le", "ul", "ue"))
    by_pos = Window.partitionBy(*SNAPSHOT_KEY).orderBy("pos")
    ranges = (
        exploded.select(
            *SNAPSHOT_KEY, "cap", "ledger_entries", "pos",
            *(p.alias(n) for p, n in zip(part, ("ll", "le", "ul", "ue"))),
        )
        .withColumn("prev_ul", F.lag("ul").over(by_pos))
        .withColumn("prev_ue", F.lag("ue").over(by_pos))
        .withColumn(
            "bad",
            ((ll > ul) | ((ll == ul) & (le >= ue)))
            | (F.col("prev_ul") > ll)
            | ((F.col("prev_ul") == ll) & (F.col("prev_ue") > le)),
        )
        .withColumn("entries", _range_entries(ll, le, ul, ue))
        # pos is 0-based: ranges at positions >= cap are the ones not persisted.
        .withColumn("beyond", F.col("pos") >= F.col("cap"))
    )
    per_ledger = ranges.groupBy(*SNAPSHOT_KEY, "ul").agg(
        F.max("cap").alias("cap"),
        F.min(F.when(ll == ul, le + 1).otherwise(0)).alias("first_acked"),
        F.max("ue").alias("last_acked"),
        F.count("*").alias("n"),
        F.sum(F.col("bad").cast("int")).alias("bad"),
        F.sum("entries").alias("entries"),
        F.sum(F.col("entries").isNull().cast("int")).alias("entries_unknown"),
        F.sum(F.when(F.col("beyond"), F.col("entries"))).alias("exposure"),
        F.sum((F.col("beyond") & F.col("entries").isNull()).cast("int")).alias("exposure_unknown"),
    )
    known = F.sum(F.col("kept").isNull().cast("int")) == 0
    return _long_array(per_ledger).groupBy(*SNAPSHOT_KEY).agg(
        F.sum("n").alias("ranges_parsed"),
        F.sum("bad").alias("bad_ranges"),
        F.when(F.sum("entries_unknown") == 0, F.sum("entries")).alias("acked_entries"),
        F.when(F.sum("exposure_unknown") == 0, F.coalesce(F.sum("exposure"), F.lit(0))).alias("exposure_entries"),
        F.count("*").cast("int").alias("ledgers"),
        F.max("n").alias("max_ranges_per_ledger"),
        F.map_from_entries(F.collect_list(F.struct("ul", "n"))).alias("ranges_per_ledger"),
        F.when(known, F.sum(F.col("kept").cast("int"))).alias("long_array_ledgers"),
        F.when(known, F.coalesce(F.sum(F.when(F.col("kept"), F.col("field_bytes"))), F.lit(0))).alias(
            "long_array_bytes"
        ),
        F.when(known, F.coalesce(F.sum(F.when(~F.col("kept"), F.col("entries"))), F.lit(0))).alias(
            "long_array_exposure"
        ),
    )


# ------------------------------------------------------------------------------ cursor_ranges


def cursor_ranges_frame(snapshots: DataFrame, day: date, alerts: AlertSettings) -> tuple[DataFrame, DataFrame]:
    """(cursor_ranges rows without growth, malformed snapshots) for the day's cursor_snapshots."""
    parsed = parse_ranges(with_persistence(snapshots, day, alerts))
    stats = range_stats(parsed)
    has_string = F.col("range_list").isNotNull()
    joined = parsed.join(stats, SNAPSHOT_KEY, "left").withColumn(
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
        .when(F.col("ranges_source") == "metrics", F.lit("brk_ml_cursor_nonContiguousDeletedMessagesRange"))
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
    exposure = F.when(F.col("persisted_as") == LONG_ARRAY, F.col("long_array_exposure")).when(
        F.col("persisted_as").isNotNull(), range_exposure
    )
    long_array_size = F.col("persisted_as").isin(LONG_ARRAY, METADATA_STORE)
    out = joined.withColumn("persisted_as", persisted_as).select(
        "day", "snapshot_at", "cluster", "broker", "namespace", "topic", "subscription",
        "subscription_type", "mark_delete_position",
        ranges.alias("ranges"),
        F.when(parsed_ok, F.lit("individuallyDeletedMessages")).otherwise(reported_source).alias("ranges_source"),
        "ranges_reported", "ranges_malformed", "cap", "cap_source",
        F.greatest(ranges - F.col("cap"), zero).alias("over_cap"),
        "persist_mode", "persist_mode_source", "persisted_as",
        F.when(parsed_ok & long_array, F.coalesce("long_array_ledgers", F.when(no_ranges, F.lit(0)))).alias(
            "long_array_ledgers"
        ),
        "metadata_store_cap",
        (ranges <= F.col("metadata_store_cap")).alias("closes_to_metadata_store"),
        F.when(parsed_ok, exposure).alias("exposure_entries"),
        F.when(parsed_ok, F.when(no_ranges, zero).otherwise(F.col("acked_entries"))).alias("acked_entries"),
        F.when(long_array_size, F.col("long_array_bytes"))
        .otherwise(
            F.coalesce(F.col("serialized_size_reported"), F.round(ranges * ESTIMATED_BYTES_PER_RANGE).cast("bigint"))
        )
        .alias("serialized_bytes"),
        F.when(long_array_size, F.lit("estimated-long-array"))
        .when(F.col("serialized_size_reported").isNotNull(), F.lit("reported"))
        .otherwise(F.lit("estimated"))
        .alias("serialized_bytes_source"),
        F.when(parsed_ok, F.coalesce("ledgers", F.lit(0))).alias("ledgers"),
        F.when(parsed_ok, F.coalesce("max_ranges_per_ledger", zero)).alias("max_ranges_per_ledger"),
        F.when(parsed_ok, F.coalesce("ranges_per_ledger", F.create_map().cast("map<bigint,bigint>"))).alias(
            "ranges_per_ledger"
        ),
        "msg_delayed", "unacked_messages", "msg_backlog", "consumers",
    )
    malformed = joined.filter("ranges_malformed").select(
        "day", "snapshot_at", "cluster", "topic", "subscription", "source_file", "outline_ok", "bad_ranges",
        "ranges_reported", F.col("individually_deleted_messages").alias("raw"),
    )
    return out, malformed


def with_growth(today: DataFrame, previous: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    """Growth (least-squares slope, ranges per hour) over the window ending at each snapshot, and
    the forecast time to the cap. ``previous`` holds earlier snapshots (key, snapshot_at, ranges)
    so that the first snapshots of the day have a history."""
    origin = datetime.combine(day, time(), tzinfo=timezone.utc)
    hours = (F.unix_micros("snapshot_at") - F.lit(int(origin.timestamp() * 1_000_000))) / F.lit(3.6e9)
    history = previous.select(*SNAPSHOT_KEY, "ranges", F.lit(False).alias("is_today"))
    both = today.withColumn("is_today", F.lit(True)).unionByName(history, allowMissingColumns=True)
    # Range frames need an integral order key: microseconds; the slope itself is fitted on hours.
    window_us = int(alerts.growth_window_hours * 3.6e9)
    window = Window.partitionBy(*KEY).orderBy(F.unix_micros("snapshot_at")).rangeBetween(-window_us, 0)
    enough = F.col("growth_snapshots") >= alerts.growth_min_snapshots
    grown = (
        both.withColumn("x", hours)
        .withColumn("growth_snapshots", F.count("ranges").over(window).cast("int"))
        .withColumn("growth_per_hour", F.when(enough, F.regr_slope("ranges", "x").over(window)))
        .filter("is_today")
    )
    hours_to_cap = (
        F.when(F.col("ranges") >= F.col("cap"), F.lit(0.0))
        .when(F.col("growth_per_hour") > 0, (F.col("cap") - F.col("ranges")) / F.col("growth_per_hour"))
    )
    forecast_at = F.when(
        F.col("hours_to_cap") <= MAX_FORECAST_HOURS,
        F.timestamp_micros(F.unix_micros("snapshot_at") + (F.col("hours_to_cap") * 3.6e9).cast("bigint")),
    )
    return (
        grown.withColumn("hours_to_cap", hours_to_cap)
        .withColumn("forecast_cap_at", forecast_at)
        .drop("x", "is_today")
    )


def _quarantine_rows(malformed: DataFrame, day: date) -> DataFrame:
    detail = F.concat(
        F.lit("individuallyDeletedMessages of "), F.col("topic"), F.lit(" subscription "), F.col("subscription"),
        F.lit(" at "), F.date_format("snapshot_at", "yyyy-MM-dd'T'HH:mm:ss'Z'"), F.lit(": "),
        F.when(
            ~F.col("outline_ok"),
            F.lit("not a list of (ledger:entry..ledger:entry] ranges in [ ], separated by commas"),
        ).otherwise(
            F.concat(F.col("bad_ranges").cast("string"), F.lit(" range(s) empty, overlapping or out of order"))
        ),
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


def replace_quarantine(rows: DataFrame, day: date, stage: str, kind: str) -> object:
    """Replace this (day, stage, kind)'s quarantine rows, keeping other kinds of the same stage."""
    others = read_table("quarantine").filter(
        (F.col("day") == F.lit(day)) & (F.col("stage") == stage) & (F.col("kind") != kind)
    )
    return write_table(
        others.unionByName(rows), "quarantine", mode="replace", partitions=[{"day": day, "stage": stage}]
    )


# ------------------------------------------------------------------------------ hole_alerts


def _fmt(col: str) -> Column:
    return F.format_number(F.col(col), 0)


def _mode_text() -> Column:
    """E.g. "persisted as long-array, long-array mode from version 4.1.2"."""
    return F.concat(
        F.lit("persisted as "), F.coalesce(F.col("persisted_as"), F.lit("unknown")), F.lit(", "),
        F.coalesce(F.col("persist_mode"), F.lit("unknown")), F.lit(" mode from "),
        F.coalesce(F.col("persist_mode_source"), F.lit("unknown")),
    )


def daily_alerts(ranges: DataFrame, alerts: AlertSettings) -> DataFrame:
    """One row per subscription of the day with its severity (null: no alert) and numbers."""
    df = with_alert_thresholds(ranges, alerts)
    peak = F.struct(F.col("ranges"), F.col("snapshot_at"))
    last = F.col("snapshot_at")
    at_peak = [
        "snapshot_at", "cap", "cap_source", "over_cap", "exposure_entries", "serialized_bytes",
        "persist_mode", "persist_mode_source", "persisted_as",
    ]
    at_last = [
        "namespace", "subscription_type", "growth_per_hour", "hours_to_cap", "forecast_cap_at",
        "unacked_messages", "msg_backlog", "warning_threshold", "horizon_hours",
    ]
    agg = df.groupBy(*KEY).agg(
        F.max("ranges").alias("ranges"),
        F.max_by("ranges", last).alias("ranges_last"),
        F.max("snapshot_at").alias("last_snapshot_at"),
        F.max("msg_delayed").alias("msg_delayed"),
        *(F.max_by(c, peak).alias("ranges_at" if c == "snapshot_at" else c) for c in at_peak),
        *(F.max_by(c, last).alias(c) for c in at_last),
    )
    forecast_hit = (F.col("hours_to_cap") > 0) & (F.col("hours_to_cap") <= F.col("horizon_hours"))
    # In long-array mode acknowledgements can be left out well under the cap in ranges.
    severity = (
        F.when((F.col("ranges") >= F.col("cap")) | (F.col("exposure_entries") > 0), F.lit("critical"))
        .when(F.col("ranges") >= F.col("warning_threshold"), F.lit("warning"))
        .when(forecast_hit, F.lit("forecast"))
    )
    at = F.date_format("ranges_at", "yyyy-MM-dd HH:mm 'UTC'")
    trend = F.when(
        forecast_hit,
        F.concat(
            F.lit("; growing "), F.format_number("growth_per_hour", 0), F.lit(" ranges/h, cap reached in "),
            F.format_number("hours_to_cap", 1), F.lit(" h (at "),
            F.date_format("forecast_cap_at", "yyyy-MM-dd HH:mm 'UTC'"), F.lit(")"),
        ),
    ).otherwise(F.lit(""))
    reason = (
        F.when(
            F.col("severity") == "critical",
            F.concat(
                _fmt("ranges"), F.lit(" ranges at "), at,
                F.when(F.col("ranges") >= F.col("cap"), F.lit(" >= cap ")).otherwise(F.lit(" < cap ")),
                _fmt("cap"), F.lit(" ("), F.col("cap_source"), F.lit("): "), _fmt("over_cap"),
                F.lit(" ranges over the cap, "),
                F.coalesce(_fmt("exposure_entries"), F.lit("an unknown number of")),
                F.lit(" acknowledged entries redelivered on a topic reload ("), _mode_text(), F.lit("); serialized "),
                _fmt("serialized_bytes"), F.lit(" bytes"), trend,
            ),
        )
        .when(
            F.col("severity") == "warning",
            F.concat(
                _fmt("ranges"), F.lit(" ranges at "), at, F.lit(" >= warning threshold "),
                _fmt("warning_threshold"), F.lit(" (cap "), _fmt("cap"), F.lit(")"), trend,
            ),
        )
        .when(
            F.col("severity") == "forecast",
            F.concat(
                _fmt("ranges_last"), F.lit(" ranges (cap "), _fmt("cap"), F.lit(")"), trend,
                F.lit(", within the "), F.format_number("horizon_hours", 0), F.lit(" h horizon"),
            ),
        )
    )
    scenario = (
        F.when(F.col("msg_delayed") > 0, F.lit("delayed-messages"))
        .when(F.col("subscription_type") == "Key_Shared", F.lit("key-shared"))
        .when(F.col("subscription_type").isin("Exclusive", "Failover"), F.lit("exclusive-failover"))
        .when(F.col("subscription_type") == "Shared", F.lit("shared-unacked"))
        .otherwise(F.lit("unknown"))
    )
    hint = F.create_map(*(F.lit(x) for kv in HINTS.items() for x in kv))[F.col("hint_scenario")]
    return (
        agg.withColumn("severity", severity)
        .withColumn("reason", reason)
        .withColumn("hint_scenario", scenario)
        .withColumn("hint", hint)
    )


def with_state(today: DataFrame, previous: DataFrame, notified: DataFrame, day: date) -> DataFrame:
    """Alert state against the previous day's open alerts: new, ongoing, escalated, resolved, or
    stale: an open alert whose subscription has no snapshot today is not resolved (nothing says
    the holes are gone); it keeps its severity, and ``stale_since`` (the first day without data,
    carried while it lasts) lets the mail say "no data since …" once."""
    rank = F.create_map(*(F.lit(x) for kv in SEVERITY_RANK.items() for x in kv))
    prev = previous.filter(F.col("state") != "resolved").select(
        *KEY,
        F.col("severity").alias("p_severity"),
        F.col("first_seen").alias("p_first_seen"),
        F.col("namespace").alias("p_namespace"),
        F.col("subscription_type").alias("p_subscription_type"),
        F.col("warning_threshold").alias("p_warning_threshold"),
        F.col("horizon_hours").alias("p_horizon_hours"),
        F.col("hint_scenario").alias("p_hint_scenario"),
        F.col("hint").alias("p_hint"),
        F.col("last_snapshot_at").alias("p_last_snapshot_at"),
        F.col("stale_since").alias("p_stale_since"),
        F.lit(True).alias("was_open"),
    )
    both = today.join(prev, KEY, "full").filter(F.col("severity").isNotNull() | F.col("was_open"))
    is_open = F.col("severity").isNotNull()
    no_data = F.col("last_snapshot_at").isNull()  # open yesterday, no snapshot today
    state = (
        F.when(is_open & F.col("was_open").isNull(), F.lit("new"))
        .when(is_open & (rank[F.col("severity")] > rank[F.col("p_severity")]), F.lit("escalated"))
        .when(is_open, F.lit("ongoing"))
        .when(no_data, F.lit("stale"))
        .otherwise(F.lit("resolved"))
    )
    last_seen = F.coalesce(F.col("last_snapshot_at"), F.col("p_last_snapshot_at"))
    resolved_reason = F.when(
        no_data,
        F.concat(
            F.lit("no data since "),
            F.coalesce(F.date_format(last_seen, "yyyy-MM-dd HH:mm 'UTC'"), F.lit("an unknown time")),
            F.lit(": no cursor snapshots for this subscription; the alert stays open until a snapshot shows it"),
        ),
    ).otherwise(
        F.concat(
            F.lit("resolved: peak "), _fmt("ranges"), F.lit(" ranges < warning threshold "),
            _fmt("warning_threshold"), F.lit(", cap "), _fmt("cap"), F.lit(" not reached within "),
            F.format_number("horizon_hours", 0), F.lit(" h at the current trend"),
        )
    )
    sent = notified.filter(F.col("day") == F.lit(day)).select(*KEY).distinct().withColumn("sent", F.lit(True))
    return (
        both.withColumn("state", state)
        .withColumn("severity", F.when(F.col("state") == "stale", F.col("p_severity")).otherwise(F.col("severity")))
        .withColumn(
            "stale_since",
            F.when(F.col("state") == "stale", F.coalesce(F.col("p_stale_since"), F.lit(day)).cast("date")),
        )
        .withColumn("day", F.lit(day))
        .withColumn("previous_severity", F.col("p_severity"))
        .withColumn("first_seen", F.when(F.col("was_open"), F.col("p_first_seen")).otherwise(F.lit(day)))
        .withColumn("reason", F.coalesce(F.col("reason"), resolved_reason))
        .withColumn("last_snapshot_at", last_seen)
        .withColumn("namespace", F.coalesce("namespace", "p_namespace"))
        .withColumn("subscription_type", F.coalesce("subscription_type", "p_subscription_type"))
        .withColumn("warning_threshold", F.coalesce("warning_threshold", "p_warning_threshold"))
        .withColumn("horizon_hours", F.coalesce("horizon_hours", "p_horizon_hours"))
        .withColumn("hint_scenario", F.coalesce("hint_scenario", "p_hint_scenario"))
        .withColumn("hint", F.coalesce("hint", "p_hint"))
        .join(sent, KEY, "left")
        .withColumn("notified", F.coalesce("sent", F.lit(False)))
    )


def hole_alerts_frame(ranges: DataFrame, previous_alerts: DataFrame, notified: DataFrame, day: date,
                      alerts: AlertSettings) -> DataFrame:
    from brokerlens.platform.schemas import table_schema

    frame = with_state(daily_alerts(ranges, alerts), previous_alerts, notified, day)
    return frame.select(*table_schema("hole_alerts").column_names)


# ------------------------------------------------------------------------------ the build step


def build_holes(day: date, settings: Settings) -> StageResult:
    from brokerlens.platform.schemas import table_schema

    result = StageResult("holes", day)
    alerts = settings.alerts
    on_day = F.col("day") == F.lit(day)
    snapshots = read_table("cursor_snapshots").filter(on_day)
    rows, _ = cursor_ranges_frame(snapshots, day, alerts)
    window_start = datetime.combine(day, time(), tzinfo=timezone.utc) - timedelta(hours=alerts.growth_window_hours)
    previous = read_table("cursor_ranges").filter(
        (F.col("day") == F.lit(day - timedelta(days=1))) & (F.col("snapshot_at") >= F.lit(window_start))
    )
    cursor_ranges = with_growth(rows, previous, day, alerts).select(*table_schema("cursor_ranges").column_names)
    result.writes.append(write_table(cursor_ranges, "cursor_ranges", mode="replace", partitions=[{"day": day}]))
    built = read_table("cursor_ranges").filter(on_day)

    # Only the few malformed snapshots are parsed again, for the quarantine's detail and raw text
    # (and a re-run that finds none clears the earlier rows).
    bad_keys = built.filter("ranges_malformed").select(*SNAPSHOT_KEY)
    result.metrics["malformed_ranges"] = bad_keys.count()
    quarantined_before = read_table("quarantine").filter(
        on_day & (F.col("stage") == "build") & (F.col("kind") == "cursor_ranges")
    )
    if result.metrics["malformed_ranges"] or not quarantined_before.isEmpty():
        _, malformed = cursor_ranges_frame(snapshots.join(bad_keys, SNAPSHOT_KEY, "left_semi"), day, alerts)
        result.writes.append(replace_quarantine(_quarantine_rows(malformed, day), day, "build", "cursor_ranges"))

    hole_alerts = hole_alerts_frame(
        built,
        read_table("hole_alerts").filter(F.col("day") == F.lit(day - timedelta(days=1))),
        read_table("alert_notifications").filter(F.col("status") == "sent"),
        day,
        alerts,
    )
    result.writes.append(write_table(hole_alerts, "hole_alerts", mode="replace", partitions=[{"day": day}]))
    counts = read_table("hole_alerts").filter(on_day).groupBy("severity", "state").count().collect()
    for r in sorted(counts, key=lambda r: (r["severity"] or "", r["state"])):
        result.metrics[f"alerts_{r['severity'] or 'none'}_{r['state']}"] = r["count"]
    if result.metrics["malformed_ranges"]:
        result.lines.append(
            f"{result.metrics['malformed_ranges']} cursor snapshots with malformed individuallyDeletedMessages "
            "quarantined (reason malformed-ranges); their range count is the reported one"
        )
    return result
