"""cursor_ranges and hole_alerts (seed 004): ranges parsed from Pulsar's individuallyDeletedMessages."""

from __future__ import annotations

import random
import statistics
from datetime import date, datetime, timedelta

import pytest
from holes_data import TOPIC, at, entries_in, range_string, snap, write_snapshots

from brokerlens.gold.holes.alerts import HINTS
from brokerlens.gold.holes.build import build_holes
from brokerlens.gold.holes.cursor_ranges import ESTIMATED_BYTES_PER_RANGE
from brokerlens.gold.holes.settings import AlertOverride, AlertSettings
from brokerlens.platform.tables import read_table, table_schema, write_table
from brokerlens.platform.frames import rows_frame

DAY = date(2026, 11, 21)


def rows_by_sub(spark, table: str, day: date, settings) -> dict[str, dict]:
    return {r["subscription"]: r.asDict() for r in read_table(table, settings=settings, spark=spark).filter(f"day = '{day}'").collect()}


@pytest.mark.slow
def test_ranges_seed_example_ledgers_empty_and_malformed(spark, settings):
    seed = "[(1:4..1:6], (1:7..1:8]]"
    multi = [(3, 4, 3, 6), (3, 9, 4, 2), (4, 5, 6, 1)]
    ledgers = {3: 10, 4: 8, 5: 7, 6: 4}
    malformed = {
        "m-missing-comma": "[(1:4..1:6] (1:7..1:8]]",
        "m-comma-moved": "[(1:4..1:6](1:7..1:8],,(1:9..1:10]]",
        "m-truncated": "[(1:4..1:6], (1:7..",
        "m-reversed": "[(1:6..1:4]]",
        "m-overlapping": "[(1:4..1:8], (1:6..1:9]]",
        "m-garbage": "not a range set",
    }
    rows = [
        snap(at(DAY, 1), seed, sub="seed", reported=2),
        snap(at(DAY, 1), range_string(multi), sub="multi", ledger_entries=ledgers, reported=3),
        snap(at(DAY, 1), "[]", sub="empty", reported=0),
        snap(at(DAY, 1), None, sub="topic-only", reported=1234, source="topic-stats"),
        snap(at(DAY, 1), None, sub="topic-sized", reported=1234, source="topic-stats", size=40_000),
        *(snap(at(DAY, 1), text, sub=name, reported=41) for name, text in malformed.items()),
    ]
    write_snapshots(spark, rows, DAY, settings)
    # Another build step's quarantine rows of the same day must survive this step's replace.
    q = table_schema("quarantine")
    other = rows_frame(
        spark,
        [(DAY, "build", "dispatch_periods", "x.jsonl", 1, "negative-counter", None, "{}", datetime(2026, 11, 21, 2))],
        q.struct,
    )
    write_table(other, "quarantine", mode="append", settings=settings)

    build_holes(spark, DAY, settings)
    build_holes(spark, DAY, settings)  # a re-run replaces, never duplicates
    got = rows_by_sub(spark, "cursor_ranges", DAY, settings)
    assert len(got) == len(rows)

    s = got["seed"]
    assert (s["ranges"], s["ranges_source"], s["ranges_malformed"]) == (2, "individuallyDeletedMessages", False)
    assert s["acked_entries"] == sum(entries_in(r, {1: 100}) for r in [(1, 4, 1, 6), (1, 7, 1, 8)]) == 3
    assert (s["cap"], s["cap_source"], s["over_cap"], s["exposure_entries"]) == (10_000, "default", 0, 0)
    assert s["ranges_per_ledger"] == {1: 2} and s["ledgers"] == 1
    assert s["serialized_bytes"] == round(2 * 5 * 1024 * 1024 / 200_000)

    m = got["multi"]
    assert m["ranges"] == 3
    assert m["acked_entries"] == sum(entries_in(r, ledgers) for r in multi)
    assert m["ranges_per_ledger"] == {3: 1, 4: 1, 6: 1} and m["ledgers"] == 3 and m["max_ranges_per_ledger"] == 1

    e = got["empty"]
    assert (e["ranges"], e["acked_entries"], e["ledgers"], e["ranges_per_ledger"]) == (0, 0, 0, {})

    t = got["topic-only"]
    assert (t["ranges"], t["ranges_source"], t["exposure_entries"]) == (1234, "nonContiguousDeletedMessagesRanges", None)
    assert (t["serialized_bytes"], t["serialized_bytes_source"]) == (round(1234 * ESTIMATED_BYTES_PER_RANGE), "estimated")
    assert (got["topic-sized"]["serialized_bytes"], got["topic-sized"]["serialized_bytes_source"]) == (40_000, "reported")

    for name in malformed:
        r = got[name]
        assert r["ranges_malformed"] is True, name
        assert (r["ranges"], r["ranges_source"]) == (41, "totalNonContiguousDeletedMessagesRange"), name
        assert r["acked_entries"] is None and r["ranges_per_ledger"] is None

    quarantine = read_table("quarantine", settings=settings, spark=spark).filter(f"day = '{DAY}' AND stage = 'build'").collect()
    mine = [r for r in quarantine if r["kind"] == "cursor_ranges"]
    assert sorted(r["raw"] for r in mine) == sorted(malformed.values())
    assert {r["reason"] for r in mine} == {"malformed-ranges"}
    assert all("fall back to the reported count 41" in r["detail"] for r in mine)
    assert [r["kind"] for r in quarantine if r["kind"] != "cursor_ranges"] == ["dispatch_periods"]


