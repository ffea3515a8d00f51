"""Land's one-pass stats reader (StatsEnvelopeRows.scala) gives the general parser's rows exactly,
on every file it takes, and leaves every file the general parser has something to say about to it,
for topic stats and internal stats.

The reference is the general parser alone (topic_stats.parse, internal_stats.parse:
envelope.explode_children, every file through the VARIANT). Rows are compared as their repr, so that a double's last bit and its sign (-0.0) count.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import date
from pathlib import Path

from pyspark.sql import functions as F

from brokerlens.land import internal_stats, topic_stats
from brokerlens.land.bronze import _records_of, land_kind
from brokerlens.land.envelope import has_copies
from brokerlens.land.files import read_whole
from brokerlens_bench.large_files import write_large_day

FIXTURES = Path(__file__).parent / "fixtures"
DAY = date(2026, 11, 21)
REAL_TOPIC_STATS = {
    "v2-topic-stats-type-null.json": "persistent://my-tenant/my-namespace/my-topic",
    "v2.7-topic-stats-chucked.json": "persistent://public/default/test",
    "v4.1-topic-stats.json": "persistent://public/default/pt-zgc-partition-1",
    "v4.0.7-topic-stats-type-none.json": "persistent://public/default/unloaded",
    "v2-partitioned-stats-no-partitions.json": "persistent://public/default/parted",
}


def envelope(stats: str, topic: str = "persistent://t/ns/x", at: str = f"{DAY}T10:00:00Z") -> str:
    return f'{{"collected_at": "{at}", "cluster": "c1", "broker": "b-1:8080", "topic": "{topic}", "stats": {stats}}}'


def subscription(**fields) -> dict:
    return {"type": "Shared", "msgOutCounter": 10, "msgRateOut": 1.5, "consumers": [{"consumerName": "c"}], **fields}


def random_numbers(n: int = 600, seed: int = 5) -> str:
    """Subscriptions whose doubles are written as decimals of up to 40 digits and in scientific
    notation: the general parser reads a decimal through Spark's DECIMAL, the reader through
    Jackson's double (and 1 in 4 of its counters as a whole number written as a fraction)."""
    rng = random.Random(seed)

    def decimal() -> str:
        whole, fraction = str(rng.randrange(10 ** rng.randrange(1, 20))), str(rng.randrange(10 ** rng.randrange(1, 21))).zfill(rng.randrange(1, 22))
        return rng.choice([f"{whole}.{fraction}", f"{whole}.{fraction}e{rng.randrange(-30, 30)}", f"0.{fraction}"])

    subs = {}
    for i in range(n):
        counter = rng.randrange(2**53)
        negative = decimal()
        negative = f"-{negative}" if float(negative) else negative  # -0.0 is the general parser's
        subs[f"s{i}"] = (
            f'{{"msgRateOut": {decimal()}, "msgThroughputOut": {decimal()}, "msgRateRedeliver": {negative}, "msgOutCounter": {counter}{".0" if i % 4 == 0 else ""}}}'
        )
    return envelope('{"subscriptions": {' + ", ".join(f'"{k}": {v}' for k, v in subs.items()) + "}}")


# Files the reader takes: the numbers and texts where a re-rendering could differ.
TAKEN = {
    "numbers.json": envelope(
        '{"msgRateIn": 1e2, "msgRateOut": 0.1, "averageMsgSize": 1E-7, "msgInCounter": 9007199254740993, '
        '"storageSize": 0, "backlogSize": -1, "publishers": [{"producerName": "p\\u00e9\\t\\"q\\"", "msgRateIn": 2.50}], '
        '"subscriptions": {"s\\u2603": {"type": "Key_Shared", "msgRateOut": 123456789.123456789, "msgThroughputOut": 0.30000000000000004, '
        '"msgRateRedeliver": 5e-324, "msgBacklog": 3, "blockedSubscriptionOnUnackedMsgs": true, "consumers": [], '
        '"nested": {"a": [1, 2.0, -3.5e10, "x", null, false]}}}}'
    ),
    "whole-as-fraction.json": envelope('{"msgInCounter": 800.0, "bytesInCounter": 3.5E4, "storageSize": -2.0}'),
    "nulls.json": envelope('{"msgRateIn": null, "publishers": null, "subscriptions": {"s": {"type": null, "msgOutCounter": null, "consumers": null}}}'),
    "no-subscriptions.json": "["
    + envelope('{"msgRateIn": 1.0, "subscriptions": {}}')
    + ","
    + envelope('{"msgRateIn": 2.0}', topic="persistent://t/ns/y-partition-3")
    + "]",
    "unloaded.json": envelope(json.dumps({"subscriptions": {"s": subscription(type="None")}})),
    # The consumers' messages per entry: over the figures of at least 1, whole or not, in order.
    "per-entry.json": envelope(
        json.dumps(
            {
                "subscriptions": {
                    "mixed": subscription(
                        consumers=[{"avgMessagesPerEntry": 0}, {"avgMessagesPerEntry": 1.5}, {"avgMessagesPerEntry": 3}, {"avgMessagesPerEntry": None}, {}]
                    ),
                    "new": subscription(consumers=[{"avgMessagesPerEntry": 0.0}]),
                    "thirds": subscription(consumers=[{"avgMessagesPerEntry": 0.1 + 0.2 + 1}, {"avgMessagesPerEntry": 7}, {"avgMessagesPerEntry": 1e300}]),
                }
            }
        )
    ),
    "random-numbers.json": random_numbers(),
    "partitioned.json": envelope(
        json.dumps(
            {
                "msgRateIn": 99.0,
                "metadata": {"partitions": 2},
                "partitions": {
                    f"persistent://t/ns/p-partition-{i}": {"msgRateIn": float(i), "subscriptions": {"s": subscription(msgOutCounter=i)}} for i in range(2)
                },
            },
            indent=2,
        ),
        topic="persistent://t/ns/p",
    ),
}


