"""What Pulsar charges to the limiter: non-backlog consumers and filtered entries, from settings
or a broker's config."""

from __future__ import annotations

import pytest

import json

from pyspark.sql import functions as F

from brokerlens.gold.dispatch.daily import dispatch_daily
from brokerlens.gold.dispatch.debt import closing_debt
from brokerlens.gold.dispatch.periods import dispatch_periods
from brokerlens.silver.intervals import counter_intervals, counter_snapshots, with_msgs_per_entry
from dispatch_rows import BROKER, CLASSIC, D1, at, frame, interval, limit, offset, partition
from brokerlens.platform.frames import rows_frame


def rules_frame(spark, non_backlog: bool, filtered: bool = False, threshold: int = 1000):
    """limiter_models joined with counting_rules for BROKER, as _day_models returns them."""
    return rows_frame(
        spark,
        [("c1", BROKER, CLASSIC, "test", non_backlog, filtered, threshold, "test")],
        "cluster string, broker string, limiter_model string, limiter_model_source string, "
        "throttle_non_backlog boolean, throttle_filtered boolean, cursor_backlogged_threshold bigint, "
        "counting_rules_source string",
    )


def cursor_rows(spark, points):
    """cursor_snapshots rows: (subscription, seconds from midnight, msg_backlog, consumers)."""
    t = partition("orders", 0)
    rows = [{"day": D1, "snapshot_at": at(D1, sec), "cluster": "c1", "broker": BROKER, "namespace": "tenant/ns",
             "topic": t, "subscription": sub, "ranges_source": "topic-stats", "msg_backlog": n, "consumers": c,
             "source_file": "x"} for sub, sec, n, c in points]  # fmt: skip
    return frame(spark, "cursor_snapshots", rows)


@pytest.mark.slow
def test_non_backlog_consumers_are_not_charged_when_the_rule_is_off(spark):
    """q 10/s, 30 delivered at second 1 to each subscription. dispatchThrottlingOnNonBacklogConsumerEnabled
    false: s1 is caught up (1 consumer, backlog 0 < 1000 at second 0): not charged, over 0, debt 0,
    and the 5 at second 2 are not charged either. s2 is backlogged (backlog 1500 >= 1000): charged,
    over 30 - 10 = 20, debt 20, so second 2 allows 0 and 5 are over. s3 has no snapshot: charged
    (unknown). The topic (s1 caught up, s2 not) is charged in full: 90 - 10 = 80 over, flagged
    partly. With the rule on (Pulsar's default) s1 is over 20 like the others."""
    from brokerlens.gold.dispatch.cursors import cursor_states

    t = partition("orders", 0)
    intervals = [interval("subscription", s, m, topic=t, subscription=sub)
                 for sub in ("s1", "s2", "s3") for s, m in [(1, 30), (2, 5)]]  # fmt: skip
    intervals += [interval("topic", 1, 90, topic=t)]
    limits = [limit("subscription", 10, topic=t), limit("topic", 10, topic=t)]
    snaps = cursor_rows(spark, [("s1", 0, 0, 1), ("s2", 0, 1500, 1)])
    for rule_on in (False, True):
        models = rules_frame(spark, non_backlog=rule_on)
        periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals), frame(spark, "rate_limits", limits),
                                   None, models, None, cursor_states(snaps, models))  # fmt: skip
        rows = {(r["level"], r["subscription"], offset(r)): r for r in periods.collect()}
        got = {k: (r["counted_msgs"], r["over_msgs"], r["debt_out_msgs"], r["charge_rule"]) for k, r in rows.items()}
        if rule_on:
            assert got[("subscription", "s1", 1)] == (30, 20, 20, "charged")
            assert got[("subscription", "s1", 2)] == (5, 5, 20 - 10 + 5, "charged")  # allowed 0
            continue
        assert got[("subscription", "s1", 1)] == (0, 0, 0, "not-charged-caught-up")
        assert got[("subscription", "s1", 2)] == (0, 0, 0, "not-charged-caught-up")
        assert rows[("subscription", "s1", 1)]["counted_bytes"] == 0 and not rows[("subscription", "s1", 2)]["starved"]
        assert got[("subscription", "s2", 1)] == (30, 20, 20, "charged")
        assert got[("subscription", "s2", 2)] == (5, 5, 15, "charged")
        assert got[("subscription", "s3", 1)] == (30, 20, 20, "charged-backlog-unknown")
        assert got[("topic", None, 1)] == (90, 80, 80, "charged-partly-caught-up")
        limits_df = frame(spark, "rate_limits", limits)
        daily = dispatch_daily(periods, None, closing_debt(periods, limits_df, None, D1), D1, None, models)
        by_sub = {r["subscription"]: r for r in daily.collect() if r["level"] == "subscription"}
        # s1: both rows not charged, never exhausted; s2: 30 >= 10 and 5 >= 0: 2 exhausted.
        assert (by_sub["s1"]["periods_not_charged"], by_sub["s1"]["periods_exhausted"]) == (2, 0)
        assert (by_sub["s2"]["periods_not_charged"], by_sub["s2"]["periods_exhausted"]) == (0, 2)
        # s2's 15 drain at 10/s through the rest of the day.
        assert by_sub["s1"]["closing_debt_msgs"] == 0 and by_sub["s2"]["closing_debt_msgs"] == 0
        assert {r["limiter_model_source"] for r in daily.collect()} == {"test"}