def _positions(ledgers: dict[int, int]) -> list[tuple[int, int]]:
    return [(ledger, entry) for ledger in sorted(ledgers) for entry in range(ledgers[ledger])]


def _random_ranges(n: int, ledgers: dict[int, int], rng: random.Random) -> list[tuple[int, int, int, int]]:
    """n disjoint ascending ranges over the ledgers' positions; some cross ledger boundaries."""
    pos = _positions(ledgers)
    out, i = [], 0
    for _ in range(n):
        i += rng.randint(1, 3)  # an unacknowledged gap (the hole)
        length = rng.randint(1, 4)
        lower, upper = pos[i - 1], pos[i - 1 + length]
        out.append((*lower, *upper))
        i += length
    return out


def _entries(ranges, ledgers) -> int:
    # Independent count: global index of a position over the ledgers in order.
    index = {p: k for k, p in enumerate(_positions(ledgers))}
    return sum(index[(c, d)] - index[(a, b)] for a, b, c, d in ranges)


def write_broker_configs(spark, records: list[tuple[datetime, str | None, int]], settings) -> None:
    """bronze_policies broker-config records of cluster c2: (effective_at, broker or None for the
    cluster's, managedLedgerMaxUnackedRangesToPersist)."""
    p = table_schema("bronze_policies")
    policy = lambda effective_at, broker, cap: {  # noqa: E731
        "day": DAY,
        "effective_at": effective_at,
        "cluster": "c2",
        "kind": "broker-config",
        "broker": broker,
        "namespace": None,
        "topic": None,
        "removed": False,
        "dispatch_throttling_rate_in_msg": None,
        "dispatch_throttling_rate_in_byte": None,
        "rate_period_in_second": None,
        "relative_to_publish_rate": None,
        "broker_config": {"managedLedgerMaxUnackedRangesToPersist": str(cap)},
        "policy_json": "{}",
        "source_file": "p.jsonl",
        "line": 1,
        "ingested_at": datetime(2026, 11, 21, 0),
    }
    rows = [policy(*r) for r in records]
    write_table(rows_frame(spark, [tuple(r[c] for c in p.column_names) for r in rows], p.struct), "bronze_policies", mode="append", settings=settings)


