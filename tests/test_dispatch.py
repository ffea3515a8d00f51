"""Dispatch throttling: Pulsar's worked examples of over-delivery and debt, per level and unit."""

from __future__ import annotations

from dispatch_rows import interval, limit, offset, partition, periods_of


def test_eleven_delivered_leaves_nine(spark):
    """Seed 002: rate limit 10/s, 11 delivered in the first period: only 9 in the next."""
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 11, topic=t, subscription="s1"),
         interval("subscription", 1, 12, topic=t, subscription="s1")],
        [limit("subscription", 10, topic=t)],
    )  # fmt: skip
    first, second = rows
    assert (first["quota_msgs"], first["allowed_msgs"], first["over_msgs"], first["debt_out_msgs"]) == (10, 10, 1, 1)
    assert second["debt_in_msgs"] == 11 - 10
    assert second["allowed_msgs"] == 9
    assert second["over_msgs"] == 12 - 9
    assert second["debt_out_msgs"] == 1 + 12 - 10
    assert not first["starved"] and not second["starved"]


def test_thirty_delivered_leaves_zero_for_two_periods(spark):
    """Seed 002: 30 delivered in one period at 10/s: 0 allowed in each of the next two."""
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", s, m, topic=t, subscription="s1") for s, m in [(0, 30), (1, 0), (2, 0), (3, 4)]],
        [limit("subscription", 10, topic=t)],
    )
    assert [r["allowed_msgs"] for r in rows] == [10, 0, 0, 10]
    assert [r["debt_in_msgs"] for r in rows] == [0, 30 - 10, 30 - 20, 0]
    assert [r["starved"] for r in rows] == [False, True, True, False]


def test_empty_periods_drain_debt(spark):
    """No record in periods 1 and 2: they delivered nothing and the debt still drained."""
    t = partition("orders", 0)
    gap2 = periods_of(
        spark,
        [interval("subscription", 0, 30, topic=t, subscription="s1"),
         interval("subscription", 2, 4, topic=t, subscription="s1"),
         interval("subscription", 10, 12, topic=t, subscription="s1")],
        [limit("subscription", 10, topic=t)],
    )  # fmt: skip
    assert [r["debt_in_msgs"] for r in gap2] == [0, 10, 0]
    assert [r["allowed_msgs"] for r in gap2] == [10, 0, 10]
    assert [r["over_msgs"] for r in gap2] == [20, 4, 2]
    assert gap2[1]["debt_out_msgs"] == 10 + 4 - 10


def test_partitioned_topic_quota_is_per_partition(spark):
    """Seed 002: t0 with 2 partitions at 10/s: 10/s per partition, 20/s in total."""
    p0, p1 = partition("t0", 0), partition("t0", 1)
    rows = periods_of(
        spark,
        [interval("topic", 0, 10, topic=p0), interval("topic", 0, 10, topic=p1),
         interval("topic", 1, 11, topic=p0), interval("topic", 1, 10, topic=p1)],
        [limit("topic", 10, topic=p0), limit("topic", 10, topic=p1)],
    )  # fmt: skip
    first = [r for r in rows if offset(r) == 0]
    assert sum(r["msgs"] for r in first) == 20 and sum(r["quota_msgs"] for r in first) == 20
    assert all(r["over_msgs"] == 0 for r in first)
    over = {r["topic"]: r["over_msgs"] for r in rows if offset(r) == 1}
    assert over == {p0: 1, p1: 0}  # the quota is not shared among partitions


def test_subscription_quota_is_per_partition_and_per_subscription(spark):
    """Seed 002: s1 on t1's 2 partitions at 10/s: 10/s on each, 20/s in total; s2 has its own."""
    p0, p1 = partition("t1", 0), partition("t1", 1)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 10, topic=p0, subscription="s1"),
         interval("subscription", 0, 10, topic=p1, subscription="s1"),
         interval("subscription", 0, 10, topic=p0, subscription="s2"),
         interval("subscription", 1, 10, topic=p0, subscription="s1"),
         interval("subscription", 1, 12, topic=p1, subscription="s1")],
        [limit("subscription", 10, topic=p0), limit("subscription", 10, topic=p1)],
    )  # fmt: skip
    first = [r for r in rows if offset(r) == 0 and r["subscription"] == "s1"]
    assert sum(r["quota_msgs"] for r in first) == 20 and all(r["over_msgs"] == 0 for r in first)
    s2 = [r for r in rows if r["subscription"] == "s2"]
    assert s2[0]["over_msgs"] == 0 and s2[0]["allowed_msgs"] == 10
    second = {r["topic"]: r["over_msgs"] for r in rows if offset(r) == 1}
    assert second == {p0: 0, p1: 2}


