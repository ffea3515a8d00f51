"""Token buckets: seed 001's numbers, and the window-function simulation against a plain loop."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from brokerlens.gold.token_bucket import conformance, parse_limit
from brokerlens.platform.frames import rows_frame

T0 = datetime(2026, 11, 21, 10, 0, 0)


def test_seed_001_byte_limit():
    bucket = parse_limit("100KB,10s")
    # Seed 001: rate = 100 KB / 10 s, burst = 100 KB, peak = burst + rate.
    assert bucket.rate == 100 * 1024 / 10 == 10240
    assert bucket.burst == 100 * 1024 == 102400
    assert bucket.peak == 102400 + 10240 == 112640
    assert bucket.bytes


def test_seed_001_message_limit():
    bucket = parse_limit("100,10s")
    assert (bucket.rate, bucket.burst, bucket.bytes) == (10, 100, False)


@pytest.mark.parametrize(
    "text, rate, burst",
    [("1MB,1m", 1024 * 1024 / 60, 1024 * 1024), ("1000", 1000, 1000), ("5 kb, 2 s", 2560, 5120), ("300,500ms", 600, 300), ("10,1h", 10 / 3600, 10)],
)
def test_parse_forms(text, rate, burst):
    bucket = parse_limit(text)
    assert bucket.rate == pytest.approx(rate) and bucket.burst == burst


@pytest.mark.parametrize("text", ["", "abc", "100,10x", "-5,1s", "0,1s", "10KB,"])
def test_parse_rejects(text):
    with pytest.raises(ValueError, match="rate limit"):
        parse_limit(text)


def reference(amounts: dict[int, float], rate: float, burst: float) -> dict[int, tuple]:
    """Second by second: the bucket starts full, gains r each second (up to b), and what it
    cannot pass waits in a queue for later seconds."""
    tokens, queue, out = burst, 0.0, {}
    for second in range(max(amounts) + 1):
        arriving = amounts.get(second, 0.0)
        available, demand = tokens + rate, queue + arriving
        sent = min(demand, available)
        tokens, queue = min(burst, available - sent), demand - sent
        if second in amounts:
            out[second] = (tokens, queue, sent)
    return out


def simulate(spark, rows):
    df = rows_frame(
        spark,
        [(k, T0 + timedelta(seconds=s), 1.0, float(a), float(r), float(b)) for k, s, a, r, b in rows],
        "series int, interval_start timestamp, interval_seconds double, observed double, rate double, burst double",
    )
    got = conformance(df, ["series"]).collect()
    return {(x.series, int((x.interval_start - T0).total_seconds())): x for x in got}


def test_peak_is_b_plus_r_then_r(spark):
    bucket = parse_limit("100KB,10s")
    r, b = bucket.rate, bucket.burst
    # A full bucket passes b + r in the first second; then r per second.
    rows = [(1, 0, b + r, r, b), (1, 1, r, r, b), (1, 2, r + 1, r, b), (1, 3, 0, r, b)]
    got = simulate(spark, rows)
    assert [got[(1, s)].throttled for s in range(4)] == [False, False, True, False]
    assert got[(1, 2)].delayed == 1 and got[(1, 3)].allowed == 1
    assert got[(1, 0)].bucket_level == 0 and got[(1, 3)].bucket_level == r - 1


series = st.tuples(
    st.sampled_from([(10.0, 100.0), (10240.0, 102400.0), (2.5, 7.0), (40.0, 40.0)]),
    st.dictionaries(st.integers(0, 40), st.integers(0, 300), min_size=1, max_size=25),
)


@hsettings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(series, min_size=40, max_size=40))
def test_matches_sequential_reference(spark, examples):
    # All examples in one Spark job: one series per example.
    rows = [(i, s, a, r, b) for i, ((r, b), amounts) in enumerate(examples) for s, a in amounts.items()]
    got = simulate(spark, rows)
    for i, ((r, b), amounts) in enumerate(examples):
        for s, (tokens, queue, sent) in reference(amounts, r, b).items():
            row = got[(i, s)]
            assert row.bucket_level == pytest.approx(tokens, abs=1e-6), (i, s)
            assert row.delayed == pytest.approx(queue, abs=1e-6), (i, s)
            assert row.throttled == (queue > 1e-6), (i, s)
            assert row.allowed == pytest.approx(sent, abs=1e-6), (i, s)
