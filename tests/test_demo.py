"""demo-data: the files are in Pulsar's formats and the day shows what the manifest promises.

Every check recomputes its expectation from the files themselves (policies → effective limits →
Lindley debt; counters from dispatch records; range counts from the range strings; lint from the
producer configuration), never from the generator's internals.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from brokerlens.settings import Settings
from brokerlens.platform.stage import StageFailed
from brokerlens.sources.demo import big_dispatch_series, generate_day

DAY = date(2026, 11, 21)
MIDNIGHT = datetime(2026, 11, 21, tzinfo=timezone.utc)
RANGE = re.compile(r"\((\d+):(\d+)\.\.(\d+):(\d+)\]")
LEVELS = {"broker", "topic", "subscription"}


def sec(stamp: str) -> int:
    return int((datetime.fromisoformat(stamp.replace("Z", "+00:00")) - MIDNIGHT).total_seconds())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    settings = Settings(home=tmp_path_factory.mktemp("demo"))
    result = generate_day(DAY, settings, scale=0.3, seed=7)
    root = settings.landing / DAY.isoformat()
    manifest = json.loads((root / "_demo_manifest.json").read_text())
    bad = {(b["file"], b["line"]) for b in manifest["bad_records"]}
    return settings, root, manifest, bad, result


def good_lines(root: Path, landing: Path, kind: str, bad: set, pattern="*.jsonl"):
    for path in sorted((root / kind).glob(pattern)):
        rel = path.relative_to(landing).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if (rel, n) not in bad:
                yield rel, n, line


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_all_kinds_and_manifest(demo):
    settings, root, manifest, bad, result = demo
    for kind in ("topic-stats", "internal-stats", "dispatch", "producer-stats", "policies", "metrics"):
        assert any((root / kind).iterdir()), kind
    reasons = {b["reason"] for b in manifest["bad_records"]}
    assert reasons >= {"malformed-json", "missing-field", "wrong-type", "negative-counter", "outside-day", "unknown-enum", "duplicate", "unreadable-file"}
    assert {b["kind"] for b in manifest["bad_records"] if b["stage"] == "land"} == {
        "topic-stats",
        "internal-stats",
        "dispatch",
        "producer-stats",
        "policies",
        "metrics",
    }
    for b in manifest["bad_records"]:
        path = settings.landing / b["file"]
        assert path.is_file(), b
        if b["line"] is None:
            continue
        line = path.read_text().splitlines()[b["line"] - 1]
        if b["reason"] == "malformed-json":
            with pytest.raises(json.JSONDecodeError):
                json.loads(line)
        if b["reason"] == "duplicate":
            assert line in path.read_text().splitlines()[: b["line"] - 1]
    unreadable = [b for b in manifest["bad_records"] if b["reason"] == "unreadable-file"]
    with pytest.raises(UnicodeDecodeError):
        (settings.landing / unreadable[0]["file"]).read_bytes().decode("utf-8")
    assert result.metrics["bad_records"] == len(manifest["bad_records"]) and manifest["complete"]


def test_nothing_else_is_bad(demo):
    """Every record not listed as bad parses, has its fields, sane values and a time in the day."""
    settings, root, manifest, bad, _ = demo
    seen = set()
    for rel, n, line in good_lines(root, settings.landing, "dispatch", bad):
        rec = json.loads(line)
        assert rec["level"] in LEVELS and 0 <= sec(rec["period_start"]) < 86400
        assert all(isinstance(rec[f], int) and rec[f] >= 0 for f in ("msgs", "bytes", "entries", "redelivered_msgs"))
        assert rec["redelivered_msgs"] <= rec["msgs"] and (rec["level"] == "broker") == ("topic" not in rec)
        assert line not in seen
        seen.add(line)
    for rel, n, line in good_lines(root, settings.landing, "producer-stats", bad):
        rec = json.loads(line)
        assert rec["producer_name"] and 0 <= sec(rec["collected_at"]) < 86400
        assert rec["config"]["compressionType"] in {"NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"}
        assert min(v for k, v in rec["stats"].items() if k != "partitionStats") >= 0
        assert line not in seen
        seen.add(line)
    kinds = {"broker-config", "namespace-dispatch-rate", "namespace-subscription-dispatch-rate", "topic-dispatch-rate", "topic-subscription-dispatch-rate"}
    for rel, n, line in good_lines(root, settings.landing, "policies", bad):
        rec = json.loads(line)
        assert rec["kind"] in kinds and 0 <= sec(rec["effective_at"]) < 86400
    bad_files = {f for f, line in bad if line is None}
    for kind in ("topic-stats", "internal-stats"):
        for path in sorted((root / kind).glob("*.json")):
            if path.relative_to(settings.landing).as_posix() in bad_files:
                continue
            doc = json.loads(path.read_text())
            for env in doc if isinstance(doc, list) else [doc]:
                assert 0 <= sec(env["collected_at"]) < 86400 and env["stats"]
    sample = re.compile(
        r'^pulsar_[a-z_]+\{cluster="c1",namespace="[^"]+",topic="persistent://[^"]+"'
        r'(,subscription="[^"]+")?\} -?[0-9.e+]+$'
    )
    for rel, n, line in good_lines(root, settings.landing, "metrics", bad, "*.prom"):
        assert line.startswith("#") or sample.match(line), line
        if not line.startswith("#"):
            assert float(line.rsplit(" ", 1)[1]) >= 0


def effective_limits(root: Path, landing: Path, bad: set):
    """Per (level, scope) the quota per second, from the policy files: topic > namespace > broker."""
    records = [json.loads(line) for _, _, line in good_lines(root, landing, "policies", bad)]
    brokers = {r["broker"]: r["policy"] for r in records if r["kind"] == "broker-config"}
    timeline = sorted(((sec(r["effective_at"]), r) for r in records if r["kind"] != "broker-config"), key=lambda x: x[0])

    def per_second(kind_topic, kind_ns, broker_keys, broker, partition):
        base = re.sub(r"-partition-\d+$", "", partition)
        ns = base.split("://")[1].rsplit("/", 1)[0]
        q = np.zeros((2, 86400))
        starts = sorted({0, *(t for t, _ in timeline)})
        for i, start in enumerate(starts):
            current = {}
            for t, r in timeline:
                if t <= start:
                    current[(r["kind"], r.get("topic") or r.get("namespace"))] = r["policy"]
            policy = current.get((kind_topic, base)) or current.get((kind_ns, ns))
            values = (
                (policy["dispatchThrottlingRateInMsg"], policy["dispatchThrottlingRateInByte"])
                if policy
                else (brokers[broker][broker_keys[0]], brokers[broker][broker_keys[1]])
            )
            end = starts[i + 1] if i + 1 < len(starts) else 86400
            for j, v in enumerate(values):
                q[j, start:end] = v if v > 0 else np.inf
        return q

    def limits(level, broker, partition=None):
        if level == "broker":
            conf = brokers[broker]
            return np.stack(
                [
                    np.full(86400, conf["dispatchThrottlingRateInMsg"] or np.inf, dtype=float),
                    np.full(86400, conf["dispatchThrottlingRateInByte"] or np.inf, dtype=float),
                ]
            )
        if level == "topic":
            return per_second(
                "topic-dispatch-rate",
                "namespace-dispatch-rate",
                ("dispatchThrottlingRatePerTopicInMsg", "dispatchThrottlingRatePerTopicInByte"),
                broker,
                partition,
            )
        return per_second(
            "topic-subscription-dispatch-rate",
            "namespace-subscription-dispatch-rate",
            ("dispatchThrottlingRatePerSubscriptionInMsg", "dispatchThrottlingRatePerSubscriptionInByte"),
            broker,
            partition,
        )

    return limits


def lindley_debt(delivered: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """debt after each period: S_t - min(0, min_k<=t S_k) with S_t = cumsum(delivered - q)."""
    if np.isinf(quota).all():
        return np.zeros_like(delivered)
    step = delivered - np.where(np.isinf(quota), delivered, quota)
    s = np.cumsum(step)
    return s - np.minimum(0, np.minimum.accumulate(s))


@pytest.fixture(scope="module")
def dispatch(demo):
    settings, root, manifest, bad, _ = demo
    series = defaultdict(lambda: np.zeros((2, 86400)))
    for _, _, line in good_lines(root, settings.landing, "dispatch", bad):
        r = json.loads(line)
        key = (r["level"], r["broker"], r.get("topic"), r.get("subscription"))
        t = sec(r["period_start"])
        series[key][0, t] += r["msgs"]
        series[key][1, t] += r["bytes"]
    return series


def test_dispatch_throttling_follows_pulsar(demo, dispatch):
    """Reads only while every limiter has allowance; excess carried as debt; debt starves periods."""
    settings, root, manifest, bad, _ = demo
    limits = effective_limits(root, settings.landing, bad)
    over_periods = starved = limited_scopes = 0
    for (level, broker, topic, sub), series in dispatch.items():
        q = limits(level, broker, topic)
        if np.isinf(q).all():
            continue
        limited_scopes += 1
        for dim in (0, 1):
            debt = lindley_debt(series[dim], q[dim])
            debt_in = np.concatenate([[0.0], debt[:-1]])
            allowed = np.maximum(0, q[dim] - debt_in)
            active = series[dim] > 0
            # A dispatcher reads only from remaining quota: no delivery when allowance is 0.
            assert not (active & (allowed <= 0)).any(), (level, topic, sub, dim)
            over_periods += int((active & (series[dim] > allowed)).sum())
            starved += int(((debt_in >= q[dim]) & np.isfinite(q[dim])).sum())
    assert limited_scopes >= 5 and over_periods > 20 and starved > 20


def test_dispatch_levels_add_up(dispatch):
    topic_sum = defaultdict(lambda: np.zeros((2, 86400)))
    broker_sum = defaultdict(lambda: np.zeros((2, 86400)))
    for (level, broker, topic, sub), series in dispatch.items():
        if level == "subscription":
            topic_sum[(broker, topic)] += series
        if level == "topic":
            broker_sum[broker] += series
    for (level, broker, topic, sub), series in dispatch.items():
        if level == "topic":
            assert np.array_equal(series, topic_sum[(broker, topic)])
        if level == "broker":
            assert np.array_equal(series, broker_sum[broker])


def test_mid_day_limit_and_topic_policy(demo, dispatch):
    """orders subscriptions: topic policy 80 msg/s from 08:00 to 18:00 over the namespace's 200 → 120."""
    settings, root, manifest, bad, _ = demo
    key = ("subscription", "broker-1:8080", "persistent://acme/orders/orders-partition-0", "fulfilment")
    msgs = dispatch[key][0]
    # After the 09:30–09:45 consumer outage the backlog drains at the 80 msg/s topic policy limit.
    drained = msgs[9 * 3600 + 2700 : 9 * 3600 + 2700 + 300]
    assert 0.5 * 80 * 300 <= drained.sum() <= 80 * 300 + 1000
    # The namespace policy in force after the topic policy is removed (18:00) is 120, not 200.
    evening = msgs[19 * 3600 : 19 * 3600 + 300]
    assert evening.sum() <= 120 * 300 + 1000
    # order-events: the topic policy (300 msg/s, 256 KiB/s) overrides the namespace's 800 msg/s.
    topic = dispatch[("topic", "broker-1:8080", "persistent://acme/orders/order-events", None)]
    burst = topic[1][13 * 3600 : 13 * 3600 + 600]
    assert burst.sum() <= 262144 * 600 + 300_000 and burst.max() > 0


