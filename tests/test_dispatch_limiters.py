"""The two limiters (Pulsar 3.2+'s token bucket and the classic one), each broker's model from its
version or config, Pulsar's own throttle counters, and starved empty periods."""

from __future__ import annotations

from datetime import timedelta

import pytest

from brokerlens.gold.dispatch.daily import dispatch_daily
from brokerlens.gold.dispatch.debt import closing_debt
from brokerlens.gold.dispatch.models import limiter_models
from brokerlens.gold.dispatch.periods import dispatch_periods
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.frames import rows_frame
from dispatch_rows import (
    BROKER,
    CLASSIC,
    D1,
    D2,
    PERIODIC,
    TB,
    at,
    frame,
    interval,
    limit,
    models_frame,
    offset,
    partition,
    periods_of,
)


def one_sub(spark, records, limits, model):
    t = partition("orders", 0)
    return periods_of(
        spark,
        [interval("subscription", s, m, topic=t, subscription="s1") for s, m in records],
        [limit("subscription", q, topic=t, start=a, end=b) for a, b, q in limits],
        model=model,
    )


def test_idle_then_twenty(spark):
    """q 10/s, idle, then 20: a full bucket (10) plus the refill during the second (10) lets all
    20 through; the classic limiter allows 10."""
    tb = one_sub(spark, [(5, 20), (6, 0)], [(0, 86400, 10)], TB)
    classic = one_sub(spark, [(5, 20), (6, 0)], [(0, 86400, 10)], CLASSIC)
    assert [(r["allowed_msgs"], r["over_msgs"]) for r in tb] == [(20, 0), (10, 0)]
    # x = 0 + 20 - 10 = 10: the bucket is empty (tokens 10 - 10 = 0), no debt; next: 0 + 10 refill.
    assert (tb[0]["tokens_out_msgs"], tb[0]["debt_out_msgs"]) == (0, 0)
    assert [(r["allowed_msgs"], r["over_msgs"]) for r in classic] == [(10, 10), (0, 0)]
    assert {r["limiter_model"] for r in tb} == {TB} and {r["limiter_model"] for r in classic} == {CLASSIC}


def test_thirty_after_idle(spark):
    """30 after idle: token bucket over 10 (allowed 20), tokens -10, so 0 allowed next (the refill
    only pays the debt), then 10; classic over 20 and 0, 0 allowed next (seed 002)."""
    records = [(5, 30), (6, 0), (7, 0), (8, 0)]
    tb = one_sub(spark, records, [(0, 86400, 10)], TB)
    classic = one_sub(spark, records, [(0, 86400, 10)], CLASSIC)
    assert [r["allowed_msgs"] for r in tb] == [20, 0, 10, 20]
    assert tb[0]["over_msgs"] == 30 - 20
    # x: 20 after the 30 (tokens -10: debt 10), 10 after the next second (tokens 0), then 0, 0.
    assert [r["debt_out_msgs"] for r in tb] == [10, 0, 0, 0]
    assert [r["tokens_out_msgs"] for r in tb] == [-10, 0, 10, 10]
    assert [r["allowed_msgs"] for r in classic] == [10, 0, 0, 10]
    assert classic[0]["over_msgs"] == 20
    assert [r["starved"] for r in tb] == [False, True, False, False]
    assert [r["starved"] for r in classic] == [False, True, True, False]


def test_seed_examples_hold_under_the_classic_model(spark):
    """Seed 002's 11 -> 9 and 30 -> 0, 0 with the classic model chosen explicitly."""
    eleven = one_sub(spark, [(0, 11), (1, 12)], [(0, 86400, 10)], CLASSIC)
    assert [r["allowed_msgs"] for r in eleven] == [10, 9]
    thirty = one_sub(spark, [(0, 30), (1, 0), (2, 0), (3, 4)], [(0, 86400, 10)], CLASSIC)
    assert [r["allowed_msgs"] for r in thirty] == [10, 0, 0, 10]