# Files the general parser must read: it quarantines something in each, or reads a value the
# reader does not (a number written as a string, -0.0, a timestamp in epoch seconds).
LEFT = {
    "number-as-string.json": envelope('{"subscriptions": {"s": {"type": "Shared", "msgBacklog": "12"}}}'),
    "per-entry-as-text.json": envelope(json.dumps({"subscriptions": {"s": subscription(consumers=[{"avgMessagesPerEntry": "2.5"}])}})),
    "negative-zero.json": envelope('{"msgRateIn": -0.0}'),
    "negative-counter.json": envelope('{"msgInCounter": -1}'),
    "unknown-type.json": envelope(json.dumps({"subscriptions": {"s": subscription(type="Broadcast")}})),
    "wrong-type.json": envelope('{"subscriptions": {"s": {"msgRateOut": true}}}'),
    "duplicate-key.json": envelope('{"msgRateIn": 1.0, "msgRateIn": 2.0}'),
    "nan.json": envelope('{"msgRateIn": NaN}'),
    "trailing.json": envelope("{}") + " x",
    "not-an-object.json": "[" + envelope("{}") + ", 3]",
    "outside-day.json": envelope("{}", at="2026-11-22T00:00:00Z"),
    "epoch-seconds.json": envelope("{}").replace(f'"{DAY}T10:00:00Z"', "1795255200"),
    "missing-cluster.json": envelope("{}").replace('"cluster": "c1", ', ""),
    "subscription-not-object.json": envelope('{"subscriptions": {"s": 1}}'),
    "publishers-not-objects.json": envelope('{"publishers": [1]}'),
    "partition-not-object.json": envelope('{"partitions": {"persistent://t/ns/p-partition-0": []}}', topic="persistent://t/ns/p"),
    "empty-array.json": "[]",
    "single-quotes.json": envelope("{'msgRateIn': 1.0}"),
}


def landing(tmp_path: Path, kind: str, real: dict[str, str], taken: dict[str, str], left: dict[str, str], large_files: int) -> Path:
    """Every file of ``kind`` the tests know, in one folder: the fixture day's, Pulsar's real
    outputs (``real``: file → topic), ``taken`` and ``left``, and the large day's first 2 minutes
    of 20 partitions (``large_files`` files)."""
    folder = tmp_path / "landing" / DAY.isoformat() / kind
    folder.mkdir(parents=True)
    for path in (FIXTURES / "landing" / DAY.isoformat() / kind).glob("*.json"):
        if path.name != "binary.json":  # not text: the survey keeps it from Spark
            shutil.copyfile(path, folder / path.name)
    for name, topic in real.items():
        (folder / f"real-{name}").write_text(envelope((FIXTURES / "real" / name).read_text(), topic=topic))
    for name, text in {**taken, **left}.items():
        (folder / name).write_text(text)
    write_large_day(tmp_path / "large", DAY, partitions=20, minutes=2)
    large = sorted((tmp_path / "large" / DAY.isoformat() / kind).glob("*.json"))
    assert len(large) == large_files
    for path in large:
        shutil.copyfile(path, folder / f"large-{path.name}")
    return folder