def load_json_kind(root: Path, kind: str, bad_files: set, landing: Path):
    out = []
    for path in sorted((root / kind).glob("*.json")):
        if path.relative_to(landing).as_posix() in bad_files:
            continue
        doc = json.loads(path.read_text())
        out += doc if isinstance(doc, list) else [doc]
    return out


def test_counters_match_dispatch_and_reset(demo, dispatch):
    settings, root, manifest, bad, _ = demo
    bad_files = {f for f, line in bad if line is None}
    envs = load_json_kind(root, "topic-stats", bad_files, settings.landing)
    by_topic = defaultdict(list)
    for env in envs:
        by_topic[env["topic"]].append((sec(env["collected_at"]), env["stats"]))
    snaps = sorted(by_topic["persistent://acme/orders/order-events"])
    msgs = dispatch[("subscription", "broker-1:8080", "persistent://acme/orders/order-events", "billing")][0]
    for (t0, s0), (t1, s1) in zip(snaps, snaps[1:]):
        delta = s1["subscriptions"]["billing"]["msgOutCounter"] - s0["subscriptions"]["billing"]["msgOutCounter"]
        assert delta == msgs[t0:t1].sum()
    reset = manifest["expectations"]["counter_resets"][0]
    series = [s["msgOutCounter"] for _, s in sorted(by_topic[reset["topic"]])]
    drops = [i for i, (a, b) in enumerate(zip(series, series[1:])) if b < a]
    assert len(drops) == 1
    assert sorted(by_topic[reset["topic"]])[drops[0] + 1][0] > sec(reset["at"])
    # Partitioned-stats envelopes carry per-partition stats with the partition's owner broker.
    part = next(s for env in envs for s in [env["stats"]] if "partitions" in s)
    assert part["metadata"]["partitions"] == len(part["partitions"])
    assert all(p["ownerBroker"].endswith(":8080") for p in part["partitions"].values())


