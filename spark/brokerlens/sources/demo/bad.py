"""Deliberately bad records, and the manifest that lists them with what the day should show.

Every bad record is listed with the ``stage`` and ``kind`` of the quarantine row it must become
(``land`` and the landing kind; ``build``/``cursor_ranges`` for unparseable ranges inside a good
envelope), its file (relative to the landing root, like the ``quarantine`` table's
``source_file``), 1-based line (null for a whole file) and the reason code
(schemas/tables/quarantine.yaml), so a test can assert that nothing but these is quarantined.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

from .cursors import CAP, DAY_END

MANIFEST_FORMAT = 1


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _append(path: Path, landing: Path, kind: str, items: list[tuple[str, str, str]], out: list[dict]) -> None:
    """Append raw lines to a JSONL/Prometheus file and record each as a bad record."""
    n = len(_lines(path))
    with path.open("a") as f:
        for raw, reason, detail in items:
            f.write(raw + "\n")
            n += 1
            out.append({"stage": "land", "kind": kind, "file": path.relative_to(landing).as_posix(), "line": n, "reason": reason, "detail": detail})


def _whole_file(path: Path, landing: Path, kind: str, data: bytes, reason: str, detail: str, out: list[dict]) -> None:
    path.write_bytes(data)
    out.append({"stage": "land", "kind": kind, "file": path.relative_to(landing).as_posix(), "line": None, "reason": reason, "detail": detail})


def sprinkle(root: Path, landing: Path, day: date, cluster: str) -> list[dict]:
    out: list[dict] = []
    # dispatch: one of each record-level problem, appended to the first exporter file.
    dispatch = sorted((root / "dispatch").glob("*.jsonl"))[0]
    good = json.loads(_lines(dispatch)[0])
    first_line = _lines(dispatch)[0]

    # Each bad variant gets a second in which its scope has no record, so that it is not also a
    # duplicate of a good record by key and has exactly one problem.
    scope = [good.get(k) for k in ("level", "broker", "topic", "subscription")]
    used = {r["period_start"] for r in map(json.loads, _lines(dispatch)) if [r.get(k) for k in ("level", "broker", "topic", "subscription")] == scope}
    free = (s for s in (f"{day.isoformat()}T00:{m:02d}:{x:02d}Z" for m in range(60) for x in range(60)) if s not in used)

    def variant(**changes):
        rec = dict(good, period_start=next(free))
        for key, value in changes.items():
            if value is _DROP:
                rec.pop(key)
            else:
                rec[key] = value
        return json.dumps(rec, separators=(",", ":"))

    yesterday = (day - timedelta(days=1)).isoformat() + "T23:59:59Z"
    _append(
        dispatch,
        landing,
        "dispatch",
        [
            (first_line[: len(first_line) // 2], "malformed-json", "record cut in the middle"),
            (variant(msgs=_DROP), "missing-field", "msgs absent"),
            (variant(msgs=str(good["msgs"])), "wrong-type", "msgs is a string"),
            (variant(msgs=-3), "negative-counter", "msgs = -3"),
            (variant(period_start=yesterday), "outside-day", f"period_start {yesterday}"),
            (variant(level="namespace"), "unknown-enum", "level 'namespace'"),
            (first_line, "duplicate", "exact copy of line 1"),
        ],
        out,
    )

    producer = sorted((root / "producer-stats").glob("*.jsonl"))[0]
    p_first = _lines(producer)[0]
    rec = json.loads(p_first)
    no_name = {k: v for k, v in rec.items() if k != "producer_name"}
    negative = json.loads(p_first)
    negative["stats"]["numMsgsSent"] = -5
    negative["collected_at"] = negative["collected_at"].replace(":05:00Z", ":05:01Z")
    brotli = json.loads(p_first)
    brotli["config"]["compressionType"] = "BROTLI"
    brotli["collected_at"] = brotli["collected_at"].replace(":05:00Z", ":05:02Z")
    _append(
        producer,
        landing,
        "producer-stats",
        [
            (json.dumps(no_name, separators=(",", ":")), "missing-field", "producer_name absent"),
            (json.dumps(negative, separators=(",", ":")), "negative-counter", "stats.numMsgsSent = -5"),
            (json.dumps(brotli, separators=(",", ":")), "unknown-enum", "config.compressionType 'BROTLI'"),
            (p_first, "duplicate", "exact copy of line 1"),
        ],
        out,
    )

    policies = root / "policies" / "dispatch-rate.jsonl"
    pol = json.loads(_lines(policies)[0])
    _append(
        policies,
        landing,
        "policies",
        [
            (json.dumps({**pol, "kind": "cluster-dispatch-rate"}, separators=(",", ":")), "unknown-enum", "kind 'cluster-dispatch-rate'"),
            (
                json.dumps(
                    {**pol, "effective_at": pol["effective_at"].replace(":00Z", ":01Z"), "policy": {**pol["policy"], "dispatchThrottlingRateInMsg": "ten"}},
                    separators=(",", ":"),
                ),
                "wrong-type",
                "policy.dispatchThrottlingRateInMsg is a string",
            ),
            ('{"effective_at": "' + day.isoformat() + 'T06:00:00Z", "cluster": "' + cluster + '", "kind": ', "malformed-json", "record cut in the middle"),
        ],
        out,
    )

    metrics = sorted((root / "metrics").glob("*.prom"))[0]
    sample = next(line for line in _lines(metrics) if line.startswith("pulsar_out_messages_total{"))
    labels = sample[: sample.rindex(" ")]
    _append(
        metrics,
        landing,
        "metrics",
        [
            (
                labels + " -5.0",
                "negative-counter",
                "counter pulsar_out_messages_total = -5",
            ),
            (labels + " fast", "wrong-type", "sample value 'fast' is not a number"),
        ],
        out,
    )

    # Whole-file problems in the JSON kinds.
    ts = sorted((root / "topic-stats").glob("*.json"))[0]
    envelopes = json.loads(ts.read_text())
    # A non-partitioned topic's stats: its counters are the ones land reads.
    env = next(e for e in envelopes if "partitions" not in e["stats"])
    _whole_file(
        root / "topic-stats" / "zz-bad-missing-stats.json",
        landing,
        "topic-stats",
        json.dumps({k: v for k, v in env.items() if k != "stats"}).encode(),
        "missing-field",
        "envelope without stats",
        out,
    )
    body = json.loads(json.dumps(env))
    stats = body["stats"]
    next(iter(stats["subscriptions"].values()))["msgOutCounter"] = -1
    body["collected_at"] = body["collected_at"].replace(":05:00Z", ":05:03Z")
    _whole_file(
        root / "topic-stats" / "zz-bad-negative-counter.json",
        landing,
        "topic-stats",
        json.dumps(body).encode(),
        "negative-counter",
        "subscription msgOutCounter = -1",
        out,
    )
    text = json.dumps(env)
    _whole_file(
        root / "topic-stats" / "zz-bad-truncated.json", landing, "topic-stats", text[: len(text) // 3].encode(), "malformed-json", "file cut short", out
    )

    internal = sorted((root / "internal-stats").glob("*.json"))[0]
    ienv = json.loads(internal.read_text())[0]
    old = json.loads(json.dumps(ienv))
    old["collected_at"] = (day - timedelta(days=1)).isoformat() + "T23:55:00Z"
    _whole_file(
        root / "internal-stats" / "zz-bad-outside-day.json",
        landing,
        "internal-stats",
        json.dumps(old).encode(),
        "outside-day",
        f"collected_at {old['collected_at']}",
        out,
    )
    broken = json.loads(json.dumps(ienv))
    broken["collected_at"] = broken["collected_at"].replace(":55:00Z", ":55:01Z")
    cursor = next(iter(broken["stats"]["cursors"].values()))
    cursor["individuallyDeletedMessages"] = "[(3:4..3:6], (3:7.."
    _whole_file(
        root / "internal-stats" / "zz-bad-ranges.json",
        landing,
        "internal-stats",
        json.dumps(broken).encode(),
        "malformed-ranges",
        "individuallyDeletedMessages cut short",
        out,
    )
    # The envelope itself is fine: land keeps it; build quarantines the cursor's ranges.
    out[-1].update(stage="build", kind="cursor_ranges")
    # Not text at all: a truncated gzip stream where JSON was expected.
    _whole_file(
        root / "internal-stats" / "zz-bad-unreadable.json",
        landing,
        "internal-stats",
        bytes([0x1F, 0x8B, 0x08, 0x00, 0xFF, 0xFE, 0x00, 0x9C, 0xC3, 0x28]) * 8,
        "unreadable-file",
        "not UTF-8 text (gzip bytes)",
        out,
    )
    return out


class _Drop:
    pass


_DROP = _Drop()


def manifest(
    sim,
    day: date,
    scale: float,
    seed: int,
    counts: dict,
    bad_records: list[dict],
    dispatch_scopes: list[dict],
    policy_changes: list[dict],
    spanning: list[dict],
) -> dict:
    over, near, forecast = [], [], []
    for t, _i, name, broker in sim.partitions:
        for s in t.subs:
            cursor = sim.cursors[name][s.name]
            end = cursor.count(DAY_END)
            # Slope at the end of the day from the last hour, ranges per hour.
            slope = float(end - cursor.count(DAY_END - 3600))
            row = {"topic": name, "subscription": s.name, "subscription_type": s.type, "broker": broker, "ranges_end_of_day": end}
            if end >= CAP:
                over.append({**row, "ranges_over_cap": end - CAP})
            elif end >= 8000:
                near.append(row)
            if end < CAP and slope > 0 and (CAP - end) / slope <= 24:
                forecast.append({**row, "ranges_per_hour": slope, "hours_to_cap": round((CAP - end) / slope, 1)})
    c = sim.cluster
    return {
        "format": MANIFEST_FORMAT,
        "complete": True,
        "day": day.isoformat(),
        "scale": scale,
        "seed": seed,
        "cluster": "c1",
        "counts": counts,
        "bad_records": bad_records,
        "expectations": {
            "cap": CAP,
            "subscriptions_over_cap": over,
            "subscriptions_near_cap": near,
            "subscriptions_forecast_to_cap": forecast,
            "ranges_spanning_ledgers": spanning,
            "bad_producers": [{"topic": p.topic.name, "producer_name": p.name, "issues": p.issues} for p in c.producers if p.issues],
            "good_producers": [{"topic": p.topic.name, "producer_name": p.name} for p in c.producers if not p.issues],
            "dispatch_exporter_brokers": c.exporter_brokers,
            "dispatch_scopes": dispatch_scopes,
            "counter_resets": [{"topic": topic, "at": f"{day.isoformat()}T{s // 3600:02d}:{s % 3600 // 60:02d}:00Z"} for topic, s in c.counter_resets.items()],
            "policy_changes": policy_changes,
            "brokers": c.brokers,
            "topics": [{"topic": t.name, "partitions": t.partitions, "subscriptions": {s.name: s.type for s in t.subs}} for t in c.topics],
        },
    }