def test_all_levels_enforced_at_once(spark):
    """Limits on several levels hold at once (logical AND): each level is judged on its own."""
    p0, p1 = partition("t0", 0), partition("t0", 1)
    # Broker 25/s; topic 12/s per partition; subscription 8/s per partition.
    subs = [(p0, "s1", 9), (p0, "s2", 5), (p1, "s1", 6)]
    intervals = [interval("subscription", 0, m, topic=t, subscription=s) for t, s, m in subs]
    intervals += [interval("topic", 0, 14, topic=p0), interval("topic", 0, 6, topic=p1)]
    intervals += [interval("broker", 0, 20)]
    limits = [limit("broker", 25), limit("topic", 12, topic=p0), limit("topic", 12, topic=p1),
              limit("subscription", 8, topic=p0), limit("subscription", 8, topic=p1)]  # fmt: skip
    rows = periods_of(spark, intervals, limits)
    over = {(r["level"], r["topic"], r["subscription"]): r["over_msgs"] for r in rows}
    assert over == {
        ("subscription", p0, "s1"): 9 - 8,
        ("subscription", p0, "s2"): 0,
        ("subscription", p1, "s1"): 0,
        ("topic", p0, None): 14 - 12,
        ("topic", p1, None): 0,
        ("broker", None, None): 0,
    }


def test_bytes_and_messages_hold_at_once(spark):
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 5, bytes_=1500, topic=t, subscription="s1"),
         interval("subscription", 1, 5, bytes_=900, topic=t, subscription="s1")],
        [limit("subscription", None, byte_limit=1000, topic=t)],
    )  # fmt: skip
    assert [r["allowed_msgs"] for r in rows] == [None, None]  # no message limit: unlimited
    assert [r["over_msgs"] for r in rows] == [0, 0]
    assert [r["over_bytes"] for r in rows] == [500, 900 - 500]
    assert [r["debt_out_bytes"] for r in rows] == [500, 400]


def test_quota_change_takes_effect_at_next_period_start(spark):
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", s, 12, topic=t, subscription="s1", seconds=2) for s in (0, 2, 4)],
        [limit("subscription", 10, topic=t, period=2, end=2.5),
         limit("subscription", 20, topic=t, period=2, start=2.5)],  # in force from 4 s
    )  # fmt: skip
    assert [r["quota_msgs"] for r in rows] == [10, 10, 20]
    assert [r["rate_period_seconds"] for r in rows] == [2, 2, 2]
    assert [r["debt_in_msgs"] for r in rows] == [0, 2, 4]


def test_batch_counting_by_entries(spark):
    """dispatchThrottlingOnBatchMessageEnabled: each entry counts as one message."""
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 60, entries=10, topic=t, subscription="s1"),
         interval("subscription", 60, 600, topic=t, subscription="s1", seconds=60, grain="scrape")],
        [limit("subscription", 10, topic=t, count_entries=True)],
    )  # fmt: skip
    entry_row, scrape_row = rows
    assert (entry_row["count_unit"], entry_row["counted_msgs"], entry_row["over_msgs"]) == ("entries", 10, 0)
    # Counters have no entries: messages are counted, and the row says so.
    assert (scrape_row["count_unit"], scrape_row["counted_msgs"]) == ("msgs-no-entries", 600)