def parse_ranges(text: str) -> list[tuple[int, int, int, int]]:
    return [tuple(map(int, m)) for m in RANGE.findall(text)]


def test_cursors_near_and_over_cap(demo):
    settings, root, manifest, bad, _ = demo
    bad_files = {f for f, line in bad if line is None}
    exp = manifest["expectations"]
    internal = defaultdict(list)
    for env in load_json_kind(root, "internal-stats", bad_files, settings.landing):
        internal[env["topic"]].append((sec(env["collected_at"]), env["stats"]))
    topic_ranges = {}
    for env in load_json_kind(root, "topic-stats", bad_files, settings.landing):
        parts = env["stats"].get("partitions") or {env["topic"]: env["stats"]}
        for name, st in parts.items():
            for sub, s in st["subscriptions"].items():
                topic_ranges[(name, sub, sec(env["collected_at"]))] = s["nonContiguousDeletedMessagesRanges"]
    assert exp["subscriptions_over_cap"] and exp["subscriptions_near_cap"] and exp["subscriptions_forecast_to_cap"]
    spans = 0
    for row in exp["subscriptions_over_cap"] + exp["subscriptions_near_cap"]:
        snaps = sorted(internal[row["topic"]])
        counts = []
        for t, stats in snaps:
            cursor = stats["cursors"][row["subscription"]]
            ranges = parse_ranges(cursor["individuallyDeletedMessages"])
            assert len(ranges) == cursor["totalNonContiguousDeletedMessagesRange"]
            assert topic_ranges[(row["topic"], row["subscription"], t)] == len(ranges)
            counts.append(len(ranges))
            order = {l["ledgerId"]: i for i, l in enumerate(stats["ledgers"])}
            key = np.array([(order[a], b, order[c], d) for a, b, c, d in ranges])
            lo, hi = key[:, 0] * 10**7 + key[:, 1], key[:, 2] * 10**7 + key[:, 3]
            assert (lo < hi).all() and (hi[:-1] < lo[1:]).all()  # open-closed, sorted, disjoint
            mark_l, mark_e = map(int, cursor["markDeletePosition"].split(":"))
            read_l, read_e = map(int, cursor["readPosition"].split(":"))
            assert order[mark_l] * 10**7 + mark_e < lo[0] and hi[-1] < order[read_l] * 10**7 + read_e
            spans += int((key[:, 0] != key[:, 2]).sum())
        assert counts == sorted(counts) and counts[-1] == row["ranges_end_of_day"]
        if row in exp["subscriptions_over_cap"]:
            assert counts[-1] >= 10_000
        else:
            assert 8_000 <= counts[-1] < 10_000
    assert spans > 0  # some ranges span ledgers
    for row in exp["subscriptions_forecast_to_cap"]:
        pts = sorted((t, n) for (topic, sub, t), n in topic_ranges.items() if topic == row["topic"] and sub == row["subscription"] and t >= 86100 - 3 * 3600)
        t, n = np.array(pts, dtype=float).T
        slope = np.polyfit(t / 3600, n, 1)[0]  # ranges per hour over the last 3 h
        assert n[-1] < 10_000 and (10_000 - n[-1]) / slope <= 24


