"""Parsing ``individuallyDeletedMessages``, the acknowledged ranges after ``markDeletePosition``
(``[(3:4..3:6], (3:7..3:9]]``), and per snapshot the counts, entries and exposure of its ranges
and what the long-array format (``OpenLongPairRangeSet.toRanges(cap)``) would keep and weigh.

The range string can hold hundreds of thousands of ranges (megabytes in one field). brokerlens'
function ``brokerlens_range_stats`` (``RangeStats.scala``) reads it in one pass per snapshot, in
the executors: no row per range, no shuffle or sort of the ranges.

What each figure is, as that function computes it:

* the string is well formed (``outline_ok``) when, white space deleted (the six characters of
  Java's ``\\s``; Pulsar 1.x's two-dot leader U+2025 read as ``..`` and its trailing ``, ]`` as
  ``]``), it is exactly ``[``, the ranges found in it (:data:`RANGE`) joined by commas, and ``]``:
  not a backtracking pattern over the whole string (counting the commas left once the ranges are
  removed would pass ``[(1:1..1:2](1:3..1:4],,(1:5..1:6]]``);
* ``bad_ranges``: ranges empty or not strictly after the previous one (Pulsar prints them sorted
  and disjoint); any makes the string malformed;
* a range (a:b..c:d] holds d - b entries within a ledger; across ledgers the rest of ledger a
  (its size from ``ledger_entries``), every ledger in between and entries 0..d of ledger c;
  unknown (null) where a size is;
* ``pos`` is 0-based: ``ManagedCursorImpl.buildIndividualDeletedMessageRanges`` adds a range
  before it tests ``size <= cap``, so it stops after cap + 1 ranges and positions past the cap
  are not persisted (``exposure_entries``, their entries);
* a range is counted in the ledger of its upper end (``ranges_per_ledger``,
  ``max_ranges_per_ledger``): the long-array format needs Pulsar's open range set, whose ranges
  never span ledgers (only the older guava set prints such ranges);
* long-array (``OpenLongPairRangeSet.toRanges(cap)``): ledgers in id order, a ledger ``kept``
  while the acknowledged entries of the ledgers before it number at most ``cap`` (Pulsar tests
  ``rangeCount.getAndAdd(cardinality) > cap``, the count before it, so the first ledger is always
  kept; unknown when an entry count is); a kept ledger's
  ``PositionInfo.individualDeletedMessageRanges`` field is a tag byte, its length and the
  ``LongListMap`` (key tag + ledger id, then one word per 64 entry ids from entry 0 to its last
  acknowledged one: words below the first acknowledged entry are 0, 2 bytes as a proto2
  ``repeated int64``; every word from the first acknowledged one is counted at 11, a negative
  int64's varint) (``long_array_ledgers``, ``long_array_bytes``, ``long_array_exposure``: the
  entries of the ledgers left out).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from brokerlens.platform.jars import RANGE_STATS_FUNCTION

# One range as Pulsar prints it: (lowerLedger:lowerEntry..upperLedger:upperEntry]. Entry ids can be
# -1 (the position before a ledger's first entry).
RANGE = r"\((-?\d+):(-?\d+)\.\.(-?\d+):(-?\d+)\]"


def with_range_stats(snapshots: DataFrame) -> DataFrame:
    """``snapshots`` (``individually_deleted_messages``, ``ledger_entries``, ``cap``) with
    ``outline_ok`` and the stats of their ranges (the module docstring), null where the string is
    null, malformed or holds no range."""
    stats = F.call_function(RANGE_STATS_FUNCTION, F.col("individually_deleted_messages"), F.col("ledger_entries"), F.col("cap"), F.lit(RANGE))
    return snapshots.withColumn("_range_stats", stats).select("*", "_range_stats.*").drop("_range_stats")
