"""A stats document's values of the wrong JSON type: the reason and detail each gets, and the
values that land (topic-stats and internal-stats read their envelopes through VARIANT).

The cases are those a re-serialising tool or a hand edit produces; the answers are those the
earlier map-then-struct parse gave (kept when land moved to one parse per envelope), except the
two marked "changed"."""

from __future__ import annotations

import json
from datetime import date

import pytest

from brokerlens.land import internal_stats, topic_stats
from brokerlens.land.bronze import land_kind

DAY = date(2026, 11, 21)
SUB = {"msgOutCounter": 5, "type": "Shared", "consumers": [{"a": 1}], "msgRateOut": 1.5}
CURSOR = {"markDeletePosition": "1:2", "readPosition": "1:3", "messagesConsumedCounter": -1, "active": True}


def envelope(topic: str, stats, at="2026-11-21T10:00:00Z") -> dict:
    return {"collected_at": at, "cluster": "c1", "broker": "b1:8080", "topic": topic, "stats": stats}


TOPIC_STATS = [
    envelope("persistent://t/n/a", {"msgInCounter": "123", "subscriptions": {"s": SUB}}),
    envelope("persistent://t/n/b", {"msgInCounter": 1.5, "subscriptions": {"s": SUB}}),
    envelope("persistent://t/n/c", {"msgInCounter": 800.0, "bytesInCounter": 1.2e7, "subscriptions": {"s": SUB}}),
    envelope("persistent://t/n/d", {"msgRateIn": "abc", "subscriptions": {"s": SUB}}),
    envelope("persistent://t/n/e", {"msgRateIn": "NaN", "msgRateOut": "Infinity", "subscriptions": {"s": SUB}}),
    envelope("persistent://t/n/f", {"subscriptions": {"s": {**SUB, "blockedSubscriptionOnUnackedMsgs": "true"}}}),
    envelope("persistent://t/n/g", {"subscriptions": {"s": {**SUB, "msgOutCounter": None}, "t": "abc", "u": 5, "v": None, "w": '{"x":1}'}}),
    envelope("persistent://t/n/h", {"subscriptions": [1, 2]}),
    envelope("persistent://t/n/i", {"publishers": {"a": 1}, "subscriptions": {}}),
    envelope(
        "persistent://t/n/p",
        {
            "partitions": {
                "persistent://t/n/p-partition-0": {"msgInCounter": 1, "publishers": [{"z": 1, "a": 2.50}], "subscriptions": {"s": SUB}},
                "persistent://t/n/p-partition-1": "abc",
                "persistent://t/n/p-partition-2": {"msgInCounter": "x"},
            }
        },
    ),
    envelope("persistent://t/n/q", {"subscriptions": {"s": {**SUB, "msgOutCounter": 12345678901234567890}}}),
    envelope("persistent://t/n/r", {"subscriptions": {"s": SUB}}, at=True),
    envelope("persistent://t/n/s", {"subscriptions": {"s": SUB}}, at="2026-11-21"),
    envelope("persistent://t/n/u", "not an object"),
    {"collected_at": "2026-11-21T10:00:00Z", "cluster": None, "topic": "persistent://t/n/v", "stats": {}},
    5,
    None,
]