@pytest.mark.slow
def test_cursor_turning_backlogged_starts_charging(spark):
    """Rule off, threshold 100. s1 caught up (backlog 50) at second 0, backlogged (backlog 100,
    consumers 2) from second 2, caught up again (backlog 0) at second 4. 30 delivered in each of
    seconds 1..4 at q 10/s: seconds 1 and 4 not charged; seconds 2 and 3 charged: 30 over 10
    allowed = 20 over (debt 20), then allowed 0, 30 over (debt 20 - 10 + 30 = 40); second 4 is
    not charged and owes 40 - 10 = 30 after it (the debt drains, nothing is added)."""
    from brokerlens.gold.dispatch.cursors import cursor_states

    t = partition("orders", 0)
    intervals = [interval("subscription", s, 30, topic=t, subscription="s1") for s in (1, 2, 3, 4)]
    models = rules_frame(spark, non_backlog=False, threshold=100)
    snaps = cursor_rows(spark, [("s1", 0, 50, 1), ("s1", 2, 100, 2), ("s1", 4, 0, 1)])
    periods = dispatch_periods(frame(spark, "dispatch_intervals", intervals),
                               frame(spark, "rate_limits", [limit("subscription", 10, topic=t)]),
                               None, models, None, cursor_states(snaps, models))  # fmt: skip
    rows = sorted(periods.collect(), key=offset)
    assert [r["counted_msgs"] for r in rows] == [0, 30, 30, 0]
    assert [r["over_msgs"] for r in rows] == [0, 20, 30, 0]
    assert [r["debt_out_msgs"] for r in rows] == [0, 20, 40, 30]


@pytest.mark.slow
def test_filtered_entries_rule_flags_a_lower_bound(spark):
    """dispatchThrottlingForFilteredEntriesEnabled true: Pulsar also charges filtered entries,
    which the landing has no per-period count of: the 30 delivered are counted (over 30 - 10 =
    20), flagged as a lower bound; false (the default): the same numbers, exact."""
    t = partition("orders", 0)
    for filtered in (True, False):
        periods = dispatch_periods(frame(spark, "dispatch_intervals", [interval("subscription", 1, 30, topic=t, subscription="s1")]),
                                   frame(spark, "rate_limits", [limit("subscription", 10, topic=t)]),
                                   None, rules_frame(spark, non_backlog=True, filtered=filtered))  # fmt: skip
        r = periods.first()
        assert (r["counted_msgs"], r["over_msgs"], r["filtered_entries_charged"], r["charge_rule"]) == (30, 20, filtered, "charged")


