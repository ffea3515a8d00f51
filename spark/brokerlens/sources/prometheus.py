"""``brokerlens collect --prometheus-url``: a day of Pulsar series from a Prometheus server into
landing, as scrape files."""

from __future__ import annotations

import re
from datetime import date, datetime, timezone

from brokerlens.platform.stage import StageResult
from brokerlens.sources.settings import SourcesStepSettings

from .admin_api import AdminClient, CollectError
from .landing import write_atomic

# The Pulsar series the analytics read (silver.intervals.OUT_COUNTERS, silver.cursors.CURSOR_RANGES_METRICS, the limiter
# model's pulsar_version_info and PIP-406 throttle events), as one PromQL selector.
PROMETHEUS_SELECTOR = (
    '{__name__=~"pulsar_out_messages_total|pulsar_out_bytes_total'
    '|(pulsar|brk)_ml_cursor_nonContiguousDeletedMessagesRange|pulsar_version_info|pulsar_.*throttled.*"}'
)
PROMETHEUS_STEP_SECONDS = 60
# Steps per query_range request: with Prometheus' limit of 11,000 points per series, and small
# responses (a 60 s step gives 4-hour chunks).
PROMETHEUS_CHUNK_STEPS = 240


def _label_text(labels: dict) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


def file_broker(instance: str) -> str:
    # A landing file name holds no ':' (metrics.py reads a trailing _<port> as :<port>) nor '/' or '@'.
    return re.sub(r"[^A-Za-z0-9._-]", "_", instance.replace(":", "_")) or "prometheus"


def collect_prometheus(day: date | None, settings: SourcesStepSettings, url: str, step_seconds: int) -> StageResult:
    """The day's Pulsar series from a Prometheus server (HTTP API ``query_range``) into
    ``metrics/<instance>@prometheus-<HHMM>.prom`` files, one per broker and chunk, in the text
    exposition format with millisecond timestamps, so that they land like scrape files."""
    if day is None:
        raise CollectError("collect --prometheus-url needs --date: the day to pull")
    if step_seconds <= 0:
        raise CollectError(f"step must be positive, got {step_seconds}")
    client = AdminClient(url, settings, send_token=False)
    start = int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp())
    end = start + 86400
    chunk = step_seconds * PROMETHEUS_CHUNK_STEPS
    folder = settings.landing / day.isoformat() / "metrics"
    files = samples = 0
    series_seen: set[tuple] = set()
    for chunk_start in range(start, end, chunk):
        # query_range includes both ends: stop one step short of the next chunk.
        chunk_end = min(chunk_start + chunk, end) - step_seconds
        if chunk_end < chunk_start:
            chunk_end = chunk_start
        body = client.get(
            "/api/v1/query_range",
            params={
                "query": PROMETHEUS_SELECTOR,
                "start": chunk_start,
                "end": chunk_end,
                "step": f"{step_seconds}s",
            },
        )
        if not body or body.get("status") != "success" or body.get("data", {}).get("resultType") != "matrix":
            raise CollectError(f"GET /api/v1/query_range: unexpected answer {str(body)[:200]}")
        by_instance: dict[str, list[str]] = {}
        for series in body["data"]["result"]:
            labels = dict(series["metric"])
            name = labels.pop("__name__")
            series_seen.add((name, tuple(sorted(labels.items()))))
            text = f"{name}{{{_label_text(labels)}}}"
            lines = by_instance.setdefault(labels.get("instance", ""), [])
            lines += [f"{text} {value} {int(round(float(at) * 1000))}" for at, value in series["values"]]
        stamp = datetime.fromtimestamp(chunk_start, timezone.utc).strftime("%H%M")
        for instance, lines in sorted(by_instance.items()):
            write_atomic(folder / f"{file_broker(instance)}@prometheus-{stamp}.prom", "\n".join(lines) + "\n")
            files += 1
            samples += len(lines)
    result = StageResult(stage="collect", day=day)
    result.metrics.update({"series": len(series_seen), "samples": samples, "files": files, "requests": client.requests})
    result.lines.append(f"landing: {folder} ({samples} samples of {len(series_seen)} series from {client.base})")
    return result