def test_scrape_grain_prorates_the_quota(spark):
    """Counter snapshots 60 s apart at 10/s: each interval is judged against 600, plus one period's
    quota of slack (10): the limiter's periods are not aligned with the snapshots, so an interval
    can hold 61 periods' reads (a live broker at its limit showed 100 in a 1 s interval at 50/s)."""
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 650, topic=t, subscription="s1", seconds=60, grain="scrape"),
         interval("subscription", 60, 580, topic=t, subscription="s1", seconds=60, grain="scrape"),
         interval("subscription", 150, 300, topic=t, subscription="s1", seconds=30, grain="scrape")],
        [limit("subscription", 10, topic=t)],
    )  # fmt: skip
    assert [r["grain"] for r in rows] == ["scrape"] * 3
    assert [r["quota_msgs"] for r in rows] == [10 * 60, 10 * 60, 10 * 30]
    assert [r["allowed_msgs"] for r in rows] == [610, 610 - 50, 310]
    assert [r["over_msgs"] for r in rows] == [650 - 610, 580 - 560, 0]
    # The state is 50 then 30 (debt beyond the slack: 40, 20); 30 s without a snapshot between
    # 120 s and 150 s drained 300 of the 30 left, a full bucket for 27 s without a delivery:
    # nothing of the refill its cap dropped is still the broker's (credit 0).
    assert [r["debt_in_msgs"] for r in rows] == [0, 40, 0]
    assert [r["credit_in_msgs"] for r in rows] == [0, 0, 0]


def test_a_short_interval_at_steady_throttle_leaves_no_debt(spark):
    """A live 4.0.7 broker's rows (CI, token-bucket-periodic, 100/s after a rate change): a new
    bucket's first interval took 50 of its 108, then 200 in 1.02 s, then a read of 100 fell in
    a 0.88 s interval, and the consumer went on at 100 a second. Capped at each snapshot, the
    model's bucket had dropped 58 the broker still held; without them the 0.88 s interval was
    10 over and every interval after it 9 over, a debt the broker never had."""
    t = partition("rate", 0)
    starts = [0, 1.076, 2.096, 2.976, 3.981, 4.98, 5.982]
    msgs = [50, 200, 100, 100, 100, 100]
    rows = periods_of(
        spark,
        [interval("subscription", a, n, topic=t, subscription="s", seconds=b - a, grain="scrape")
         for a, b, n in zip(starts, starts[1:], msgs, strict=False)],
        [limit("subscription", 100, topic=t)],
        model="token-bucket-periodic",
    )  # fmt: skip
    assert [r["allowed_msgs"] for r in rows] == [208, 202, 90, 90, 90, 90]
    assert [r["credit_in_msgs"] for r in rows] == [0, 58, 58, 58, 58, 58]
    assert [r["over_msgs"] for r in rows] == [0] * 6
    assert [r["debt_out_msgs"] for r in rows] == [0] * 6
    assert [r["tokens_out_msgs"] for r in rows] == [158, 60, 48, 48, 48, 48]


def test_the_brokers_credit_is_one_quota_and_gone_after_a_period_idle(spark):
    """At 100/s: intervals taking 20 then 30 of their quota leave the model's cap 80 + 70 dropped,
    of which the broker may hold one quota (100), so 300 in the next 0.5 s are 50 over. Then a
    2 s interval without a delivery: the broker refills at the read that ends the wait, capped,
    so its bucket holds at most the limit (the model's 50 tokens and 50 of credit), and a burst
    of 250 in the next second is 50 over (a full bucket plus the second's refill)."""
    t = partition("credit", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 20, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 1, 30, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 2, 300, topic=t, subscription="s", seconds=0.5, grain="scrape"),
         interval("subscription", 2.5, 0, topic=t, subscription="s", seconds=2, grain="scrape"),
         interval("subscription", 4.5, 250, topic=t, subscription="s", grain="scrape")],
        [limit("subscription", 100, topic=t)],
    )  # fmt: skip
    assert [r["credit_in_msgs"] for r in rows] == [0, 80, 100, 100, 50]
    assert [r["allowed_msgs"] for r in rows] == [200, 200, 150, 50, 150]
    assert [r["over_msgs"] for r in rows] == [0, 0, 50, 0, 50]