def same_rows(spark, parser, folder: Path, real: dict[str, str], taken: dict[str, str], left: dict[str, str], min_rows: int):
    """The reader's rows plus the general parser's of the files it left (as land has them) equal
    the general parser's of every file, repr for repr; the reader leaves exactly ``left`` and the
    fixture day's bad files, and takes ``taken``, the ``real`` ones and the large day's. Gives
    (the reader's read, those rows)."""
    records = read_whole(spark, sorted(folder.iterdir()))
    read = parser.read(records, DAY)
    left_names = {name.split("/")[-1] for name in read.left}
    taken_names = {r["source_file"].split("/")[-1] for r in read.rows.select("source_file").distinct().collect()}
    expected_left = set(left) | {p.name for p in folder.glob("bad-*.json")}
    assert left_names == expected_left, left_names ^ expected_left
    assert set(taken) | {f"real-{n}" for n in real} | {p.name for p in folder.glob("large-*")} <= taken_names

    general = parser.parse(records, DAY, duplicates=False)
    both = read.rows.unionByName(parser.parse(records.where(F.col("source_file").isin(*read.left)), DAY, duplicates=False))
    assert general.schema.simpleString() == both.schema.simpleString()
    columns = [c for c in general.columns if c != "ingested_at"]
    expected = sorted(repr(r) for r in general.select(columns).collect())
    got = sorted(repr(r) for r in both.select(columns).collect())
    assert len(got) == len(expected) > min_rows
    assert got == expected
    return read, both


def test_the_reader_gives_the_general_parsers_rows_and_leaves_it_every_problem(spark, tmp_path):
    folder = landing(tmp_path, "topic-stats", REAL_TOPIC_STATS, TAKEN, LEFT, large_files=20)  # 2 minutes x 10 brokers
    read, both = same_rows(spark, topic_stats, folder, REAL_TOPIC_STATS, TAKEN, LEFT, min_rows=750)
    # payments.retry.json is a copy of payments.json, whichever parser read them: land parses again.
    assert has_copies(both)
    # The reader's rows hold what the files say (not only what the general parser says too).
    numbers = {r["subscription"]: r for r in both.where("source_file LIKE '%/numbers.json'").collect()}
    s = numbers["s\u2603"]
    assert (s["topic_msg_rate_in"], s["topic_average_msg_size"], s["topic_msg_in_counter"], s["backlog_size"]) == (100.0, 1e-7, 9007199254740993, -1)
    assert (s["subscription_type"], s["msg_rate_redeliver"], s["msg_throughput_out"], s["consumers"], s["publishers"]) == (
        "Key_Shared",
        5e-324,
        0.30000000000000004,
        0,
        1,
    )
    assert json.loads(s["subscription_json"])["nested"] == {"a": [1, 2.0, -3.5e10, "x", None, False]}
    assert json.loads(s["publishers_json"]) == [{"producerName": 'p\u00e9\t"q"', "msgRateIn": 2.5}]
    per_entry = {r["subscription"]: r["consumers_msgs_per_entry"] for r in both.where("source_file LIKE '%/per-entry.json'").collect()}
    assert per_entry == {"mixed": 2.25, "new": None, "thirds": (0.1 + 0.2 + 1 + 7 + 1e300) / 3}
    partitions = both.where("source_file LIKE '%/partitioned.json'").orderBy("topic").collect()
    assert [(r["topic"], r["partitioned_topic"], r["topic_msg_rate_in"], r["msg_out_counter"]) for r in partitions] == [
        (f"persistent://t/ns/p-partition-{i}", "persistent://t/ns/p", float(i), i) for i in range(2)
    ]
    read.scanned.unpersist()


REAL_INTERNAL_STATS = {
    "v4.1-internal-stats.json": "persistent://public/default/pt-zgc-partition-1",
    "v2-internal-stats-old-ranges.json": "persistent://my-tenant/my-namespace/my-topic",
    "v2-internal-stats-non-persistent.json": "non-persistent://public/default/np",
}


def cursor(**fields) -> dict:
    return {"markDeletePosition": "7:3", "readPosition": "7:4", "individuallyDeletedMessages": "[(7:5..7:9]]", "messagesConsumedCounter": 9, **fields}


def internal(ledgers, cursors: dict, topic: str = "persistent://t/ns/x", **fields) -> str:
    return envelope(json.dumps({"entriesAddedCounter": 12, "currentLedgerEntries": 2, "ledgers": ledgers, "cursors": cursors, **fields}), topic=topic)


