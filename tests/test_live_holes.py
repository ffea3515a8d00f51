"""Holes and reloads against live Pulsar brokers: 4.0.7 in range mode and in long-array mode, 4.2.4
(long-array by default) and 3.0.7 (range mode, no long-array setting).

A consumer makes N acknowledged ranges (below and above the cap) on its own topics; ``brokerlens
collect`` snapshots the admin API; then some topics are unloaded (a graceful cursor close) and the
broker is killed with SIGKILL and started again on the same data (a crash). A new consumer counts
the messages it had acknowledged that the broker delivers again; brokerlens' predicted exposure
from the snapshot (``cursor_ranges``) must equal it exactly.

The cursor ledger is flushed every second (``managedLedgerCursorPositionFlushSeconds=1``) and the
crash comes 3 s after the last acknowledgement reached the broker, so that the cursor ledger holds
the state the snapshot saw (with the default 60 s the acknowledgements of the last minute can be
lost too, which no snapshot can predict). Ledgers roll over every 10 entries so that the
long-array format's per-ledger cut shows.
"""

from __future__ import annotations

import time
import uuid

import pytest
from live_traffic import at_once, one_utc_day
from pulsar_traffic import make_holes, received_again
from alert_helpers import configure, parts

from pyspark.sql import functions as F

from brokerlens.gold.holes.build import build_holes
from brokerlens.pipeline import run_stage
from brokerlens.settings import get_settings, reload_settings
from brokerlens.platform.tables import read_table
from brokerlens.silver.build import build_silver
from brokerlens.sources.collect import collect
from pulsar_broker import pulsar_jars

pytestmark = pytest.mark.pulsar

CAP = 5
BELOW, ABOVE = 3, 9  # acknowledged ranges per topic: under the cap, and over it
HOLES_CONFIG = {
    "managedLedgerMaxUnackedRangesToPersist": CAP,
    "managedLedgerCursorPositionFlushSeconds": 1,
    "managedLedgerMaxEntriesPerLedger": 10,
    "managedLedgerMinLedgerRolloverTimeMinutes": 0,
}


LONG_ARRAY_KEY = "managedLedgerPersistIndividualAckAsLongArray"
# (version, managedLedgerPersistIndividualAckAsLongArray or None for the version's default, the
# mode brokerlens must find, and where from: the broker's runtime configuration, else its version)
BROKERS = {
    "ranges": (pulsar_jars.LTS, "false", "ranges", f"broker-config {LONG_ARRAY_KEY}"),
    "long-array": (pulsar_jars.LTS, "true", "long-array", f"broker-config {LONG_ARRAY_KEY}"),
    # 4.2.4's default is long-array (the key is in its runtime configuration); 3.0.7 has no such
    # key, so the mode comes from the version its /metrics reports.
    "newer": (pulsar_jars.NEWER, None, "long-array", f"broker-config {LONG_ARRAY_KEY}"),
    "older": (pulsar_jars.OLDER, None, "ranges", f"version {pulsar_jars.OLDER}"),
}
# 3.0.7's standalone does not come back from SIGKILL on the same data: the restarted broker cannot
# resolve its own bookie (BKBookieHandleNotAvailableException, "bookie is unknown") and no topic
# loads. Only its graceful reloads (unloads) are run.
NO_CRASH = {"older"}


def holes_broker(pulsar_brokers, name: str):
    version, long_array, _, _ = BROKERS[name]
    config = dict(HOLES_CONFIG)
    if long_array is not None:
        config[LONG_ARRAY_KEY] = long_array
    return pulsar_brokers.get(version, config)


