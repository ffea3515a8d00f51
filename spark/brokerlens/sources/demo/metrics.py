"""Broker /metrics in Prometheus text format: Pulsar's per-topic and per-subscription series
(pulsar_out_messages_total, pulsar_subscription_back_log, ...), one file per broker and scrape."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .cluster import CLUSTER
from .schedule import METRICS, SNAPSHOTS, dumps, hhmm, iso
from .stats import topic_stats

if TYPE_CHECKING:
    from .day import Day


def safe(name: str) -> str:
    return name.replace("persistent://", "").replace("/", "_").replace(":", "_")


METRIC_HELP = {
    "pulsar_rate_in": "gauge",
    "pulsar_rate_out": "gauge",
    "pulsar_throughput_in": "gauge",
    "pulsar_throughput_out": "gauge",
    "pulsar_storage_size": "gauge",
    "pulsar_msg_backlog": "gauge",
    "pulsar_in_messages_total": "counter",
    "pulsar_out_messages_total": "counter",
    "pulsar_subscription_back_log": "gauge",
    "pulsar_subscription_msg_rate_out": "gauge",
    "pulsar_subscription_msg_throughput_out": "gauge",
    "pulsar_subscription_msg_rate_redeliver": "gauge",
    "pulsar_subscription_unacked_messages": "gauge",
    "pulsar_subscription_delayed": "gauge",
    "pulsar_subscription_consumers_count": "gauge",
}


def write_metrics(day: Day, out: Path) -> tuple[int, int]:
    files = 0
    for second in METRICS:
        k = int(np.searchsorted(SNAPSHOTS, second))
        samples: dict[str, dict[str, list[str]]] = {}
        for t, i, name, broker in day.partitions:
            st = topic_stats(day, t, i, name, broker, k)
            labels = f'cluster="{CLUSTER}",namespace="{t.ns}",topic="{name}"'
            rows = samples.setdefault(broker, {m: [] for m in METRIC_HELP})
            for metric, value in (
                ("pulsar_rate_in", st["msgRateIn"]),
                ("pulsar_rate_out", st["msgRateOut"]),
                ("pulsar_throughput_in", st["msgThroughputIn"]),
                ("pulsar_throughput_out", st["msgThroughputOut"]),
                ("pulsar_storage_size", st["storageSize"]),
                ("pulsar_msg_backlog", sum(s["msgBacklog"] for s in st["subscriptions"].values())),
                ("pulsar_in_messages_total", st["msgInCounter"]),
                ("pulsar_out_messages_total", st["msgOutCounter"]),
            ):
                rows[metric].append(f"{metric}{{{labels}}} {float(value)}")
            for sub, s in st["subscriptions"].items():
                sl = f'{labels},subscription="{sub}"'
                for metric, value in (
                    ("pulsar_subscription_back_log", s["msgBacklog"]),
                    ("pulsar_subscription_msg_rate_out", s["msgRateOut"]),
                    ("pulsar_subscription_msg_throughput_out", s["msgThroughputOut"]),
                    ("pulsar_subscription_msg_rate_redeliver", s["msgRateRedeliver"]),
                    ("pulsar_subscription_unacked_messages", s["unackedMessages"]),
                    ("pulsar_subscription_delayed", s["msgDelayed"]),
                    ("pulsar_subscription_consumers_count", len(s["consumers"])),
                ):
                    rows[metric].append(f"{metric}{{{sl}}} {float(value)}")
        for broker, rows in samples.items():
            head = dumps({"collected_at": iso(day.day, int(second)), "cluster": CLUSTER, "broker": broker})
            text = [f"# brokerlens: {head}"]
            for metric, kind in METRIC_HELP.items():
                text.append(f"# TYPE {metric} {kind}")
                text += rows[metric]
            (out / f"{safe(broker)}-{hhmm(int(second))}.prom").write_text("\n".join(text) + "\n")
            files += 1
    return files, files
