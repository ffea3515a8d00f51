"""Ack-state persistence modes (README "Ack-state persistence modes"): what the cursor ledger keeps
in ranges mode and in long-array mode, with the numbers worked out from Pulsar's code
(ManagedCursorImpl.persistPositionToLedger / buildIndividualDeletedMessageRanges,
OpenLongPairRangeSet.toRanges, MLDataFormats.proto) and checked against a live broker
(test_live_holes.py): ranges mode keeps cap + 1 ranges, long-array always keeps the first ledger."""

from __future__ import annotations

import pytest

from datetime import date, datetime

from holes_data import at, range_string, snap, write_snapshots

from brokerlens.gold.brokers import version_metrics
from brokerlens.gold.holes.build import build_holes
from brokerlens.gold.holes.cursor_ranges import ENTRY_LIMIT_BYTES, cursor_ranges_frame, parsed_snapshots
from brokerlens.gold.holes.settings import AlertSettings
from brokerlens.platform.tables import read_table, table_schema, write_table
from brokerlens.platform.frames import rows_frame

DAY = date(2026, 11, 21)
MIB = 1024 * 1024


def one_entry_ranges(ledger: int, n: int) -> list[tuple[int, int, int, int]]:
    # (L:2k..L:2k+1]: entry 2k+1 acknowledged, entry 2k+2 the hole; n ranges, n entries, last entry 2n-1.
    return [(ledger, 2 * k, ledger, 2 * k + 1) for k in range(n)]


def version_row(broker: str, version: str) -> dict:
    return {
        "day": DAY,
        "collected_at": datetime(2026, 11, 21, 1),
        "cluster": "c1",
        "broker": broker,
        "metric": "pulsar_version_info",
        "metric_type": "gauge",
        "labels": {"cluster": "c1", "version": version},
        "value": 1.0,
        "sample_timestamp": None,
        "source_file": f"metrics/{broker}.prom",
        "line": 3,
        "ingested_at": datetime(2026, 11, 21, 1),
    }


def config_row(cluster: str, broker: str | None, config: dict[str, str]) -> dict:
    return {
        "day": DAY,
        "effective_at": datetime(2026, 11, 21, 0),
        "cluster": cluster,
        "kind": "broker-config",
        "broker": broker,
        "namespace": None,
        "topic": None,
        "removed": False,
        "dispatch_throttling_rate_in_msg": None,
        "dispatch_throttling_rate_in_byte": None,
        "rate_period_in_second": None,
        "relative_to_publish_rate": None,
        "broker_config": config,
        "policy_json": "{}",
        "source_file": "policies/p.jsonl",
        "line": 1,
        "ingested_at": datetime(2026, 11, 21, 0),
    }


def append(spark, table: str, rows: list[dict], settings) -> None:
    schema = table_schema(table)
    write_table(rows_frame(spark, [tuple(r[c] for c in schema.column_names) for r in rows], schema.struct), table, mode="append", settings=settings)