def reload_experiment(broker, settings, label: str) -> dict[str, dict]:
    """Holes on four topics (below/above the cap × unload/crash; two without a crash), one collect,
    then the reloads; per topic the broker's figures."""
    tag = f"{label}-{uuid.uuid4().hex[:6]}"
    kinds = ("unload",) if label in NO_CRASH else ("unload", "crash")
    cases = {f"{kind}-{n}": make_holes(broker, f"persistent://public/default/{kind}-{n}-{tag}", n) for kind in kinds for n in (BELOW, ABOVE)}
    ranges_seen = {name: broker.internal_stats(h.topic)["cursors"]["holes"]["totalNonContiguousDeletedMessagesRange"] for name, h in cases.items()}
    time.sleep(3)  # the cursor-ledger flush (1 s) has written the last acknowledgements
    collect(None, settings, admin_url=broker.admin_url)
    observed = {}
    for name, holes in cases.items():
        if name.startswith("unload"):
            broker.unload(holes.topic)
            observed[name] = received_again(broker, holes)
    collect(None, settings, admin_url=broker.admin_url)  # after the unloads, before the crash
    if label not in NO_CRASH:
        broker.restart(crash=True)
        for name, holes in cases.items():
            if name.startswith("crash"):
                observed[name] = received_again(broker, holes)
        collect(None, settings, admin_url=broker.admin_url)
    log = broker.log_path.read_text(errors="replace").splitlines() if broker.log_path.is_file() else []
    return {
        name: {
            "ranges_broker": ranges_seen[name],
            "received": observed[name][0],
            "acked_again": observed[name][1],
            "holes": h,
            "broker_log": _cursor_log(broker, log, h.topic),
        }
        for name, h in cases.items()
    }


def _cursor_log(broker, log: list[str], topic: str) -> list[str]:
    """The broker's starts and what it logged (``log``: its log's lines) of the topic's ledgers
    and cursor, for a failure to show: which ledger a cursor recovered from or opened, and
    whether a start looped."""
    name = topic.rsplit("/", 1)[-1]
    about = [line for line in log if name in line and any(k in line.lower() for k in ("ledger", "cursor", "recover"))]
    return [f"starts: {broker.starts}", *about[-30:]]


@pytest.fixture(scope="module")
def live_holes(pulsar_brokers, spark, tmp_path_factory):
    """Every broker's experiments into one landing, then land and the silver and holes builds once."""
    home = str(tmp_path_factory.mktemp("live-holes") / "var")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BROKERLENS_HOME", home)
        env.setenv("BROKERLENS_COLLECT__METRICS", "true")  # each broker's /metrics too
        settings = reload_settings()
        day = one_utc_day()
        results = at_once(BROKERS, lambda name: reload_experiment(holes_broker(pulsar_brokers, name), settings, name))
        landed = run_stage("land", day, settings, spark)
        build_silver(spark, day, settings)
        build_holes(spark, day, settings)
        ranges = read_table("cursor_ranges", settings=settings, spark=spark).where(f"day = '{day}'")
        first = ranges.groupBy("topic").agg(F.min("snapshot_at").alias("at"))
        rows = {r["topic"]: r.asDict() for r in ranges.join(first, "topic").where("snapshot_at = at").collect()}
        reloads = [r.asDict() for r in read_table("reload_events", settings=settings, spark=spark).where(f"day = '{day}'").collect()]
    reload_settings()
    for cases in results.values():
        for r in cases.values():
            r["row"] = rows[r["holes"].topic]
            r["reloads"] = sorted((e for e in reloads if e["topic"] == r["holes"].topic), key=lambda e: e["after_at"])
    return results, landed, home, day


def _check(results: dict[str, dict], mode: str, mode_source: str) -> None:
    for name, r in results.items():
        row, holes = r["row"], r["holes"]
        # What the broker said and what brokerlens read agree on the ranges.
        assert r["ranges_broker"] == row["ranges"] == holes.ranges, name
        assert row["persist_mode"] == mode and row["cap"] == CAP, name
        # Read from the broker (collect lands its runtime configuration and its /metrics).
        assert (row["cap_source"], row["persist_mode_source"]) == ("broker-config", mode_source), name
        # Every unacknowledged message comes back (the first and one after each range), plus the lost acks.
        assert r["received"] == holes.ranges + 1 + r["acked_again"], name
        predicted = row["unload_exposure_entries"] if name.startswith("unload") else row["exposure_entries"]
        assert predicted == r["acked_again"], (name, row)