def test_a_debt_deeper_than_the_quota_is_not_paid_twice_by_the_credit(spark):
    """At 100/s: 20 then 30 leave a credit of 100 (80 + 70 dropped, one quota), and 600 in the
    next second are 300 over. A scrape row's debt is net of the credit already, so the credit
    does not allow anything beyond it again: 100 in the next second are 100 over (a debt of 300
    against a quota of 100), and after 2.5 s idle the debt is 50, so 100 in a second are 50 over
    and the row is not starved. (Taking the credit off again, once the allowance is 0, found both
    0 over and the last row starved.)"""
    t = partition("credit", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 20, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 1, 30, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 2, 600, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 3, 100, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 4, 0, topic=t, subscription="s", seconds=2.5, grain="scrape"),
         interval("subscription", 6.5, 100, topic=t, subscription="s", grain="scrape")],
        [limit("subscription", 100, topic=t)],
    )  # fmt: skip
    assert [r["debt_in_msgs"] for r in rows] == [0, 0, 0, 300, 300, 50]
    assert [r["allowed_msgs"] for r in rows] == [200, 200, 200, 0, 0, 0]
    assert [r["credit_in_msgs"] for r in rows] == [0, 80, 100, 100, 100, 100]
    assert [r["over_msgs"] for r in rows] == [0, 0, 300, 100, 0, 50]
    assert [r["starved"] for r in rows] == [False, False, False, True, True, False]


def test_over_delivery_causes(spark):
    t = partition("orders", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 0, 15, entries=15, redelivered=3, bytes_=1500, topic=t, subscription="s1"),
         interval("subscription", 10, 16, entries=4, bytes_=1600, topic=t, subscription="s1"),
         interval("subscription", 20, 5, entries=1, bytes_=1300, topic=t, subscription="s1")],
        [limit("subscription", 10, byte_limit=1000, topic=t)],
    )  # fmt: skip
    redelivery, batch, big_entry = rows
    assert (redelivery["over_msgs"], redelivery["over_redelivery_msgs"], redelivery["over_batch_msgs"]) == (5, 3, 0)
    assert redelivery["over_bytes"] == 500 and redelivery["over_redelivery_bytes"] == 3 * 100
    assert redelivery["over_approx_bytes"] == 500 - 300  # all bytes over that redelivery does not explain
    assert (batch["over_msgs"], batch["over_batch_msgs"], batch["over_redelivery_msgs"]) == (6, 6, 0)
    assert big_entry["over_approx_bytes"] == 300  # one 1300 B entry overshot a 1000 B allowance


def test_a_first_limit_holds_a_snapshot_interval_from_when_collect_saw_it(spark):
    """No limit, then 50/s seen by collect at 10.15 s: the broker's new limiter ran by
    then, so the snapshot interval from 10.3 s is judged by it (a full bucket plus the interval's
    quota, 100), not left unlimited until the period grid's 11 s. A period record of the broker's
    own starts on the grid: the period from 10 s is the old one's, unlimited."""
    t, u = partition("burst", 0), partition("burst", 1)
    scraped, recorded = periods_of(
        spark,
        [interval("subscription", 9.3, 0, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 10.3, 250, topic=t, subscription="s", grain="scrape"),
         interval("subscription", 10, 250, topic=u, subscription="s")],
        [limit("subscription", None, topic=t, end=10.15), limit("subscription", 50, topic=t, start=10.15),
         limit("subscription", None, topic=u, end=10.15), limit("subscription", 50, topic=u, start=10.15)],
    )[1:]  # fmt: skip
    assert (scraped["msg_limit"], scraped["allowed_msgs"], scraped["over_msgs"]) == (50, 100, 150)
    assert (recorded["msg_limit"], recorded["over_msgs"]) == (None, 0)


def test_a_changed_limit_holds_a_snapshot_interval_from_the_period_grid(spark):
    """100/s, then 50/s seen at 10.15 s: the looser limit holds until the period grid's 11 s, so
    the snapshot interval from 10.3 s is judged by it (its quota 100, its bucket's 100 of slack)."""
    t = partition("burst", 0)
    rows = periods_of(
        spark,
        [interval("subscription", 10.3, 250, topic=t, subscription="s", grain="scrape")],
        [limit("subscription", 100, topic=t, end=10.15), limit("subscription", 50, topic=t, start=10.15)],
    )  # fmt: skip
    assert [(r["msg_limit"], r["allowed_msgs"], r["over_msgs"]) for r in rows] == [(100, 200, 50)]
