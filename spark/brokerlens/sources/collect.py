"""``brokerlens collect``: snapshot a live cluster's admin REST API into landing.

One run lists tenants, namespaces and topics and writes, in the envelope of DESIGN.md
"Landing formats", under ``<landing>/<UTC day of the collection>/``:

* ``topic-stats/collect-<HHMMSS-mmm>.json``: ``GET .../{topic}/stats`` per non-partitioned topic and
  ``GET .../{topic}/partitioned-stats?perPartition=true`` per partitioned topic;
* ``internal-stats/collect-<HHMMSS-mmm>.json``: ``GET .../{partition}/internalStats`` per partition;
* ``policies/collect-<HHMMSS-mmm>.jsonl``: broker configuration (runtime configuration overlaid with
  the dynamic values), namespace and topic ``dispatchRate`` / ``subscriptionDispatchRate``,
  only when they differ from the last collected value (``<landing>/_collect_state.json``), so
  ``effective_at`` marks a change, and ``"policy": null`` a removal.

Requests carry ``Authorization: Bearer <admin_token>``; the token is never logged or written.
Transient failures (connection errors, timeouts, HTTP 429/5xx) are retried with doubling back-off;
requests run on a bounded thread pool. A topic that fails after the retries is reported and
skipped; a failure to list the cluster stops the run with a readable error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlsplit

import requests

from brokerlens.platform.settings import Settings
from brokerlens.platform.stage import StageFailed, StageResult

log = logging.getLogger(__name__)

# broker.conf keys landing needs (DESIGN.md "Dispatch throttling", "Unacked ranges and holes"): the
# limiter factory decides the limiter model, the backlogged threshold when a cursor is charged.
BROKER_KEYS = re.compile(
    r"^(dispatchThrottling.*|dispatcherMaxReadBatchSize|dispatcherMinReadBatchSize|preciseDispatcherFlowControl"
    r"|dispatchRateLimiterFactoryClassName|managedLedgerCursorBackloggedThreshold"
    r"|managedLedgerMaxUnackedRangesToPersist|managedLedgerMaxEntriesPerLedger|topicLevelPoliciesEnabled)$"
)
RETRY_STATUS = {429, 500, 502, 503, 504}
# The Pulsar series the analytics read (silver.intervals.OUT_COUNTERS, silver.cursors.CURSOR_RANGES_METRIC, the limiter
# model's pulsar_version_info and PIP-406 throttle events), as one PromQL selector.
PROMETHEUS_SELECTOR = (
    '{__name__=~"pulsar_out_messages_total|pulsar_out_bytes_total'
    '|brk_ml_cursor_nonContiguousDeletedMessagesRange|pulsar_version_info|pulsar_.*throttled.*"}'
)
PROMETHEUS_STEP_SECONDS = 60
# Steps per query_range request: with Prometheus' limit of 11,000 points per series, and small
# responses (a 60 s step gives 4-hour chunks).
PROMETHEUS_CHUNK_STEPS = 240
STATE_FILE = "_collect_state.json"


class CollectError(StageFailed):
    """The admin API could not be read; the message says which request and why (never the token)."""


class AdminClient:
    """Thin client over the admin REST API: auth header, timeouts, retries, one session per thread."""

    def __init__(self, url: str, settings: Settings, send_token: bool = True):
        self.base = url.rstrip("/")
        self.conf = settings.collect
        # The admin token is Pulsar's: never sent to another service (Prometheus).
        self._token = settings.admin_token if send_token else None
        self._local = threading.local()
        self.requests = 0

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["Accept"] = "application/json"
            if self._token is not None:
                session.headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
            self._local.session = session
        return session

    def get(self, path: str, params: dict | None = None, missing_ok: bool = False):
        """JSON of ``GET path``; None for 204/empty/null, and for 404/405 when ``missing_ok``."""
        attempt = 0
        while True:
            self.requests += 1
            try:
                response = self._session().get(self.base + path, params=params, timeout=self.conf.timeout_seconds)
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = f"{type(exc).__name__}"
            else:
                status = response.status_code
                if status in (401, 403):
                    raise CollectError(f"GET {path}: HTTP {status}, the admin API refused the credentials "
                                       f"(check admin_token and the role's permissions)")
                if status in (404, 405) and missing_ok:
                    return None
                if status not in RETRY_STATUS:
                    if status >= 400:
                        raise CollectError(f"GET {path}: HTTP {status} {_reason(response)}")
                    if status == 204 or not response.content.strip():
                        return None
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise CollectError(f"GET {path}: response is not JSON ({exc})") from None
                problem = f"HTTP {status} {_reason(response)}"
            if attempt >= self.conf.retries:
                raise CollectError(f"GET {path}: {problem} after {attempt + 1} attempts")
            delay = self.conf.backoff_seconds * (2 ** attempt)
            log.warning("GET %s: %s; retry %d/%d in %.1fs", path, problem, attempt + 1, self.conf.retries, delay)
            time.sleep(delay)
            attempt += 1


def _reason(response: requests.Response) -> str:
    # Pulsar's error body is {"reason": "..."}.
    try:
        return str(response.json().get("reason", ""))[:200]
    except (ValueError, AttributeError):
        return response.text[:200]


def _typed(value):
    """Runtime/dynamic config values arrive as strings; land expects numbers and booleans."""
    if not isinstance(value, str):
        return value
    if value in ("true", "false"):
        return value == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _topic_path(topic: str) -> str:
    """``persistent://t/ns/x`` → ``/admin/v2/persistent/t/ns/x`` (each part URL-encoded)."""
    domain, rest = topic.split("://", 1)
    return f"/admin/v2/{domain}/" + "/".join(quote(part, safe="") for part in rest.split("/"))