@pytest.mark.slow
def test_values_of_another_json_type(spark, settings):
    folder = settings.landing / DAY.isoformat()
    (folder / "topic-stats").mkdir(parents=True)
    # Spaced out as pulsar-admin prints them; the verbatim columns are Jackson's compact text.
    (folder / "topic-stats/types.json").write_text(json.dumps(TOPIC_STATS, indent=2))
    (folder / "internal-stats").mkdir()
    internal = [
        envelope("persistent://t/n/ia", {"ledgers": [{"ledgerId": 1, "entries": "x"}, {"ledgerId": "2", "entries": 3}], "cursors": {"c": CURSOR}}),
        envelope("persistent://t/n/ib", {"cursors": {"c": {**CURSOR, "markDeletePosition": "bad"}, "e": "x"}}),
        envelope("persistent://t/n/ic", {"ledgers": "x", "cursors": {"c": CURSOR}}),
        envelope("non-persistent://t/n/id", {"cursors": {"c": {"active": False}}}),
    ]
    (folder / "internal-stats/types.json").write_text(json.dumps(internal))

    rows, problems = landed(spark, topic_stats, settings)
    assert problems == {
        ("persistent://t/n/b: msgInCounter should be bigint, got 1.5", "wrong-type"),
        ("persistent://t/n/d: msgRateIn should be double, got abc", "wrong-type"),
        ("persistent://t/n/f subscription s: blockedSubscriptionOnUnackedMsgs should be boolean, got true", "wrong-type"),
        ("persistent://t/n/g subscription t: not valid JSON", "malformed-json"),
        ("persistent://t/n/g subscription u: not a JSON object", "malformed-json"),
        ("persistent://t/n/g subscription v: not valid JSON", "malformed-json"),
        # changed: a string holding an object's JSON was read as that object.
        ("persistent://t/n/g subscription w: not a JSON object", "malformed-json"),
        ("persistent://t/n/h: subscriptions should be map<string,string>, got [1,2]", "wrong-type"),
        ('persistent://t/n/i: publishers should be array<string>, got {"a":1}', "wrong-type"),
        ("persistent://t/n/p-partition-1: not valid JSON", "malformed-json"),
        ("persistent://t/n/p-partition-2: msgInCounter should be bigint, got x", "wrong-type"),
        ("persistent://t/n/q subscription s: msgOutCounter should be bigint, got 12345678901234567890", "wrong-type"),
        ("record 12: collected_at should be timestamp, got true", "wrong-type"),
        ("record 14: stats should be map<string,string>, got not an object", "wrong-type"),
        ("record 15: cluster is missing", "missing-field"),
        ("record 16: not a JSON object", "malformed-json"),
        ("record 17: not valid JSON", "malformed-json"),
    }
    # Whole numbers however written, a string holding one, NaN and Infinity as strings.
    assert (rows["persistent://t/n/a", "s"]["topic_msg_in_counter"], rows["persistent://t/n/c", "s"]["topic_bytes_in_counter"]) == (123, 12_000_000)
    assert rows["persistent://t/n/c", "s"]["topic_msg_in_counter"] == 800
    e = rows["persistent://t/n/e", "s"]
    assert e["topic_msg_rate_in"] != e["topic_msg_rate_in"] and e["topic_msg_rate_out"] == float("inf")
    assert rows["persistent://t/n/g", "s"]["msg_out_counter"] is None  # null is absent, not wrong
    assert str(rows["persistent://t/n/s", "s"]["collected_at"]) == "2026-11-21 00:00:00"
    part = rows["persistent://t/n/p-partition-0", "s"]
    assert (part["partitioned_topic"], part["topic_msg_in_counter"], part["publishers"]) == ("persistent://t/n/p", 1, 1)
    # The verbatim columns keep Pulsar's key order and number text.
    assert part["publishers_json"] == '[{"z":1,"a":2.5}]'
    assert part["subscription_json"] == '{"msgOutCounter":5,"type":"Shared","consumers":[{"a":1}],"msgRateOut":1.5}'
    assert len(rows) == 6  # a, c, e, g, s and p-partition-0

    cursors, problems = landed(spark, internal_stats, settings)
    assert problems == {
        ("persistent://t/n/ib cursor c: markDeletePosition should be ledgerId:entryId, got bad", "wrong-type"),
        ("persistent://t/n/ib cursor e: not valid JSON", "malformed-json"),
        ("persistent://t/n/ic: ledgers should be array<struct<ledgerId:bigint,entries:bigint,size:bigint>>, got x", "wrong-type"),
    }
    # changed: a ledger's id given as a string holding a whole number is that number.
    ia = cursors["persistent://t/n/ia", "c"]
    assert (ia["ledger_entries"], ia["current_ledger_id"], ia["messages_consumed_counter"]) == ({1: None, 2: 3}, 2, -1)
    assert cursors["non-persistent://t/n/id", "c"]["mark_delete_position"] is None


