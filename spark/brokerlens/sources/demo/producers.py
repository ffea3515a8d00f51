"""Producer stats as a client application reports them: the Java client's ProducerStats of the
last stats interval with its ProducerConfigurationData and memoryLimitBytes, a JSON Lines file
per producer, a line per collection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .cluster import CLUSTER
from .schedule import SNAPSHOTS, dumps, hash_stable, iso

if TYPE_CHECKING:
    from .day import Day


def write_producer_stats(day: Day, out: Path) -> tuple[int, int]:
    records = 0
    for p in day.cluster.producers:
        t = p.topic
        names = t.partition_names()
        published = sum(day.published[n] for n in names)
        lines = []
        total_msgs = total_bytes = total_failed = 0
        rng = np.random.Generator(np.random.PCG64([day.seed, 4, hash_stable(p.name)]))
        n_parts = max(t.partitions, 1)
        batch_cap = min(
            p.config["batchingMaxMessages"],
            p.config["maxPendingMessages"] // 2 if p.issues == ["batching-max-messages-over-max-pending"] else p.config["batchingMaxMessages"],
        )
        for k, second in enumerate(SNAPSHOTS):
            # The client's stats interval is 60 s: numbers are for the last minute.
            msgs = int(published[k] / 10)
            failed = {kind: int(rng.poisson(rate)) for kind, rate in p.send_failures.items()}
            n_failed = sum(failed.values())
            msg_bytes = msgs * t.msg_bytes
            compressed = int(msg_bytes * (0.45 if p.config["compressionType"] != "NONE" else 1.0))
            batches = 0 if msgs == 0 else (msgs if not p.config["batchingEnabled"] else max(1, int(msgs / min(batch_cap, max(1.0, t.batch_mean * 3)))))
            total_msgs += msgs
            total_bytes += compressed
            total_failed += n_failed
            slow = "memory-limit-too-small" in p.issues
            lat = float(rng.uniform(2.0, 4.0)) * (6 if slow else 1)
            pending = int(
                p.config["maxPendingMessages"] * (0.98 if slow or p.issues[:1] == ["batching-max-messages-over-max-pending"] else rng.uniform(0.02, 0.2))
            )
            stats = {
                "numMsgsSent": msgs,
                "numBytesSent": compressed,
                "numSendFailed": n_failed,
                "numAcksReceived": msgs,
                "sendMsgsRate": round(msgs / 60, 3),
                "sendBytesRate": round(compressed / 60, 3),
                "sendLatencyMillis50pct": round(lat, 3),
                "sendLatencyMillis75pct": round(lat * 1.3, 3),
                "sendLatencyMillis95pct": round(lat * 2.4, 3),
                "sendLatencyMillis99pct": round(lat * 4, 3),
                "sendLatencyMillis999pct": round(lat * 12, 3),
                "sendLatencyMillisMax": round(lat * 25, 3),
                "totalMsgsSent": total_msgs,
                "totalBytesSent": total_bytes,
                "totalSendFailed": total_failed,
                "totalAcksReceived": total_msgs,
                "pendingQueueSize": pending,
            }
            if t.partitions:
                weights = np.ones(n_parts)
                weights[0] += p.skew * n_parts
                weights /= weights.sum()
                stats["partitionStats"] = {n: {"sendMsgsRate": round(msgs / 60 * w, 3)} for n, w in zip(names, weights)}
            rec = {
                "collected_at": iso(day.day, int(second)),
                "cluster": CLUSTER,
                "topic": t.name,
                "producer_name": p.name,
                "partitions": t.partitions,
                "config": p.config,
                "client": {"memoryLimitBytes": p.memory_limit},
                "stats": stats,
                "extra": {
                    "numBatchesSent": batches,
                    "uncompressedBytesSent": int(msg_bytes),
                    "sendFailedByKind": {
                        "ProducerQueueIsFullError": failed.get("ProducerQueueIsFullError", 0),
                        "MemoryBufferIsFullError": 0,
                        "TimeoutException": 0,
                    },
                },
            }
            lines.append(dumps(rec))
        (out / f"{p.name}.jsonl").write_text("\n".join(lines) + "\n")
        records += len(lines)
    return len(day.cluster.producers), records