def lint(rec: dict) -> set[str]:
    """Seed 003's relations, computed from the record's configuration alone."""
    c, parts = rec["config"], max(rec["partitions"], 1)
    mem = rec["client"]["memoryLimitBytes"]
    msg_size = rec["extra"]["uncompressedBytesSent"] / max(rec["stats"]["numMsgsSent"], 1)
    issues = set()
    if c["batchingMaxMessages"] > c["maxPendingMessages"]:
        issues.add("batching-max-messages-over-max-pending")
    pending = min(c["maxPendingMessages"], c["maxPendingMessagesAcrossPartitions"] // parts)
    if mem and mem < pending * parts * msg_size:
        issues.add("memory-limit-too-small")
    if c["batchingMaxBytes"] > min(mem / parts / 2 if mem else 1 << 20, 1 << 20):
        issues.add("batching-max-bytes-too-large")
    if rec["partitions"] and c["messageRoutingMode"] == "RoundRobinPartition" and c["batchingPartitionSwitchFrequencyByPublishDelay"] != 1:
        issues.add("partition-switch-frequency")
    if not c["blockIfQueueFull"] and rec["stats"]["totalSendFailed"] > 0:
        issues.add("block-if-queue-full-false-with-send-failures")
    return issues


def test_producers_good_and_bad(demo):
    settings, root, manifest, bad, _ = demo
    last = {}
    for _, _, line in good_lines(root, settings.landing, "producer-stats", bad):
        rec = json.loads(line)
        last[rec["producer_name"]] = rec
    found = {name: lint(rec) for name, rec in last.items()}
    expected = {p["producer_name"]: set(p["issues"]) for p in manifest["expectations"]["bad_producers"]}
    assert {n: i for n, i in found.items() if i} == expected
    assert len(expected) == 5
    assert last["refund-service"]["extra"]["sendFailedByKind"]["ProducerQueueIsFullError"] > 0


def test_same_seed_same_bytes(demo, tmp_path):
    settings, root, manifest, bad, _ = demo
    again = Settings(home=tmp_path / "again")
    generate_day(DAY, again, scale=0.3, seed=7)
    assert tree_digest(again.landing / DAY.isoformat()) == tree_digest(root)


def test_never_replaces_collected_data(tmp_path):
    settings = Settings(home=tmp_path)
    collected = settings.landing / DAY.isoformat() / "topic-stats" / "collect-100000-000.json"
    collected.parent.mkdir(parents=True)
    collected.write_text("[]")
    with pytest.raises(StageFailed, match="did not write"):
        generate_day(DAY, settings, scale=0.3)
    assert collected.read_text() == "[]"


def test_big_dispatch_series(tmp_path):
    files, records = big_dispatch_series(DAY, tmp_path, n_subscriptions=8, subs_per_topic=2, activity=0.002)
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len(lines) == records > 0
    assert {r["level"] for r in lines} == LEVELS