def test_policy_change_while_in_debt(spark):
    """Limit 10 -> 20 at second 2 after 30 delivered in second 0. Classic keeps the debt: x 20,
    drained 10 by second 1, so at second 2 debt 10 and allowed 20 - 10 = 10. Token bucket:
    the new rate builds a new, full bucket: no debt, allowed 20 + 20 = 40."""
    records, limits = [(0, 30), (2, 5)], [(0, 2, 10), (2, 86400, 20)]
    classic = one_sub(spark, records, limits, CLASSIC)
    tb = one_sub(spark, records, limits, TB)
    assert (classic[1]["debt_in_msgs"], classic[1]["allowed_msgs"]) == (10, 10)
    # 5 taken from a full bucket of 20 while 20 more arrive: full again at the end.
    assert (tb[1]["debt_in_msgs"], tb[1]["allowed_msgs"], tb[1]["tokens_out_msgs"]) == (0, 40, 20)
    # Before the change both agree with their model: tb 30 over 20 allowed -> debt 10.
    assert (tb[0]["over_msgs"], tb[0]["debt_out_msgs"]) == (10, 10)


def test_periodic_bucket_allows_one_quota_per_period_and_forgives_on_change(spark):
    """The bucket refilled once per period: the classic allowance (30 at 10/s: over 20, debt 20),
    but a new rate builds a new, full bucket: no debt at second 2, allowed 20 (not 40)."""
    periodic = one_sub(spark, [(0, 30), (2, 5)], [(0, 2, 10), (2, 86400, 20)], PERIODIC)
    assert [(r["allowed_msgs"], r["over_msgs"], r["debt_out_msgs"]) for r in periodic] == [(10, 20, 20), (20, 0, 0)]
    assert (periodic[1]["debt_in_msgs"], periodic[1]["tokens_out_msgs"]) == (0, 20)


def test_disabled_limit_discards_the_debt_in_both_models(spark):
    """50 in second 0 at 10/s, limit off in second 1 (100 delivered, nothing over), 10/s again
    from second 2. Without the gap classic would still owe 50 - 10 - 10 - 10 = 20 at second 2
    (allowed 0); with it both start clean: classic allowed 10, token bucket 10 + 10 = 20."""
    records, limits = [(0, 50), (1, 100), (2, 5)], [(0, 1, 10), (1, 2, None), (2, 86400, 10)]
    classic = one_sub(spark, records, limits, CLASSIC)
    tb = one_sub(spark, records, limits, TB)
    assert [r["over_msgs"] for r in classic] == [40, 0, 0]
    assert [r["over_msgs"] for r in tb] == [30, 0, 0]
    assert (classic[2]["debt_in_msgs"], classic[2]["allowed_msgs"]) == (0, 10)
    assert (tb[2]["debt_in_msgs"], tb[2]["allowed_msgs"]) == (0, 20)


@pytest.mark.slow
def test_token_bucket_state_carries_over_midnight(spark):
    """30 in the last second of day 1 (full bucket): x = 20 at midnight = tokens -10. Day 2's
    first second: debt 10, allowed max(0, 10 + 10 - 20) = 0; classic: debt 20, allowed 0."""
    t = partition("orders", 0)
    day1 = [interval("subscription", 86399, 30, topic=t, subscription="s1")]
    limits1 = frame(spark, "rate_limits", [limit("subscription", 10, topic=t)])
    models = models_frame(spark, {BROKER: TB})
    p1 = dispatch_periods(frame(spark, "dispatch_intervals", day1), limits1, None, models)
    closing = closing_debt(p1, limits1, None, D1).first()
    assert (closing["debt_msgs"], closing["limiter_model"]) == (20, TB)
    opening = [closing.asDict()]
    day2 = periods_of(
        spark,
        [interval("subscription", 0, 4, day=D2, topic=t, subscription="s1")],
        [limit("subscription", 10, day=D2, topic=t)],
        opening=opening,
        model=TB,
    )
    assert (day2[0]["debt_in_msgs"], day2[0]["allowed_msgs"], day2[0]["over_msgs"]) == (10, 0, 4)


def metric_row(broker, version, hour=1):
    return {
        "day": D1, "collected_at": at(D1, hour * 3600), "cluster": "c1", "broker": broker,
        "metric": "pulsar_version_info", "metric_type": "gauge",
        "labels": {"cluster": "c1", "version": version, "commit": "abc"}, "value": 1.0,
        "source_file": "metrics/x.prom", "line": 1, "ingested_at": at(D1, hour * 3600),
    }  # fmt: skip


def factory_row(broker, factory, seconds=0):
    return {
        "day": D1, "effective_at": at(D1, seconds), "cluster": "c1", "kind": "broker-config",
        "broker": broker, "removed": False,
        "broker_config": {"dispatchRateLimiterFactoryClassName": factory},
        "source_file": "policies/x.json", "line": 1, "ingested_at": at(D1, 0),
    }  # fmt: skip


