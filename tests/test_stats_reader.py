"""Land's one-pass stats reader (StatsEnvelopeRows.scala) gives the general parser's rows exactly,
on every file it takes, and leaves every file the general parser has something to say about to it.

The reference is the general parser alone (topic_stats.parse: envelope.explode_children, every
file through the VARIANT). Rows are compared as their repr, so that a double's last bit and its sign (-0.0) count.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import date
from pathlib import Path

from pyspark.sql import functions as F

from brokerlens.land import topic_stats
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


def landing(tmp_path: Path) -> Path:
    """Every kind of topic-stats file the tests know, in one folder."""
    folder = tmp_path / "landing" / DAY.isoformat() / "topic-stats"
    folder.mkdir(parents=True)
    for path in (FIXTURES / "landing" / DAY.isoformat() / "topic-stats").glob("*.json"):
        if path.name != "binary.json":  # not text: the survey keeps it from Spark
            shutil.copyfile(path, folder / path.name)
    for name, topic in REAL_TOPIC_STATS.items():
        (folder / f"real-{name}").write_text(envelope((FIXTURES / "real" / name).read_text(), topic=topic))
    for name, text in {**TAKEN, **LEFT}.items():
        (folder / name).write_text(text)
    write_large_day(tmp_path / "large", DAY, partitions=20, minutes=2)
    for path in (tmp_path / "large" / DAY.isoformat() / "topic-stats").glob("*.json"):
        shutil.copyfile(path, folder / f"large-{path.name}")
    return folder


def test_the_reader_gives_the_general_parsers_rows_and_leaves_it_every_problem(spark, tmp_path):
    folder = landing(tmp_path)
    records = read_whole(spark, sorted(folder.iterdir()))

    read = topic_stats.read(records, DAY)
    left = {name.split("/")[-1] for name in read.left}
    taken = {r["source_file"].split("/")[-1] for r in read.rows.select("source_file").distinct().collect()}
    bad_fixtures = {p.name for p in folder.glob("bad-*.json")}
    assert left == set(LEFT) | bad_fixtures, left ^ (set(LEFT) | bad_fixtures)
    assert set(TAKEN) | {f"real-{n}" for n in REAL_TOPIC_STATS} <= taken
    assert sum(n.startswith("large-") for n in taken) == 20  # 2 minutes x 10 brokers

    general = topic_stats.parse(records, DAY, duplicates=False)
    # As land has it: the general parser reads again only the files the reader left.
    both = read.rows.unionByName(topic_stats.parse(records.where(F.col("source_file").isin(*read.left)), DAY, duplicates=False))
    assert general.schema.simpleString() == both.schema.simpleString()
    columns = [c for c in general.columns if c != "ingested_at"]
    expected = sorted(repr(r) for r in general.select(columns).collect())
    got = sorted(repr(r) for r in both.select(columns).collect())
    assert len(got) == len(expected) > 750
    assert got == expected
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
    partitions = both.where("source_file LIKE '%/partitioned.json'").orderBy("topic").collect()
    assert [(r["topic"], r["partitioned_topic"], r["topic_msg_rate_in"], r["msg_out_counter"]) for r in partitions] == [
        (f"persistent://t/ns/p-partition-{i}", "persistent://t/ns/p", float(i), i) for i in range(2)
    ]
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
