"""Parsing ``individuallyDeletedMessages``, the acknowledged ranges after ``markDeletePosition``
(``[(3:4..3:6], (3:7..3:9]]``), and per snapshot the counts, entries and exposure of its ranges
and what the long-array format (``OpenLongPairRangeSet.toRanges(cap)``) would keep and weigh.

The range string can hold hundreds of thousands of ranges (megabytes in one field). It is parsed
with Spark SQL functions only (regexp_extract_all, posexplode, aggregates), whose cost grows
linearly with its length, and it never reaches the driver.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .persistence import SNAPSHOT_KEY

# LongListMap.values is a proto2 `repeated int64` (not packed): a tag byte + a varint per word. A
# word of entries all unacknowledged is 0 (1-byte varint); a word whose top entry is acknowledged is
# negative as int64 (10-byte varint), the bound used for every word from the first acknowledged one.
ZERO_WORD_BYTES, WORD_BYTES = 1 + 1, 1 + 10
# One range as Pulsar prints it: (lowerLedger:lowerEntry..upperLedger:upperEntry]. Entry ids can be
# -1 (the position before a ledger's first entry).
RANGE = r"\((-?\d+):(-?\d+)\.\.(-?\d+):(-?\d+)\]"


def parse_ranges(snapshots: DataFrame) -> DataFrame:
    """Per snapshot: the range string split into an array, and whether its outline is well formed.

    Well formed: ``[`` + ranges separated by commas + ``]`` (whitespace ignored). Checked without a
    backtracking pattern over the whole string: the string must be exactly ``[``, the ranges
    found in it joined by commas, and ``]``. (Counting the commas left once the ranges are removed
    would pass ``[(1:1..1:2](1:3..1:4],,(1:5..1:6]]``.)
    """
    # Java's \s is these six characters: deleted one by one, not by a pattern.
    text = F.translate(F.col("individually_deleted_messages"), " \t\n\u000b\f\r", "")
    # Pulsar before 2.x printed ranges with the two-dot leader U+2025 and a trailing ", ]".
    text = F.regexp_replace(F.replace(text, F.lit("\u2025"), F.lit("..")), r",\]$", "]")
    matches = F.regexp_extract_all(text, F.lit(RANGE), 0)
    outline_ok = text == F.concat(F.lit("["), F.array_join(matches, ","), F.lit("]"))
    return snapshots.withColumn("range_list", matches).withColumn("outline_ok", outline_ok)


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
    """Per ledger: ``kept`` by ``toRanges(cap)`` (the count of acknowledged entries in the earlier
    ledgers, in id order, is within the cap: Pulsar tests ``rangeCount.getAndAdd(cardinality) >
    cap``, the count before this ledger, so the first ledger is always kept; null when an entry
    count is unknown)
    and ``field_bytes``, its ``PositionInfo.individualDeletedMessageRanges`` field: a tag byte, the
    length, and the ``LongListMap`` (key tag + ledger id, then one word per 64 entry ids from entry 0
    to the last acknowledged one: words below the first acknowledged entry are 0)."""
    upto = Window.partitionBy(*SNAPSHOT_KEY).orderBy("ul").rowsBetween(Window.unboundedPreceding, 0)
    words = F.floor(F.col("last_acked") / 64) + 1
    zero_words = F.floor(F.col("first_acked") / 64)
    list_map = F.lit(1) + _varint_bytes(F.col("ul")) + zero_words * ZERO_WORD_BYTES + (words - zero_words) * WORD_BYTES
    return (
        per_ledger.withColumn(
            "kept",
            F.when(
                F.sum("entries_unknown").over(upto) == 0,
                F.sum("entries").over(upto) - F.col("entries") <= F.col("cap"),
            ),
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
    exploded = parsed.filter(F.col("outline_ok")).select(*SNAPSHOT_KEY, "cap", "ledger_entries", F.posexplode("range_list").alias("pos", "r"))
    # Each r is one match of RANGE, "(ll:le..ul:ue]": cut at its separators, not matched against
    # the pattern four times more (range_stats over 4 M ranges: 6.8 s against 8.8 s).
    inner = F.btrim("r", F.lit("(]"))
    lower, upper = F.substring_index(inner, "..", 1), F.substring_index(inner, "..", -1)
    part = [F.substring_index(side, ":", count).cast("bigint") for side in (lower, upper) for count in (1, -1)]
    ll, le, ul, ue = (F.col(c) for c in ("ll", "le", "ul", "ue"))
    by_pos = Window.partitionBy(*SNAPSHOT_KEY).orderBy("pos")
    ranges = (
        exploded.select(
            *SNAPSHOT_KEY,
            "cap",
            "ledger_entries",
            "pos",
            *(p.alias(n) for p, n in zip(part, ("ll", "le", "ul", "ue"))),
        )
        .withColumn("prev_ul", F.lag("ul").over(by_pos))
        .withColumn("prev_ue", F.lag("ue").over(by_pos))
        .withColumn(
            "bad",
            ((ll > ul) | ((ll == ul) & (le >= ue))) | (F.col("prev_ul") > ll) | ((F.col("prev_ul") == ll) & (F.col("prev_ue") > le)),
        )
        .withColumn("entries", _range_entries(ll, le, ul, ue))
        # pos is 0-based. ManagedCursorImpl.buildIndividualDeletedMessageRanges adds a range before it
        # tests ``size <= cap``, so it stops after cap + 1 ranges: positions > cap are not persisted.
        .withColumn("beyond", F.col("pos") > F.col("cap"))
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
    return (
        _long_array(per_ledger)
        .groupBy(*SNAPSHOT_KEY)
        .agg(
            F.sum("n").alias("ranges_parsed"),
            F.sum("bad").alias("bad_ranges"),
            F.when(F.sum("entries_unknown") == 0, F.sum("entries")).alias("acked_entries"),
            F.when(F.sum("exposure_unknown") == 0, F.coalesce(F.sum("exposure"), F.lit(0))).alias("exposure_entries"),
            F.count("*").cast("int").alias("ledgers"),
            F.max("n").alias("max_ranges_per_ledger"),
            F.map_from_entries(F.collect_list(F.struct("ul", "n"))).alias("ranges_per_ledger"),
            F.when(known, F.sum(F.col("kept").cast("int"))).alias("long_array_ledgers"),
            F.when(known, F.coalesce(F.sum(F.when(F.col("kept"), F.col("field_bytes"))), F.lit(0))).alias("long_array_bytes"),
            F.when(known, F.coalesce(F.sum(F.when(~F.col("kept"), F.col("entries"))), F.lit(0))).alias("long_array_exposure"),
        )
    )