@pytest.mark.slow
def test_brokers_of_both_versions_get_their_own_model(spark):
    """Brokers report their version (pulsar_version_info): 3.1 classic; 3.2 to 3.3.4 and 4.0.0 to
    4.0.3 the token bucket refilled every 16 ms; 3.3.5, 4.0.4 and later the bucket refilled once
    per period (a live 4.0.7 broker let 50, not 100, through in the first second after idle at
    50/s). The same 20 after idle is over by 10 on classic and periodic, not on the 16 ms bucket.
    A broker's factory config wins over its version; the settings override wins over both."""
    old, new, pinned = "b31:8080", "b41:8080", "b41c:8080"
    ranges = {"b32:8080": "3.2.1", "b334:8080": "3.3.4", "b335:8080": "3.3.5", "b403:8080": "4.0.3",
              "b404:8080": "4.0.4", "b42:8080": "4.2.4", "b5:8080": "5.0.1"}  # fmt: skip
    factory = "org.apache.pulsar.broker.service.persistent.DispatchRateLimiterFactory"
    brokers = rows_frame(spark, [("c1", b) for b in (old, new, pinned, *ranges)], "cluster string, broker string")
    metrics = frame(
        spark,
        "bronze_metrics",
        [
            metric_row(old, "3.1.2"),
            metric_row(new, "3.0.0", 1),
            metric_row(new, "4.1.0", 2),
            metric_row(pinned, "4.1.0"),
            *[metric_row(b, v) for b, v in ranges.items()],
        ],
    )
    policies = frame(spark, "bronze_policies", [factory_row(pinned, factory + "Classic"), factory_row("b403:8080", factory + "AsyncTokenBucket")])
    models = {r["broker"]: (r["limiter_model"], r["limiter_model_source"])
              for r in limiter_models(brokers, policies, metrics, D1).collect()}  # fmt: skip
    assert models == {
        old: (CLASSIC, "version 3.1.2"),
        new: (PERIODIC, "version 4.1.0"),  # the latest sample of the day (an upgrade at 02:00)
        pinned: (CLASSIC, "broker-config dispatchRateLimiterFactoryClassName"),
        "b32:8080": (TB, "version 3.2.1"), "b334:8080": (TB, "version 3.3.4"),
        "b335:8080": (PERIODIC, "version 3.3.5"), "b404:8080": (PERIODIC, "version 4.0.4"),
        "b42:8080": (PERIODIC, "version 4.2.4"), "b5:8080": (PERIODIC, "version 5.0.1"),
        # The factory key exists only in releases with the periodic bucket.
        "b403:8080": (PERIODIC, "broker-config dispatchRateLimiterFactoryClassName"),
    }  # fmt: skip
    forced = {r["limiter_model"] for r in limiter_models(brokers, policies, metrics, D1, TB).collect()}
    assert forced == {TB}
    tb16 = "b32:8080"
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [{**interval("topic", 5, 20, topic=t), "broker": b} for b in (old, tb16, new)],
        [limit("topic", 10, topic=t)],
        model={b: m for b, (m, _) in models.items()},
    )
    by_broker = {r["broker"]: r for r in rows}
    assert (by_broker[old]["limiter_model"], by_broker[old]["over_msgs"]) == (CLASSIC, 10)
    assert (by_broker[tb16]["limiter_model"], by_broker[tb16]["over_msgs"]) == (TB, 0)
    assert (by_broker[new]["limiter_model"], by_broker[new]["over_msgs"]) == (PERIODIC, 10)
    daily = dispatch_daily(
        dispatch_periods(frame(spark, "dispatch_intervals", [{**interval("topic", 5, 20, topic=t), "broker": b} for b in (old, new)]),
                         frame(spark, "rate_limits", [limit("topic", 10, topic=t)]), None,
                         models_frame(spark, {b: m for b, (m, _) in models.items()})),
        None,
        rows_frame(spark, [], table_schema("debt_state").struct),
        D1,
    )  # fmt: skip
    assert {r["broker"]: r["limiter_model"] for r in daily.collect()} == {old: CLASSIC, new: PERIODIC}


