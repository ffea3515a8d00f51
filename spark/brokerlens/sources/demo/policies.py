"""Policy records: dispatch-rate policies of topics and namespaces (topic and subscription level)
and each broker's broker.conf, with the time each took effect."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .cluster import CLUSTER
from .schedule import dumps, iso

if TYPE_CHECKING:
    from .day import Day


def write_policies(day: Day, out: Path) -> tuple[int, int, list[dict]]:
    c = day.cluster
    broker_lines = [
        dumps({"effective_at": iso(day.day, 0), "cluster": CLUSTER, "kind": "broker-config", "broker": b, "policy": c.broker_config[b]}) for b in c.brokers
    ]
    (out / "broker-config.jsonl").write_text("\n".join(broker_lines) + "\n")
    lines, changes = [], []
    for p in sorted(c.policies, key=lambda p: (p.at, p.kind, p.scope)):
        scope_key = "topic" if p.kind.startswith("topic") else "namespace"
        rec = {"effective_at": iso(day.day, p.at), "cluster": CLUSTER, "kind": p.kind, scope_key: p.scope, "policy": p.policy}
        lines.append(dumps(rec))
        changes.append({k: v for k, v in rec.items() if k != "cluster"})
    (out / "dispatch-rate.jsonl").write_text("\n".join(lines) + "\n")
    return 2, len(broker_lines) + len(lines), changes