def test_counting_rules_from_broker_config_over_settings(spark):
    """b1's own config turns the non-backlog rule off and sets the threshold to 500; a cluster-wide
    record turns filtered entries on for every broker; b2 has only that, the rest from settings
    (a non-backlog default of false here); b3 set the non-backlog rule on, then removed its
    config: settings again."""
    from brokerlens.gold.dispatch.models import counting_rules

    def cfg(broker, config, seconds=0, removed=False):
        return {"day": D1, "effective_at": at(D1, seconds), "cluster": "c1", "kind": "broker-config",
                "broker": broker, "removed": removed, "broker_config": config,
                "source_file": "policies/x.json", "line": 1, "ingested_at": at(D1, 0)}  # fmt: skip

    policies = frame(spark, "bronze_policies", [
        cfg("b1", {"dispatchThrottlingOnNonBacklogConsumerEnabled": "false", "managedLedgerCursorBackloggedThreshold": "500"}),
        cfg(None, {"dispatchThrottlingForFilteredEntriesEnabled": "true"}),
        cfg("b3", {"dispatchThrottlingOnNonBacklogConsumerEnabled": "true"}, 0),
        cfg("b3", None, 60, removed=True),
    ])  # fmt: skip
    brokers = rows_frame(spark, [("c1", b) for b in ("b1", "b2", "b3")], "cluster string, broker string")
    rules = {r["broker"]: r.asDict() for r in counting_rules(
        brokers, policies, D1, {"dispatchThrottlingOnNonBacklogConsumerEnabled": False}).collect()}  # fmt: skip
    pick = lambda b: (rules[b]["throttle_non_backlog"], rules[b]["throttle_filtered"], rules[b]["cursor_backlogged_threshold"])  # noqa: E731
    assert pick("b1") == (False, True, 500)
    assert rules["b1"]["counting_rules_source"] == (
        "broker-config dispatchThrottlingOnNonBacklogConsumerEnabled, dispatchThrottlingForFilteredEntriesEnabled, managedLedgerCursorBackloggedThreshold"
    )
    assert pick("b2") == (False, True, 1000)
    assert rules["b2"]["counting_rules_source"] == "broker-config dispatchThrottlingForFilteredEntriesEnabled"
    assert pick("b3") == (False, True, 1000)


@pytest.mark.slow
def test_batched_burst_in_counters_is_put_down_to_batching(spark):
    """Only topic-stats counters: 250 messages in 5-message batches in one second over 50/s (150
    over after the snapshot interval's slack of one period). The consumers' avgMessagesPerEntry
    gives the entries (50), so the over is batching, not 'other' (what brokerlens said before it
    read them); without a consumer's figure, 'other'."""
    t = partition("orders", 0)

    def snap(second, counter, per_entry):
        consumers = [] if per_entry is None else [{"avgMessagesPerEntry": per_entry, "msgOutCounter": counter}]
        return {
            "day": D1, "collected_at": at(D1, second), "cluster": "c1", "broker": BROKER, "topic": t,
            "subscription": "s1", "msg_out_counter": counter, "bytes_out_counter": counter * 100,
            "topic_msg_out_counter": counter, "topic_bytes_out_counter": counter * 100,
            "subscription_json": json.dumps({"msgOutCounter": counter, "consumers": consumers}),
            "source_file": "topic-stats/x.json", "ingested_at": at(D1, 0),
        }  # fmt: skip

    def judged(snaps):
        stats = frame(spark, "bronze_topic_stats", snaps)
        intervals = counter_intervals(counter_snapshots(with_msgs_per_entry(stats)), "topic-stats-counters").withColumn("day", F.lit(D1))
        limits = frame(spark, "rate_limits", [limit("subscription", 50, topic=t)])
        periods = dispatch_periods(intervals, limits)
        daily = dispatch_daily(periods, None, closing_debt(periods, limits, None, D1), D1)
        return periods.where("level = 'subscription'").first(), daily.where("level = 'subscription'").first()

    # A consumer reports 0 until it has been sent something: the interval's end has the figure.
    period, daily = judged([snap(0, 0, 0), snap(1, 250, 5)])
    assert (period["msgs"], period["entries"], period["over_msgs"], period["over_batch_msgs"]) == (250, 50, 150, 150)
    assert (daily["excess_msgs"], daily["main_cause"]) == (150, "batch")
    period, daily = judged([snap(0, 0, None), snap(1, 250, None)])
    assert (period["entries"], period["over_msgs"], period["over_batch_msgs"]) == (None, 150, 0)
    assert daily["main_cause"] == "other"