def stats_row(minute, sub, by_sub=None, by_topic=None, by_broker=None, topic=None):
    return {
        "day": D1, "collected_at": at(D1, minute * 60), "cluster": "c1", "broker": BROKER,
        "topic": topic or partition("orders", 0), "subscription": sub,
        "dispatch_throttled_msg_events_by_subscription_limit": by_sub,
        "dispatch_throttled_bytes_events_by_subscription_limit": None if by_sub is None else 0,
        "dispatch_throttled_msg_events_by_topic_limit": by_topic,
        "dispatch_throttled_msg_events_by_broker_limit": by_broker,
        "source_file": "topic-stats/x.json", "ingested_at": at(D1, 0),
    }  # fmt: skip


@pytest.mark.slow
def test_pulsar_throttle_counters_next_to_the_model(spark):
    """PIP-406 counters per scope and day beside the periods the model found exhausted.
    s1: 5 -> 9 -> 2 (reload) -> 6 by the subscription limit: 4 + 2 + 4 = 10 events; s2 by the
    topic limit 1 -> 4: 3, s1's topic-limit counter 0 -> 1 -> 0 (reload) -> 2: 1 + 0 + 2 = 3, so
    the topic scope has 6. Broker
    limit 1 -> 2 on s1: 1. A Pulsar 3.x snapshot (null counters) leaves s3 null."""
    t = partition("orders", 0)
    stats = frame(spark, "bronze_topic_stats", [
        stats_row(0, "s1", 5, 0, 1), stats_row(1, "s1", 9, 1, 1), stats_row(2, "s1", 2, 0, 2),
        stats_row(3, "s1", 6, 2, 2),
        stats_row(0, "s2", 0, 1, 0), stats_row(3, "s2", 0, 4, 0),
        stats_row(0, "s3"), stats_row(3, "s3"),
    ])  # fmt: skip
    from brokerlens.gold.dispatch.daily import throttle_events

    intervals = [interval("subscription", s, m, topic=t, subscription="s1") for s, m in [(0, 30), (1, 0), (2, 5)]]
    intervals += [interval("subscription", 0, 3, topic=t, subscription="s3")]
    limits = frame(spark, "rate_limits", [limit("subscription", 10, topic=t)])
    periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals), limits)
    daily = dispatch_daily(periods, None, closing_debt(periods, limits, None, D1), D1, throttle_events(stats))
    by_sub = {r["subscription"]: r for r in daily.collect()}
    # Classic: 30 >= 10 allowed, 0 >= 0 allowed (debt 20), 5 >= 0 allowed (debt 10): 3 exhausted.
    assert (by_sub["s1"]["periods_exhausted"], by_sub["s1"]["pulsar_throttled_msg_events"]) == (3, 4 + 2 + 4)
    assert by_sub["s1"]["pulsar_throttled_bytes_events"] == 0
    assert (by_sub["s3"]["periods_exhausted"], by_sub["s3"]["pulsar_throttled_msg_events"]) == (0, None)
    events = {(r["level"], r["subscription"]): r["pulsar_throttled_msg_events"] for r in throttle_events(stats).collect()}
    assert events[("topic", None)] == 3 + 3 and events[("broker", None)] == 1


def backlog_rows(spark, points):
    """cursor_snapshots rows: (subscription, seconds from midnight, msg_backlog)."""
    from brokerlens.gold.dispatch.cursors import backlog_intervals

    t = partition("orders", 0)
    rows = [{"day": D1, "snapshot_at": at(D1, sec), "cluster": "c1", "broker": BROKER, "namespace": "tenant/ns",
             "topic": t, "subscription": sub, "ranges_source": "topic-stats", "msg_backlog": n,
             "source_file": "x"} for sub, sec, n in points]  # fmt: skip
    return backlog_intervals(frame(spark, "cursor_snapshots", rows))


@pytest.mark.slow
def test_starved_empty_periods_after_a_counter_row_are_its_bucket_s_net_of_the_credit(spark):
    """Counter rows at 10/s (classic), backlog all along, and no snapshot from second 3 to 10.
    s2: 30 in its first second, a full bucket and the second's refill (20) and 10 more: tokens
    -10, so second 3 allows 0 and second 4 allows 10: 1 starved empty period (the classic count
    of x / limit read a bucket's x as a debt: 2). s1: 2 then 3 first, whose refill the model's cap
    dropped (a credit of 10), so the 30 leave no debt: none."""
    t = partition("orders", 0)
    scraped = {"s1": [(0, 2), (1, 3), (2, 30), (10, 1)], "s2": [(2, 30), (10, 1)]}
    intervals = [interval("subscription", s, m, topic=t, subscription=sub, grain="scrape") for sub, rows in scraped.items() for s, m in rows]
    backlog = backlog_rows(spark, [("s1", 0, 100), ("s2", 0, 100)])
    periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals), frame(spark, "rate_limits", [limit("subscription", 10, topic=t)]),
                               None, models_frame(spark, {BROKER: CLASSIC}), backlog)  # fmt: skip
    rows = {(r["subscription"], offset(r)): r for r in periods.collect()}
    assert (rows[("s1", 2)]["credit_in_msgs"], rows[("s1", 2)]["over_msgs"], rows[("s2", 2)]["over_msgs"]) == (10, 0, 10)
    assert {sub: rows[(sub, 2)]["starved_empty_periods"] for sub in scraped} == {"s1": 0, "s2": 1}