def _write_atomic(path: Path, text: str) -> None:
    # Land may scan the folder at any time: it must never see a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _list_topics(client: AdminClient, tenants: list[str]) -> tuple[list[str], list[str], list[str]]:
    namespaces = [ns for tenant in tenants for ns in client.get(f"/admin/v2/namespaces/{quote(tenant, safe='')}") or []]
    partitioned, plain = [], []
    for ns in namespaces:
        tenant, name = ns.split("/", 1)
        base = f"/admin/v2/persistent/{quote(tenant, safe='')}/{quote(name, safe='')}"
        parted = client.get(base + "/partitioned") or []
        partitioned += parted
        parts = re.compile("^(" + "|".join(re.escape(p) for p in parted) + r")-partition-\d+$") if parted else None
        # The plain list also names every partition of the partitioned topics: those are
        # collected through partitioned-stats.
        plain += [t for t in client.get(base) or [] if not (parts and parts.match(t))]
    return namespaces, partitioned, plain


def _envelope(collected_at: str, cluster: str, broker: str | None, topic: str, stats) -> dict:
    return {"collected_at": collected_at, "cluster": cluster, "broker": broker, "topic": topic, "stats": stats}


def _owner(client: AdminClient, topic: str, stats: dict) -> str | None:
    """Broker serving the topic: ``ownerBroker`` (Pulsar 3.x stats), else a lookup."""
    if stats.get("ownerBroker"):
        return stats["ownerBroker"]
    lookup = client.get("/lookup/v2/topic/" + _topic_path(topic).removeprefix("/admin/v2/"), missing_ok=True) or {}
    url = lookup.get("httpUrl") or lookup.get("brokerUrl")
    return urlsplit(url).netloc if url else None


