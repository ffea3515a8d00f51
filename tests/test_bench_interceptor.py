"""The bench's interceptor section without a broker: the overhead, the medians, the results entry
and its Markdown from made-up rounds (the live part runs in `make bench`)."""

from __future__ import annotations

import json

import pytest

from brokerlens_bench import interceptor as section
from brokerlens_bench.__main__ import SECTIONS, SKIPPED
from brokerlens_bench.markdown import markdown
from brokerlens_bench.run import failed_sections, targets


def reading(at: float, msg_out: int, msg_in: int, received: int, cpu: float) -> dict:
    return {"at": at, "msg_out": msg_out, "msg_in": msg_in, "received": received, "cpu": cpu}


def a_round(n: int, interceptor: bool, per_second: float, cpu_us: float = 5.0) -> dict:
    return {
        "round": n,
        "interceptor": interceptor,
        "window_seconds": 10.0,
        "dispatched": int(per_second * 10),
        "dispatched_per_second": per_second,
        "consumer_received": int(per_second * 10),
        "consumer_per_second": per_second,
        "published_per_second": per_second + 1,
        "broker_cpu_seconds": round(per_second * 10 * cpu_us / 1e6, 2),
        "broker_cpu_us_per_message": cpu_us,
        "send_errors": 0,
        "start_seconds": 40.0,
        "load_avg_1m_before": 1.5,
    }


def test_overhead_is_the_throughput_lost_in_percent():
    assert section.overhead_percent(100_000, 98_000) == 2.0
    assert section.overhead_percent(100_000, 100_000) == 0.0
    assert section.overhead_percent(100_000, 101_500) == -1.5  # faster with it: noise, said as a gain
    assert section.overhead_percent(3, 2) == 33.33


def test_median_of_an_odd_and_an_even_number_of_rounds():
    assert section.median([3.0, 1.0, 2.0]) == 2.0
    assert section.median([1.0, 2.0, 4.0, 10.0]) == 3.0


def test_a_window_from_its_two_readings():
    start = reading(100.0, msg_out=1_000, msg_in=1_200, received=990, cpu=50.0)
    end = reading(104.0, msg_out=401_000, msg_in=402_000, received=400_990, cpu=52.0)
    assert section.window(start, end) == {
        "window_seconds": 4.0,
        "dispatched": 400_000,
        "dispatched_per_second": 100_000.0,
        "consumer_received": 400_000,
        "consumer_per_second": 100_000.0,
        "published_per_second": 100_200.0,
        "broker_cpu_seconds": 2.0,
        "broker_cpu_us_per_message": 5.0,
    }


def test_results_entry_sides_by_side_with_the_target():
    # Alternated rounds; the medians are per side, the overhead from the dispatched medians.
    runs = [
        a_round(1, False, 100_000),
        a_round(1, True, 99_000),
        a_round(2, False, 90_000),
        a_round(2, True, 97_500, 5.5),
        a_round(3, False, 101_000),
        a_round(3, True, 98_500),
    ]
    entry = section.summary(runs, seconds=30.0, warmup=10.0)
    assert entry["rounds"] == 3
    assert entry["order"] == ["without", "with"] * 3
    assert entry["medians"]["dispatched_per_second"] == {"without": 100_000.0, "with": 98_500.0}
    assert entry["medians"]["broker_cpu_us_per_message"] == {"without": 5.0, "with": 5.0}
    assert entry["overhead_percent"] == 1.5
    assert entry["target_percent"] == 2.0 and entry["target_met"] is True
    assert set(entry) == {
        "pulsar",
        "setup",
        "warmup_seconds",
        "seconds",
        "rounds",
        "order",
        "runs",
        "medians",
        "overhead_percent",
        "target_percent",
        "target_met",
    }
    assert json.loads(json.dumps(entry)) == entry  # the results file holds it as it is
    missed = section.summary([a_round(1, False, 100_000), a_round(1, True, 97_000)], seconds=3.0, warmup=2.0)
    assert (missed["overhead_percent"], missed["target_met"]) == (3.0, False)


def results(entry: dict) -> dict:
    return {"sizes": [], "interceptor": entry, "targets": None}


def test_the_entry_in_targets_and_markdown():
    entry = section.summary([a_round(1, False, 100_000), a_round(1, True, 97_000)], seconds=3.0, warmup=2.0)
    assert targets(results(entry)) == {"interceptor: dispatch throughput lost, % (at most 2)": 3.0}
    page = markdown({**results(entry), "targets": targets(results(entry))})
    assert "median dispatched 100,000 msg/s without the interceptor, 97,000 with it: 3.0 % lost (target at most 2 %: missed)" in page
    assert "| 1 | without | 100,000 | 100,000 | 100,001 | 5.0 | 1.5 |" in page
    assert "| interceptor: dispatch throughput lost, % (at most 2) | 3.0 |" in page
    # A failed section is kept with its error and fails the run, as every guarded section.
    broken = {"sizes": [], "interceptor": {"error": "BrokerError: broker 4.0.7 not ready in 240s"}}
    assert failed_sections(broken) == {"interceptor": "BrokerError: broker 4.0.7 not ready in 240s"}
    assert targets(broken) == {}


def test_only_runs_the_sections_named(monkeypatch, tmp_path):
    """`--only interceptor`: every other section's option set to skip it, the interceptor's options kept."""
    import brokerlens_bench.__main__ as cli

    calls = []
    monkeypatch.setattr(cli, "run", lambda out, **kwargs: calls.append(kwargs) or {"sizes": []})
    assert cli.main(["--only", "interceptor", "--interceptor-rounds", "1", "--interceptor-seconds", "3", "--out", str(tmp_path / "r.json")]) == 0
    (kwargs,) = calls
    assert (kwargs["sizes"], kwargs["variant_sizes"], kwargs["land_scales"]) == ((), (), ())
    assert (kwargs["days_partitions"], kwargs["demo_day_scale"], kwargs["large_partitions"], kwargs["dag"]) == (None, None, None, False)
    assert (kwargs["interceptor_rounds"], kwargs["interceptor_seconds"], kwargs["interceptor_warmup"]) == (1, 3.0, section.WARMUP_SECONDS)
    cli.main(["--only", "sizes,dag", "--out", str(tmp_path / "r.json")])
    assert calls[1]["interceptor_rounds"] == 0 and calls[1]["dag"] is True and calls[1]["sizes"]
    assert set(SKIPPED) == set(SECTIONS)
    with pytest.raises(SystemExit):
        cli.main(["--only", "nothing"])