@pytest.mark.slow
def test_over_cap_exposure_exact_with_cap_from_default_policy_and_override(spark, settings):
    rng = random.Random(4)
    ledgers = {10: 5_000, 11: 30_000, 12: 40_000}
    big = _random_ranges(10_012, ledgers, rng)
    assert any(a != c for a, _, c, _ in big)  # cross-ledger ranges are in the test
    small_ledgers = {7: 6, 8: 5, 9: 50}
    small = _random_ranges(9, small_ledgers, rng)
    rows = [
        snap(at(DAY, 3), range_string(big), sub="big", ledger_entries=ledgers, reported=len(big)),
        snap(at(DAY, 3), range_string(small), sub="policy", cluster="c2", ledger_entries=small_ledgers),
        snap(at(DAY, 3), range_string(small), sub="override", cluster="c2", namespace="t/special", ledger_entries=small_ledgers),
        # A spanned ledger of unknown size: exposure unknown, not guessed.
        snap(at(DAY, 3), "[(1:1..1:3], (1:4..2:1]]", sub="unknown-ledger", cluster="c2", ledger_entries={}),
    ]
    write_snapshots(spark, rows, DAY, settings)
    write_broker_configs(spark, [(datetime(2026, 11, 21, 0), None, 5), (datetime(2026, 11, 21, 4), "broker-1:8080", 1)], settings)
    custom = settings.model_copy(update={"alerts": AlertSettings(overrides=[AlertOverride(namespace="t/special", cap=4)])})

    build_holes(spark, DAY, custom)
    got = rows_by_sub(spark, "cursor_ranges", DAY, settings)

    b = got["big"]
    assert (b["ranges"], b["cap"], b["over_cap"]) == (10_012, 10_000, 12)
    # Pulsar persists the first cap + 1 ranges (checked against a live broker, test_live_holes.py).
    assert b["exposure_entries"] == _entries(big[10_001:], ledgers)
    assert b["acked_entries"] == _entries(big, ledgers)
    assert b["ranges_per_ledger"] == {ledger: sum(1 for r in big if r[2] == ledger) for ledger in ledgers}

    pol = got["policy"]  # the later broker-specific record is not yet in force at 03:00
    assert (pol["cap"], pol["cap_source"], pol["over_cap"]) == (5, "broker-config", 4)
    assert pol["exposure_entries"] == sum(entries_in(r, small_ledgers) for r in small[6:])

    ov = got["override"]
    assert (ov["cap"], ov["cap_source"], ov["over_cap"]) == (4, "settings-namespace", 5)
    assert ov["exposure_entries"] == sum(entries_in(r, small_ledgers) for r in small[5:])

    u = got["unknown-ledger"]
    assert (u["ranges"], u["ranges_malformed"], u["acked_entries"]) == (2, False, None)

    alerts = rows_by_sub(spark, "hole_alerts", DAY, settings)
    assert alerts["big"]["severity"] == "critical" and alerts["big"]["exposure_entries"] == b["exposure_entries"]
    assert "12 ranges over the cap" in alerts["big"]["reason"]
    assert f"{b['exposure_entries']:,} acknowledged entries" in alerts["big"]["reason"]


@pytest.mark.slow
def test_the_cap_in_force_per_broker_and_instant_and_without_a_broker_the_clusters(spark, settings):
    """The broker config is looked up per (cluster, broker, instant): cursors of one broker at
    one instant share it, another broker or instant has its own, and a snapshot that names no
    broker takes the cluster's records only."""
    small = "[(7:1..7:2], (7:3..7:4]]"
    rows = [
        snap(at(DAY, 3), small, sub="b1-at-3", cluster="c2", ledger_entries={7: 6}),
        snap(at(DAY, 5), small, sub="b1-at-5", cluster="c2", ledger_entries={7: 6}),
        snap(at(DAY, 5), small, sub="b2-at-5", cluster="c2", ledger_entries={7: 6}, broker="broker-2:8080"),
        snap(at(DAY, 5), small, sub="no-broker-at-5", cluster="c2", ledger_entries={7: 6}, broker=None),
    ]
    write_snapshots(spark, rows, DAY, settings)
    write_broker_configs(spark, [(datetime(2026, 11, 21, 0), None, 5), (datetime(2026, 11, 21, 4), "broker-1:8080", 1)], settings)

    build_holes(spark, DAY, settings)
    got = rows_by_sub(spark, "cursor_ranges", DAY, settings)
    assert {sub: (r["cap"], r["cap_source"], r["over_cap"]) for sub, r in got.items()} == {
        "b1-at-3": (5, "broker-config", 0),
        "b1-at-5": (1, "broker-config", 1),
        "b2-at-5": (5, "broker-config", 0),
        "no-broker-at-5": (5, "broker-config", 0),
    }