def collect(
    day: date | None,
    settings: Settings,
    admin_url: str | None = None,
    prometheus_url: str | None = None,
    step_seconds: int = PROMETHEUS_STEP_SECONDS,
) -> StageResult:
    if prometheus_url:
        return collect_prometheus(day, settings, prometheus_url, step_seconds)
    url = admin_url or settings.admin_url
    if not url:
        raise CollectError("no admin URL: pass --admin-url or set admin_url (BROKERLENS_ADMIN_URL)")
    clock = datetime.now(timezone.utc)
    now = clock.replace(microsecond=0)
    if day is not None and day != now.date():
        raise CollectError(f"collect snapshots the cluster now ({now.date()} UTC); it cannot collect {day}")
    client = AdminClient(url, settings)
    conf = settings.collect
    log.info("collect: %s", client.base)

    cluster = conf.cluster or next(iter(client.get("/admin/v2/clusters") or []), None)
    if cluster is None:
        raise CollectError("GET /admin/v2/clusters returned no cluster; set collect.cluster")
    tenants = conf.tenants or client.get("/admin/v2/tenants") or []
    namespaces, partitioned, plain = _list_topics(client, tenants)
    brokers = client.get(f"/admin/v2/brokers/{quote(cluster, safe='')}", missing_ok=True) or []
    # The snapshot's time is taken when its stats are asked for, after the listing (which a loaded
    # broker can take a second over), to the millisecond: snapshots a second apart are judged
    # against limits of one second.
    clock = datetime.now(timezone.utc)
    stamp = clock.strftime("%H%M%S-%f")[:-3]
    collected_at = f"{clock.strftime('%Y-%m-%dT%H:%M:%S')}.{stamp[-3:]}Z"
    root = settings.landing / clock.date().isoformat()

    errors: list[str] = []

    def guarded(fn, *args):
        try:
            return fn(*args)
        except CollectError as exc:
            if "refused the credentials" in str(exc):
                raise
            log.warning("collect: %s", exc)
            errors.append(str(exc))
            return None

    def stats_of(topic: str, is_partitioned: bool):
        path = _topic_path(topic)
        if is_partitioned:
            stats = client.get(path + "/partitioned-stats", params={"perPartition": "true"})
            partitions = sorted((stats or {}).get("partitions", {}))
            first = stats["partitions"][partitions[0]] if partitions else {}
            envelope = _envelope(collected_at, cluster, _owner(client, partitions[0], first) if partitions else None,
                                 topic, stats)
        else:
            stats = client.get(path + "/stats")
            partitions = [topic]
            envelope = _envelope(collected_at, cluster, _owner(client, topic, stats), topic, stats)
        internal = []
        if conf.internal_stats:
            owners = {p: (stats.get("partitions", {}).get(p, {}) if is_partitioned else stats).get("ownerBroker")
                      for p in partitions}
            for p in partitions:
                internal.append(_envelope(collected_at, cluster, owners[p] or envelope["broker"], p,
                                          client.get(_topic_path(p) + "/internalStats")))
        return envelope, internal

    def topic_policies(topic: str):
        path = _topic_path(topic)
        return [("topic-dispatch-rate", topic, client.get(path + "/dispatchRate", missing_ok=True)),
                ("topic-subscription-dispatch-rate", topic,
                 client.get(path + "/subscriptionDispatchRate", missing_ok=True))]

    def namespace_policies(ns: str):
        tenant, name = ns.split("/", 1)
        path = f"/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(name, safe='')}"
        return [("namespace-dispatch-rate", ns, client.get(path + "/dispatchRate", missing_ok=True)),
                ("namespace-subscription-dispatch-rate", ns,
                 client.get(path + "/subscriptionDispatchRate", missing_ok=True))]

    with ThreadPoolExecutor(max_workers=conf.concurrency, thread_name_prefix="collect") as pool:
        stat_jobs = [pool.submit(guarded, stats_of, t, True) for t in partitioned]
        stat_jobs += [pool.submit(guarded, stats_of, t, False) for t in plain]
        policy_jobs = [pool.submit(guarded, namespace_policies, ns) for ns in namespaces]
        policy_jobs += [pool.submit(guarded, topic_policies, t) for t in partitioned + plain]
        broker_job = pool.submit(guarded, _broker_config, client)
        results = [job.result() for job in stat_jobs]
        policies = [p for job in policy_jobs for p in (job.result() or [])]
        config = broker_job.result()

    topic_envelopes = [r[0] for r in results if r]
    internal_envelopes = [e for r in results if r for e in r[1]]
    if topic_envelopes:
        _write_atomic(root / "topic-stats" / f"collect-{stamp}.json", json.dumps(topic_envelopes) + "\n")
    if internal_envelopes:
        _write_atomic(root / "internal-stats" / f"collect-{stamp}.json", json.dumps(internal_envelopes) + "\n")

    observed = [(kind, scope, policy) for kind, scope, policy in policies]
    if config is not None:
        observed += [("broker-config", broker, config) for broker in brokers]
    changed = _changed_policies(settings.landing / STATE_FILE, cluster, observed)
    if changed:
        lines = []
        for kind, scope, policy in changed:
            key = "broker" if kind == "broker-config" else "topic" if kind.startswith("topic") else "namespace"
            lines.append(json.dumps({"effective_at": collected_at, "cluster": cluster, "kind": kind, key: scope,
                                     "policy": policy}))
        _write_atomic(root / "policies" / f"collect-{stamp}.jsonl", "\n".join(lines) + "\n")

    result = StageResult(stage="collect", day=clock.date())
    result.metrics.update({"topics": len(topic_envelopes), "partitions": len(internal_envelopes),
                           "policy_changes": len(changed), "requests": client.requests, "errors": len(errors)})
    result.lines.append(f"landing: {root} (collected_at {collected_at}, cluster {cluster})")
    result.lines += [f"skipped: {e}" for e in errors]
    if errors and not topic_envelopes:
        raise CollectError("no topic could be collected:\n" + "\n".join(errors))
    return result


