"""A broker's config at a time (gold/brokers.py), the one lookup behind the dispatch limiter model,
the counting rules and the ack-state persistence settings."""

from __future__ import annotations

from datetime import date, datetime, timezone

from pyspark.sql import functions as F

from brokerlens.gold.brokers import broker_config_at
from brokerlens.gold.dispatch.models import config_by_end_of
from brokerlens.platform.frames import rows_frame

K, J = "managedLedgerMaxUnackedRangesToPersist", "dispatchRateLimiterFactoryClassName"
POLICY = "kind string, cluster string, broker string, effective_at timestamp, removed boolean, broker_config map<string,string>"


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=timezone.utc)


def policies(spark):
    return rows_frame(
        spark,
        [
            ("broker-config", "c1", None, at(20, 10), False, {K: "100"}),  # the cluster's, the day before
            ("broker-config", "c1", "b1", at(21, 6), False, {K: "200"}),  # b1's own
            ("broker-config", "c1", "b1", at(21, 12), True, None),  # b1's own config removed
            ("broker-config", "c1", None, at(21, 18), False, {K: "300", J: "x"}),  # the cluster's changes
            ("broker-config", "c1", None, at(22, 0), False, {K: "400"}),  # the next day
            ("broker-config", "c2", None, at(20, 0), False, {K: "999"}),  # another cluster
            ("namespace-dispatch-rate", "c1", None, at(20, 0), False, None),
        ],
        POLICY,
    )


def test_the_value_in_force_at_each_row(spark):
    rows = rows_frame(
        spark,
        [
            (i, "c1", broker, t)
            for i, (broker, t) in enumerate(
                [
                    ("b1", at(21, 5)),  # 0: the cluster's 100 (b1's own not yet)
                    ("b1", at(21, 6)),  # 1: b1's own 200, from its effective_at on
                    ("b1", at(21, 11, 59)),  # 2: still 200
                    ("b1", at(21, 12)),  # 3: b1's removed: the cluster's 100 holds again
                    ("b1", at(21, 23, 59)),  # 4: the cluster's 300 since 18:00
                    ("b2", at(21, 7)),  # 5: b1's record is not b2's: 100
                    ("b2", at(20, 9)),  # 6: before any record: never set
                ]
            )
        ],
        "row int, cluster string, broker string, snapshot_at timestamp",
    )
    got = broker_config_at(rows, policies(spark), [K, J], ["row"], F.col("snapshot_at"))
    values = {r["row"]: (r[K], r[J]) for r in got.collect()}
    assert values == {
        0: ("100", None),
        1: ("200", None),
        2: ("200", None),
        3: ("100", None),
        4: ("300", "x"),
        5: ("100", None),
    }  # row 6 matches no record: absent, the caller's left join gives null


def test_by_the_end_of_the_day_for_every_broker(spark):
    brokers = rows_frame(spark, [("c1", "b1"), ("c1", "b2"), ("c2", "b7"), ("c3", "b9")], "cluster string, broker string")
    got = {(r["cluster"], r["broker"]): r[K] for r in config_by_end_of(brokers, policies(spark), [K], date(2026, 11, 21)).collect()}
    # 400 takes effect at midnight: the next day's, not this day's.
    assert got == {("c1", "b1"): "300", ("c1", "b2"): "300", ("c2", "b7"): "999", ("c3", "b9"): None}