def landed(spark, parser, settings) -> tuple[dict, set]:
    """(bronze rows by (topic, child), {(detail, reason)} of the quarantine) of one kind."""
    good, bad, parsed, _ = land_kind(spark, parser, DAY, settings)
    try:
        child = "subscription" if parser is topic_stats else "cursor"
        rows = {(r["topic"], r[child]): r.asDict() for r in good.collect()}
        return rows, {(r["detail"], r["reason"]) for r in bad.collect()}
    finally:
        parsed.unpersist()


# Two topics whose stats differ only in how their numbers are written (as Pulsar writes them, and
# as a re-serialising tool might); then a key given twice (which from_json reads as its last
# value), a negative counter and an unknown subscription type in otherwise clean stats, and
# partitioned stats.
WRITTEN_TWO_WAYS = {
    "persistent://t/n/ta": {"msgInCounter": 7, "msgRateIn": 1.5, "subscriptions": {"s": {"msgOutCounter": 5, "type": "Shared", "consumers": [{}]}}},
    "persistent://t/n/va": {"msgInCounter": "7", "msgRateIn": 1.5, "subscriptions": {"s": {"msgOutCounter": 5.0, "type": "Shared", "consumers": [{}]}}},
}
CLEAN_LOOKING = [
    *(json.dumps(envelope(topic, stats)) for topic, stats in WRITTEN_TWO_WAYS.items()),
    '{"collected_at": "2026-11-21T10:00:00Z", "cluster": "c1", "topic": "persistent://t/n/tb", '
    '"stats": {"subscriptions": {"s": {"msgOutCounter": 1, "msgOutCounter": 2}}}}',
    json.dumps(envelope("persistent://t/n/tc", {"subscriptions": {"s": {**SUB, "msgOutCounter": -1}, "k": {**SUB, "type": "Weird"}}})),
    json.dumps(
        envelope(
            "persistent://t/n/tp", {"partitions": {f"persistent://t/n/tp-partition-{p}": {"msgInCounter": p, "subscriptions": {"s": SUB}} for p in (0, 1)}}
        )
    ),
]


@pytest.mark.slow
def test_clean_looking_stats_are_judged_strictly(spark, settings):
    folder = settings.landing / DAY.isoformat() / "topic-stats"
    folder.mkdir(parents=True)
    (folder / "clean.json").write_text("[" + ",".join(CLEAN_LOOKING) + "]")

    rows, problems = landed(spark, topic_stats, settings)
    assert problems == {
        ("record 3: not valid JSON", "malformed-json"),
        ("persistent://t/n/tc subscription s: msgOutCounter is negative: -1", "negative-counter"),
        ("persistent://t/n/tc subscription k: type {Weird} is not one of Exclusive, Shared, Failover, Key_Shared, None", "unknown-enum"),
    }
    plain, rewritten = rows["persistent://t/n/ta", "s"], rows["persistent://t/n/va", "s"]
    differ = {"topic", "subscription_json"}  # the verbatim text keeps 5.0 as written
    assert {k: v for k, v in plain.items() if k not in differ} == {k: v for k, v in rewritten.items() if k not in differ}
    assert (plain["topic_msg_in_counter"], plain["msg_out_counter"], plain["subscription_type"], plain["consumers"]) == (7, 5, "Shared", 1)
    assert rewritten["subscription_json"] == '{"msgOutCounter":5.0,"type":"Shared","consumers":[{}]}'
    assert [rows[f"persistent://t/n/tp-partition-{p}", "s"]["topic_msg_in_counter"] for p in (0, 1)] == [0, 1]
    assert [rows[f"persistent://t/n/tp-partition-{p}", "s"]["partitioned_topic"] for p in (0, 1)] == ["persistent://t/n/tp"] * 2
    assert len(rows) == 4  # ta, va, tp-partition-0 and -1