LEDGERS = [{"ledgerId": 7, "entries": 10, "size": 1000, "offloaded": False}, {"ledgerId": 9, "entries": 0}]
# Internal-stats files the reader takes: ledgers with other keys, nulls and another key's case,
# cursors of a non-persistent topic without positions, a negative messagesConsumedCounter.
TAKEN_INTERNAL = {
    "ledgers.json": internal(
        LEDGERS + [{"ledgerId": 11, "entries": None, "size": 5}, {"LedgerId": 12, "entries": 1}], {"s": cursor(messagesConsumedCounter=-1)}
    ),
    "no-ledgers.json": internal(None, {"s": cursor(readPosition=None)}) + "\n",
    "empty-ledgers.json": internal([], {}),
    "non-persistent.json": internal(None, {"s": cursor(markDeletePosition=None, readPosition=None)}, topic="non-persistent://t/ns/np"),
    "partitioned.json": envelope(
        json.dumps(
            {
                "metadata": {"partitions": 2},
                "partitions": {f"persistent://t/ns/p-partition-{i}": json.loads(internal(LEDGERS, {"s": cursor()}))["stats"] for i in range(2)},
            }
        ),
        topic="persistent://t/ns/p",
    ),
}
# Files the general parser must read: a position missing or not ledgerId:entryId, a ledger's
# number written otherwise than as a whole number, ledgers that are not objects.
LEFT_INTERNAL = {
    "no-mark-delete.json": internal(LEDGERS, {"s": cursor(markDeletePosition=None)}),
    "bad-read-position.json": internal(LEDGERS, {"s": cursor(readPosition="7-4")}),
    "position-number.json": internal(LEDGERS, {"s": cursor(markDeletePosition=7)}),
    "ledger-fraction.json": internal([{"ledgerId": 7, "entries": 10.0}], {"s": cursor()}),
    "ledger-as-text.json": internal([{"ledgerId": "7", "entries": 10}], {"s": cursor()}),
    "ledger-not-object.json": internal([7], {"s": cursor()}),
    "ledgers-object.json": internal({"ledgerId": 7}, {"s": cursor()}),
    "negative-entries-added.json": internal(LEDGERS, {"s": cursor()}, entriesAddedCounter=-1),
    "cursor-not-object.json": internal(LEDGERS, {"s": "7:3"}),
}


def test_the_reader_gives_internal_stats_as_the_general_parser_does(spark, tmp_path):
    folder = landing(tmp_path, "internal-stats", REAL_INTERNAL_STATS, TAKEN_INTERNAL, LEFT_INTERNAL, large_files=10)  # one round of 10 brokers
    read, both = same_rows(spark, internal_stats, folder, REAL_INTERNAL_STATS, TAKEN_INTERNAL, LEFT_INTERNAL, min_rows=80)
    # The reader's rows hold what the files say: ledgers by id, the last one's id the current ledger.
    [row] = both.where("source_file LIKE '%/ledgers.json'").collect()
    assert (row["ledger_entries"], row["current_ledger_id"], row["messages_consumed_counter"]) == ({7: 10, 9: 0, 11: None}, 11, -1)
    assert (row["mark_delete_position"], row["read_position"], row["individually_deleted_messages"]) == ("7:3", "7:4", "[(7:5..7:9]]")
    [row] = both.where("source_file LIKE '%/non-persistent.json'").collect()
    assert (row["topic"], row["cursor"], row["mark_delete_position"], row["ledger_entries"]) == ("non-persistent://t/ns/np", "s", None, None)
    read.scanned.unpersist()


def test_land_reads_again_the_files_the_reader_left_whatever_their_names(spark, settings):
    """The general parser gets the files the reader left, each once, whatever their names (a
    space, "%" and "+" are escaped or not in a file's URI): nothing is dropped or landed twice,
    and each row names its file as it is on disk."""
    folder = settings.landing / DAY.isoformat() / "topic-stats"
    folder.mkdir(parents=True)
    names = {
        "taken a+b.json": TAKEN["nulls.json"],
        "nan a+b.json": LEFT["nan.json"],  # left by the reader, landed by the general parser
        "bad 100%.json": LEFT["unknown-type.json"],
        "bad.json": LEFT["missing-cluster.json"],
    }
    for name, text in names.items():
        (folder / name).write_text(text)
    landed = land_kind(spark, topic_stats, DAY, settings)
    try:
        good = sorted((r["source_file"].split("/")[-1], r["subscription"], str(r["topic_msg_rate_in"])) for r in landed.good.collect())
        bad = sorted((r["source_file"].split("/")[-1], r["reason"]) for r in landed.bad.collect())
    finally:
        landed.parsed.unpersist()
    assert good == [("nan a+b.json", None, "nan"), ("taken a+b.json", "s", "None")]
    assert bad == [("bad 100%.json", "unknown-enum"), ("bad.json", "missing-field")]
    # Should Spark name a file otherwise than by its path, its records are taken from the day's.
    records = read_whole(spark, sorted(folder.iterdir()))
    named = frozenset({f"{DAY}/topic-stats/bad.json", f"{DAY}/topic-stats/nan a+b.json"})
    assert sorted(r["source_file"] for r in _records_of(spark, [], records, named).collect()) == sorted(named)