@pytest.mark.slow
def test_starved_counts_empty_periods_with_backlog(spark):
    """30 at second 0 at 10/s, next record at second 10. Classic: x = 20, so seconds 1 and 2 have
    allowance 0 (debt 20, then 10): 2 empty starved periods with backlog (s1: backlog 100 from
    second 0). s2: backlog 0 all along: none. s3: backlog only from second 2: 1. Token bucket:
    x = 20 leaves only second 1 at 0 (2q - 20 = 0; then 2q - 10 = 10): 1. The topic scope
    (backlog summed over s1..s3) is not in the data. The daily count adds them to starved rows."""
    t = partition("orders", 0)
    intervals = [interval("subscription", s, m, topic=t, subscription=sub)
                 for sub in ("s1", "s2", "s3") for s, m in [(0, 30), (10, 1)]]  # fmt: skip
    backlog = backlog_rows(spark, [("s1", 0, 100), ("s2", 0, 0), ("s3", 0, 0), ("s3", 2, 5)])
    limits = [limit("subscription", 10, topic=t)]
    for model, expected in ((CLASSIC, {"s1": 2, "s2": 0, "s3": 1}), (TB, {"s1": 1, "s2": 0, "s3": 0})):
        periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals), frame(spark, "rate_limits", limits),
                                   None, models_frame(spark, {BROKER: model}), backlog)  # fmt: skip
        rows = {(r["subscription"], offset(r)): r for r in periods.collect()}
        assert {sub: rows[(sub, 0)]["starved_empty_periods"] for sub in expected} == expected, model
        assert all(rows[(sub, 10)]["starved_empty_periods"] == 0 for sub in expected)  # 1 msg, no debt
        limits_df = frame(spark, "rate_limits", limits)
        daily = dispatch_daily(periods, None, closing_debt(periods, limits_df, None, D1), D1)
        assert {r["subscription"]: r["periods_starved"] for r in daily.collect()} == expected


@pytest.mark.slow
def test_starved_empty_periods_of_the_opening_debt_up_to_midnight_and_of_a_topic(spark):
    """Classic, 10/s, on one topic partition. s1 owes 35 at midnight and sends next at second 5:
    seconds 0 to 2 allow 0 (35, 25, 15 owed) with backlog, 3 periods on that record. s2 sends 50
    at 86397 s: 40 owed, 4 periods at 0 but only 2 before midnight, its backlog from 86000 s. The
    topic sends 30 at second 0 and 1 at 10: 2 periods at 0, its backlog the sum of s1's and s2's
    (100 + 0 at -5 s, before midnight)."""
    t = partition("orders", 0)
    intervals = [interval("subscription", 5, 0, topic=t, subscription="s1"), interval("subscription", 86397, 50, topic=t, subscription="s2")]
    intervals += [interval("topic", 0, 30, topic=t), interval("topic", 10, 1, topic=t)]
    opening = [{"day": D1 - timedelta(days=1), "level": "subscription", "cluster": "c1", "broker": BROKER, "topic": t,
                "subscription": "s1", "debt_msgs": 35, "debt_bytes": 0}]  # fmt: skip
    backlog = backlog_rows(spark, [("s1", -5, 100), ("s2", -5, 0), ("s2", 86000, 7)])
    periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals),
                               frame(spark, "rate_limits", [limit("subscription", 10, topic=t), limit("topic", 10, topic=t)]),
                               frame(spark, "debt_state", opening), models_frame(spark, {BROKER: CLASSIC}), backlog)  # fmt: skip
    got = {(r["level"], r["subscription"], offset(r)): r["starved_empty_periods"] for r in periods.collect()}
    assert got == {("subscription", "s1", 5): 3, ("subscription", "s2", 86397): 2, ("topic", None, 0): 2, ("topic", None, 10): 0}