@pytest.mark.parametrize("name", list(BROKERS))
def test_reload_exposure_equals_redelivered_acks(live_holes, name):
    mode = BROKERS[name][2]
    long_array = mode == "long-array"
    results = live_holes[0][name]
    _check(results, mode, BROKERS[name][3])
    # Below the cap nothing is lost; above it a graceful close writes cap + 1 ranges to the
    # metadata store (whatever the mode): the ranges after the sixth, 3 + 1 + 2 entries, come back.
    assert [r["acked_again"] for case, r in results.items() if case.endswith(f"-{BELOW}")] == [0] * (1 if name in NO_CRASH else 2)
    assert results[f"unload-{ABOVE}"]["acked_again"] == 6
    # A crash recovers what the cursor ledger holds: cap + 1 ranges in range mode; in long-array
    # mode every ledger whose earlier ledgers hold at most cap acknowledged entries.
    if name in NO_CRASH:
        return
    crash = results[f"crash-{ABOVE}"]
    assert crash["acked_again"] == (_long_array_lost(crash["holes"].acked) if long_array else 6)
    assert crash["acked_again"] > 0


@pytest.mark.parametrize("name", list(BROKERS))
def test_reload_events_predicted_equals_observed(live_holes, name):
    """reload_events sees each reload between the snapshots around it, and the exposure predicted
    before it equals what the broker lost: the acknowledged entries gone from the ranges, the
    backlog jump, and what the consumer received again."""
    results = live_holes[0][name]
    for case, r in results.items():
        kind = case.split("-")[0]
        event = r["reloads"][0]  # unload topics: between the first two collects; crash topics: the last two
        # Every reload restarts the topic's counters. An unload also replaces both ledgers; after a
        # crash the cursor keeps the ledger it recovered from (ManagedCursorImpl.recoveredCursor)
        # and opens a new one only at its next mark-delete, which no consumer made here.
        assert "counters-reset" in event["signals"], (case, event)
        assert ("ledgers-replaced" in event["signals"]) == (kind == "unload"), (case, event, *r["broker_log"])
        assert event["broker_before"] == event["broker_after"]
        predicted = event[f"predicted_{kind}_exposure"]
        assert predicted == event["observed_lost"] == event["acks_lost"] == event["backlog_jump"] == r["acked_again"], (case, event)
        assert event["lost_acknowledgements"] == (r["acked_again"] > 0)
        assert event["explained_by"] in (kind, "unload-or-crash")
        # The broker's redelivery counter since the reload: the holes and the lost acknowledgements.
        assert event["msg_out_after"] == r["received"] == holes_count(r) + r["acked_again"]
    if name not in NO_CRASH:
        assert len(results["crash-9"]["reloads"]) == 1  # the crash topics: one reload, not two


def holes_count(r: dict) -> int:
    return r["holes"].ranges + 1


def test_collect_lands_nothing_quarantined(live_holes):
    """collect on the live admin API lands with nothing quarantined (two brokers, eight topics)."""
    landed = live_holes[1]
    assert landed.metrics["quarantined"] == 0, landed.lines
    assert landed.metrics["topic-stats_rows"] > 0 and landed.metrics["internal-stats_rows"] > 0


def _long_array_lost(acked: set[tuple[int, int]]) -> int:
    """Acknowledged entries of the ledgers OpenLongPairRangeSet.toRanges(CAP) leaves out."""
    per_ledger = [sum(1 for ledger, _ in acked if ledger == x) for x in sorted({ledger for ledger, _ in acked})]
    return sum(n for i, n in enumerate(per_ledger) if sum(per_ledger[:i]) > CAP)


def test_alert_mail_says_what_each_reload_lost(live_holes, smtp_server, monkeypatch, spark):
    """The alert mail of the live day has a line for each reload that lost acknowledgements."""
    controller, inbox = smtp_server
    monkeypatch.setenv("BROKERLENS_HOME", live_holes[2])
    configure(monkeypatch, controller.port)
    run_stage("alert", live_holes[3], get_settings(), spark)
    texts = [parts(message)[0] for _, message in inbox.messages]
    lost = [r for cases in live_holes[0].values() for r in cases.values() if r["acked_again"] > 0]
    assert len(lost) == 2 * len(BROKERS) - len(NO_CRASH)  # unload and crash above the cap, on every broker
    for r in lost:
        mail = next(t for t in texts if r["holes"].topic in t)
        block = mail.split(r["holes"].topic + " / ", 1)[1].split("\n[", 1)[0]  # this subscription's alert
        assert f"lost {r['acked_again']} acknowledgements (predicted" in block
    assert sum(t.count("  reload:    at ") for t in texts) == len(lost)