@pytest.mark.slow
def test_ranges_and_long_array_modes_exposure_size_and_metadata_store(spark, settings):
    twelve_k = range_string(one_entry_ranges(3, 12_000))
    two_ledgers = range_string(one_entry_ranges(5, 6_000) + one_entry_ranges(6, 6_000))
    few = "[(7:0..7:8000], (8:0..8:3000], (11:0..11:5]]"  # 3 ranges: 8,000, 3,000 and 5 acknowledged entries
    t = at(DAY, 3)
    rows = [
        snap(t, twelve_k, sub="range-12k", broker="broker-1:8080"),  # no version, no config: ranges
        snap(t, twelve_k, sub="long-12k", broker="broker-2:8080"),  # 4.1.2: long-array
        snap(t, two_ledgers, sub="long-two-ledgers", broker="broker-2:8080"),
        snap(t, few, sub="long-few-ranges", broker="broker-2:8080"),
        snap(t, "[(1:4..1:6], (1:7..1:8]]", sub="config-beats-version", broker="broker-3:8080"),
        snap(t, "[(1:4..1:6]]", sub="old-version", broker="broker-4:8080"),
        # Cluster c2: cap 4, metadata-store cap 3, long-array by cluster-wide broker config.
        snap(t, "[(9:0..9:1], (9:29999999..9:30000000]]", sub="span-30m", cluster="c2"),
        snap(t, "[(9:0..9:1], (9:30999999..9:31000000], (10:0..10:1], (10:2..10:3], (10:4..10:5], (10:6..10:7]]", sub="span-31m", cluster="c2"),
    ]
    write_snapshots(spark, rows, DAY, settings)
    append(
        spark, "bronze_metrics", [version_row("broker-2:8080", "4.1.2"), version_row("broker-3:8080", "4.0.7"), version_row("broker-4:8080", "4.0.7")], settings
    )
    flag = "managedLedgerPersistIndividualAckAsLongArray"
    append(
        spark,
        "bronze_policies",
        [
            config_row("c1", "broker-3:8080", {flag: "true"}),
            config_row("c2", None, {flag: "true", "managedLedgerMaxUnackedRangesToPersist": "4", "managedLedgerMaxUnackedRangesToPersistInMetadataStore": "3"}),
        ],
        settings,
    )

    build_holes(spark, DAY, settings)
    got = {r["subscription"]: r.asDict() for r in read_table("cursor_ranges", settings=settings, spark=spark).filter(f"day = '{DAY}'").collect()}
    pick = lambda sub, *cols: tuple(got[sub][c] for c in cols)  # noqa: E731
    mode = ("persist_mode", "persist_mode_source", "persisted_as")

    # Ranges mode: the first 10,001 of 12,000 ranges persisted (cap + 1); ranges 10,002..12,000 (one
    # entry each) are exposed: 1,999 entries. 12,000 > 1,000 ranges: a close also writes the cursor ledger.
    r = got["range-12k"]
    assert pick("range-12k", *mode) == ("ranges", "default", "ranges")
    assert (r["ranges"], r["over_cap"], r["exposure_entries"], r["closes_to_metadata_store"]) == (12_000, 2_000, 1_999, False)
    assert r["unload_exposure_entries"] == 1_999
    assert r["long_array_ledgers"] is None
    # Seed 004's estimate of the range encoding: 12,000 x 5 MiB / 200,000 = 314,572.8 bytes.
    assert (r["serialized_bytes"], r["serialized_bytes_source"]) == (314_573, "estimated")

    # The same ack state in long-array mode: toRanges(10,000) counts acknowledged entries (bitset
    # cardinality) in the ledgers before each one, so the first ledger is always kept: ledger 3's
    # 12,000 entries all persisted, nothing exposed. Last acknowledged entry 23,999 -> 375 words;
    # LongListMap = 1 + varint(3) 1 + 375 x 11 = 4,127; field 1 + 2 + 4,127 = 4,130 bytes.
    assert pick("long-12k", *mode) == ("long-array", "version 4.1.2", "long-array")
    assert pick("long-12k", "long_array_ledgers", "exposure_entries", "unload_exposure_entries") == (1, 0, 0)
    assert pick("long-12k", "serialized_bytes") == (4_130,)

    # Two ledgers of 6,000 acknowledged entries: ledger 6 has 6,000 <= 10,000 before it: both kept,
    # nothing exposed (ranges mode: 1,999). Each ledger's field: last acknowledged entry 11,999 ->
    # 11,999 // 64 + 1 = 188 words, first acknowledged entry 1 -> 0 zero words; LongListMap = key tag
    # 1 + varint(5) 1 + 188 x 11 = 2,070 bytes; field = tag 1 + varint(2,070) 2 + 2,070 = 2,073 bytes.
    assert pick("long-two-ledgers", *mode) == ("long-array", "version 4.1.2", "long-array")
    assert pick("long-two-ledgers", "long_array_ledgers", "exposure_entries", "over_cap") == (2, 0, 2_000)
    assert pick("long-two-ledgers", "serialized_bytes", "serialized_bytes_source") == (4_146, "estimated-long-array")

    # Three ranges only, far under the cap, yet 8,000 + 3,000 acknowledged entries before ledger 11:
    # ledger 11 is left out and its 5 entries are lost on a crash. 3 <= 1,000 ranges: a graceful
    # unload writes the ranges (all 3 <= cap + 1) to the metadata store and loses nothing.
    # Ledger 7: 8,000 // 64 + 1 = 126 words -> 1 + 1 + 126 x 11 = 1,388; field 1 + 2 + 1,388 = 1,391;
    # ledger 8: 3,000 // 64 + 1 = 47 words -> 1 + 1 + 47 x 11 = 519; field 1 + 2 + 519 = 522.
    assert pick("long-few-ranges", "persisted_as", "long_array_ledgers", "exposure_entries", "over_cap") == ("long-array", 2, 5, 0)
    assert pick("long-few-ranges", "closes_to_metadata_store", "metadata_store_cap", "serialized_bytes") == (True, 1_000, 1_913)
    assert pick("long-few-ranges", "unload_exposure_entries") == (0,)

    # Broker config wins over the version (4.0.7 defaults to ranges). Ledger 1: entries 5..8 ->
    # 1 word, key tag 1 + varint(1) 1 + 11 = 13; field 1 + 1 + 13 = 15 bytes.
    assert pick("config-beats-version", *mode) == ("long-array", "broker-config managedLedgerPersistIndividualAckAsLongArray", "long-array")
    assert pick("config-beats-version", "exposure_entries", "serialized_bytes") == (0, 15)
    assert pick("old-version", *mode) == ("ranges", "version 4.0.7", "ranges")

    # The 5 MB entry limit (BookKeeper nettyMaxFrameSizeBytes = 5 MiB + 10 KiB = 5,253,120 bytes).
    assert ENTRY_LIMIT_BYTES == 5 * MIB + 10 * 1024 == 5_253_120
    # span-30m: last acknowledged entry 30,000,000 -> 468,750 + 1 = 468,751 words; LongListMap
    # 1 + 1 + 468,751 x 11 = 5,156,263; field 1 + varint 4 + 5,156,263 = 5,156,268 <= the limit.
    # Two acknowledged entries (<= cap 4) in a 30-million-entry span: the size follows the span.
    assert pick("span-30m", "cap", "cap_source", *mode) == (
        4,
        "broker-config",
        "long-array",
        "broker-config managedLedgerPersistIndividualAckAsLongArray",
        "long-array",
    )
    assert pick("span-30m", "serialized_bytes", "exposure_entries", "closes_to_metadata_store") == (5_156_268, 0, True)
    # span-31m: ledgers 9 and 10 kept (2 entries before ledger 10 <= 4). Ledger 9: 484,375 + 1 =
    # 484,376 words -> 1 + 1 + 484,376 x 11 = 5,328,138; field 1 + 4 + 5,328,138 = 5,328,143; ledger
    # 10: 1 word -> 13, field 15; 5,328,158 > 5,253,120: the ledger write fails and the metadata store
    # gets the first 5 (cap + 1) of the 6 ranges; the 6th, (10:6..10:7], is 1 entry exposed.
    # 6 ranges > the metadata-store cap 3: a close writes the cursor ledger as well.
    assert pick("span-31m", "persisted_as", "long_array_ledgers", "serialized_bytes") == ("metadata-store", 2, 5_328_158)
    assert pick("span-31m", "over_cap", "exposure_entries", "metadata_store_cap", "closes_to_metadata_store") == (2, 1, 3, False)
    assert pick("span-31m", "unload_exposure_entries") == (1,)

    # The alert says the mode: a critical alert under the cap because long-array leaves entries out.
    alerts = {r["subscription"]: r.asDict() for r in read_table("hole_alerts", settings=settings, spark=spark).filter(f"day = '{DAY}'").collect()}
    a = alerts["long-few-ranges"]
    assert (a["severity"], a["persist_mode"], a["persisted_as"], a["exposure_entries"]) == ("critical", "long-array", "long-array", 5)
    assert a["reason"].startswith(
        "3 ranges at 2026-11-21 03:00 UTC < cap 10,000 (default): 0 ranges over the cap, "
        "5 acknowledged entries redelivered on a topic reload "
        "(persisted as long-array, long-array mode from version 4.1.2)"
    )
    assert "config-beats-version" not in alerts and "span-30m" not in alerts

    # The settings override wins over config and version.
    snapshots = read_table("cursor_snapshots", settings=settings, spark=spark).filter(f"day = '{DAY}'")
    policies = read_table("bronze_policies", settings=settings, spark=spark).where(f"day <= '{DAY}'")  # as build_holes reads them
    forced = cursor_ranges_frame(parsed_snapshots(snapshots, policies, version_metrics(spark, DAY, settings), DAY, AlertSettings(persist_mode="ranges")))[0]
    f = {r["subscription"]: r for r in forced.collect()}["long-two-ledgers"]
    assert (f["persist_mode"], f["persist_mode_source"], f["persisted_as"], f["exposure_entries"]) == ("ranges", "settings", "ranges", 1_999)