def _broker_config(client: AdminClient) -> dict:
    """Runtime configuration overlaid with the dynamic values, dispatch and cursor keys only."""
    runtime = client.get("/admin/v2/brokers/configuration/runtime", missing_ok=True) or {}
    dynamic = client.get("/admin/v2/brokers/configuration/values", missing_ok=True) or {}
    merged = {**runtime, **dynamic}
    return {k: _typed(v) for k, v in sorted(merged.items()) if BROKER_KEYS.match(k)}


def _changed_policies(state_path: Path, cluster: str, observed: list[tuple[str, str, dict | None]]):
    """Policies that differ from the last collected value; updates the state file."""
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    changed = []
    for kind, scope, policy in observed:
        key = f"{cluster}|{kind}|{scope}"
        if key not in state and policy is None:
            continue  # never set: nothing to record
        if state.get(key, "absent") != policy:
            changed.append((kind, scope, policy))
            state[key] = policy
    _write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n")
    return changed


def _label_text(labels: dict) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


def _file_broker(instance: str) -> str:
    # A landing file name holds no ':' (metrics.py reads a trailing _<port> as :<port>) nor '/' or '@'.
    return re.sub(r"[^A-Za-z0-9._-]", "_", instance.replace(":", "_")) or "prometheus"


def collect_prometheus(day: date | None, settings: Settings, url: str, step_seconds: int) -> StageResult:
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
        body = client.get("/api/v1/query_range", params={
            "query": PROMETHEUS_SELECTOR, "start": chunk_start, "end": chunk_end, "step": f"{step_seconds}s",
        })
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
            _write_atomic(folder / f"{_file_broker(instance)}@prometheus-{stamp}.prom", "\n".join(lines) + "\n")
            files += 1
            samples += len(lines)
    result = StageResult(stage="collect", day=day)
    result.metrics.update({"series": len(series_seen), "samples": samples, "files": files, "requests": client.requests})
    result.lines.append(f"landing: {folder} ({samples} samples of {len(series_seen)} series from {client.base})")
    return result