@pytest.mark.slow
def test_growth_forecast_severities_hints_and_states_across_days(spark, settings):
    d1, d2 = DAY, DAY + timedelta(days=1)
    hours = [18, 19, 20, 21, 22, 23]
    day1 = []
    for i, h in enumerate(hours):
        day1 += [
            snap(at(d1, h), None, sub="crit", reported=10_500, source="topic-stats", sub_type="Key_Shared"),
            snap(at(d1, h), None, sub="warn", reported=8_500, source="topic-stats", delayed=120),
            snap(at(d1, h), None, sub="fc", reported=1_000 * (i + 1), source="topic-stats", sub_type="Exclusive"),
            snap(at(d1, h), None, sub="calm", reported=100, source="topic-stats"),
        ]
    write_snapshots(spark, day1, d1, settings)
    build_holes(spark, d1, settings)

    r1 = {(r["subscription"], r["snapshot_at"]): r for r in read_table("cursor_ranges", settings=settings, spark=spark).collect()}
    fc_last = r1[("fc", at(d1, 23))]
    points = [(h, 1_000 * (i + 1)) for i, h in enumerate(hours)]  # all within the 6 h window
    slope = statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope
    assert fc_last["growth_per_hour"] == pytest.approx(slope)
    assert fc_last["growth_snapshots"] == 6
    assert fc_last["hours_to_cap"] == pytest.approx((10_000 - 6_000) / slope)
    assert fc_last["forecast_cap_at"] == at(d1, 23) + timedelta(hours=(10_000 - 6_000) / slope)
    assert r1[("fc", at(d1, 19))]["growth_per_hour"] is None  # 2 snapshots < growth_min_snapshots
    assert r1[("calm", at(d1, 23))]["hours_to_cap"] is None

    a1 = rows_by_sub(spark, "hole_alerts", d1, settings)
    assert set(a1) == {"crit", "warn", "fc"}
    assert {k: (v["severity"], v["state"], v["hint_scenario"]) for k, v in a1.items()} == {
        "crit": ("critical", "new", "key-shared"),
        "warn": ("warning", "new", "delayed-messages"),
        "fc": ("forecast", "new", "exclusive-failover"),
    }
    assert a1["warn"]["hint"] == HINTS["delayed-messages"] and "separate topics" in a1["warn"]["hint"]
    assert "cumulative acknowledgement" in a1["fc"]["hint"]
    assert a1["fc"]["hours_to_cap"] == pytest.approx(4.0) and "cap reached in 4.0 h" in a1["fc"]["reason"]
    assert a1["crit"]["over_cap"] == 500 and a1["crit"]["exposure_entries"] is None

    day2 = []
    for h in [0, 1, 2]:
        day2 += [
            snap(at(d2, h), None, sub="crit", reported=10_500, source="topic-stats", sub_type="Key_Shared"),
            snap(at(d2, h), None, sub="warn", reported=11_000, source="topic-stats", delayed=120),
            snap(at(d2, h), None, sub="fc", reported=500, source="topic-stats", sub_type="Exclusive"),
            snap(at(d2, h), None, sub="calm", reported=9_000, source="topic-stats", sub_type="Failover"),
        ]
    write_snapshots(spark, day2, d2, settings)
    build_holes(spark, d2, settings)
    build_holes(spark, d2, settings)

    # The first snapshot of day 2 fits its trend on day 1's last 6 hours too.
    first = read_table("cursor_ranges", settings=settings, spark=spark).filter(f"day = '{d2}' AND subscription = 'fc' AND hour(snapshot_at) = 0").first()
    window = [(h - 24, y) for h, y in points if h - 24 >= -6] + [(0, 500)]
    assert first["growth_snapshots"] == len(window)
    assert first["growth_per_hour"] == pytest.approx(statistics.linear_regression([x for x, _ in window], [y for _, y in window]).slope)

    a2 = rows_by_sub(spark, "hole_alerts", d2, settings)
    assert {k: (v["severity"], v["previous_severity"], v["state"], v["first_seen"]) for k, v in a2.items()} == {
        "crit": ("critical", "critical", "ongoing", d1),
        "warn": ("critical", "warning", "escalated", d1),
        "fc": (None, "forecast", "resolved", d1),
        "calm": ("warning", None, "new", d2),
    }
    assert a2["fc"]["reason"].startswith("resolved: peak 500 ranges")
    assert a2["calm"]["hint_scenario"] == "exclusive-failover"
    assert not any(v["notified"] for v in a2.values())
