"""``brokerlens collect``: snapshot a live cluster's admin REST API into landing.

One run lists tenants, namespaces and topics and writes, in the envelope of schemas/landing/README.md
"Landing formats", under ``<landing>/<UTC day of the collection>/`` (the stats under the day of
their own ``collected_at``: each topic's is when its stats were asked for):

* ``topic-stats/collect-<HHMMSS-mmm>.json``: ``GET .../{topic}/stats`` per non-partitioned topic and
  ``GET .../{topic}/partitioned-stats?perPartition=true`` per partitioned topic;
* ``internal-stats/collect-<HHMMSS-mmm>.json``: ``GET .../{partition}/internalStats`` per partition;
* ``policies/collect-<HHMMSS-mmm>.jsonl``: broker configuration (runtime configuration overlaid with
  the dynamic values), namespace and topic ``dispatchRate`` / ``subscriptionDispatchRate``,
  only when they differ from the last collected value (``<landing>/_collect_state.json``), so
  ``effective_at`` marks a change, and ``"policy": null`` a removal;
* with ``collect.metrics``, ``metrics/<broker>@collect-<HHMMSS-mmm>.prom``: each broker's ``/metrics``
  as it serves it, after a ``# brokerlens:`` header naming the collection time, cluster and broker.
* with ``collect.exporter`` (default), ``dispatch/exporter-<broker>-<HHMMSS-mmm>.jsonl`` under the day of
  each record's ``period_start``: the per-period records of brokerlens' broker interceptor, those
  after the last ``seq`` landed (sources/exporter.py); a broker without it is said once and skipped.

Collects may run at once into one landing (two clusters, a manual run beside the scheduled one):
a file never replaces another collect's (``collect-<HHMMSS-mmm>-2.json`` when the name is taken),
and the state file is read and rewritten under a lock (sources/landing.py).

Requests carry ``Authorization: Bearer <admin_token>``; the token is never logged or written.
Transient failures (connection errors, timeouts, HTTP 429/5xx) are retried with doubling back-off;
requests run on a bounded thread pool. A topic that fails after the retries is reported and
skipped; a failure to list the cluster stops the run with a readable error.
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlsplit

from brokerlens.platform.stage import StageResult
from brokerlens.sources.settings import SourcesStepSettings

from .admin_api import AdminClient, CollectError
from .exporter import ExporterResult, collect_exporter
from .landing import locked, write_atomic, write_new
from .prometheus import PROMETHEUS_STEP_SECONDS, collect_prometheus, file_broker

log = logging.getLogger(__name__)

# broker.conf keys landing needs: the dispatch limits and rules (the limiter factory decides the
# limiter model, the backlogged threshold when a cursor is charged), and the unacked-range caps.
BROKER_KEYS = re.compile(
    r"^(dispatchThrottling.*|dispatcherMaxReadBatchSize|dispatcherMinReadBatchSize|preciseDispatcherFlowControl"
    r"|dispatchRateLimiterFactoryClassName|managedLedgerCursorBackloggedThreshold"
    r"|managedLedgerMaxUnackedRangesToPersist(InMetadataStore)?|managedLedgerPersistIndividualAckAsLongArray"
    r"|managedLedgerCursorPositionFlushSeconds|managedLedgerMaxEntriesPerLedger|topicLevelPoliciesEnabled)$"
)
STATE_FILE = "_collect_state.json"


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


def _instant(clock: datetime) -> str:
    """``2026-11-21T10:00:00.250Z``: to the millisecond, in UTC."""
    return f"{clock.strftime('%Y-%m-%dT%H:%M:%S')}.{clock.microsecond // 1000:03d}Z"


def _owner(client: AdminClient, topic: str, stats: dict) -> str | None:
    """Broker serving the topic: ``ownerBroker`` (Pulsar 3.x stats), else a lookup."""
    if stats.get("ownerBroker"):
        return stats["ownerBroker"]
    lookup = client.get("/lookup/v2/topic/" + _topic_path(topic).removeprefix("/admin/v2/"), missing_ok=True) or {}
    url = lookup.get("httpUrl") or lookup.get("brokerUrl")
    return urlsplit(url).netloc if url else None


def collect(
    day: date | None,
    settings: SourcesStepSettings,
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
    # The collect's time (its files' names, its policies' and metrics' time) is taken after the
    # listing, which a loaded broker can take a second over.
    clock = datetime.now(timezone.utc)
    stamp = clock.strftime("%H%M%S-%f")[:-3]
    collected_at = _instant(clock)
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
        # Each topic's snapshot is dated when its stats are asked for, to the millisecond, not when
        # the collect began: on a large cluster the pool asks for the last topics seconds later, by
        # a delay that changes from collect to collect (internal stats make some collects longer),
        # and the intervals between snapshots are judged against limits of one second. Its
        # internal stats keep the same time: reload_events pairs the two by it.
        at = _instant(datetime.now(timezone.utc))
        if is_partitioned:
            stats = client.get(path + "/partitioned-stats", params={"perPartition": "true"})
            partitions = sorted((stats or {}).get("partitions", {}))
            first = stats["partitions"][partitions[0]] if partitions else {}
            envelope = _envelope(at, cluster, _owner(client, partitions[0], first) if partitions else None, topic, stats)
        else:
            stats = client.get(path + "/stats")
            partitions = [topic]
            envelope = _envelope(at, cluster, _owner(client, topic, stats), topic, stats)
        internal = []
        if conf.internal_stats:
            owners = {p: (stats.get("partitions", {}).get(p, {}) if is_partitioned else stats).get("ownerBroker") for p in partitions}
            for p in partitions:
                internal.append(_envelope(at, cluster, owners[p] or envelope["broker"], p, client.get(_topic_path(p) + "/internalStats")))
        return envelope, internal

    def topic_policies(topic: str):
        path = _topic_path(topic)
        return [
            ("topic-dispatch-rate", topic, client.get(path + "/dispatchRate", missing_ok=True)),
            ("topic-subscription-dispatch-rate", topic, client.get(path + "/subscriptionDispatchRate", missing_ok=True)),
        ]

    def namespace_policies(ns: str):
        tenant, name = ns.split("/", 1)
        path = f"/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(name, safe='')}"
        return [
            ("namespace-dispatch-rate", ns, client.get(path + "/dispatchRate", missing_ok=True)),
            ("namespace-subscription-dispatch-rate", ns, client.get(path + "/subscriptionDispatchRate", missing_ok=True)),
        ]

    with ThreadPoolExecutor(max_workers=conf.concurrency, thread_name_prefix="collect") as pool:
        stat_jobs = [pool.submit(guarded, stats_of, t, True) for t in partitioned]
        stat_jobs += [pool.submit(guarded, stats_of, t, False) for t in plain]
        policy_jobs = [pool.submit(guarded, namespace_policies, ns) for ns in namespaces]
        policy_jobs += [pool.submit(guarded, topic_policies, t) for t in partitioned + plain]
        broker_job = pool.submit(guarded, _broker_config, client)
        scrapes = [(b, pool.submit(guarded, client.get, f"http://{b}/metrics/", None, False, True)) for b in (brokers if conf.metrics else [])]
        results = [job.result() for job in stat_jobs]
        policies = [p for job in policy_jobs for p in (job.result() or [])]
        config = broker_job.result()

    topic_envelopes = [r[0] for r in results if r]
    internal_envelopes = [e for r in results if r for e in r[1]]
    for kind, envelopes in (("topic-stats", topic_envelopes), ("internal-stats", internal_envelopes)):
        # Under the day of each snapshot's own time: a collect begun before midnight can ask for
        # some topics after it.
        by_day: dict[str, list[dict]] = {}
        for envelope in envelopes:
            by_day.setdefault(envelope["collected_at"][:10], []).append(envelope)
        for day_folder, found in by_day.items():
            write_new(settings.landing / day_folder / kind / f"collect-{stamp}.json", json.dumps(found) + "\n")

    for broker, job in scrapes:
        text = job.result()
        if text is not None:
            header = json.dumps({"collected_at": collected_at, "cluster": cluster, "broker": broker})
            path = root / "metrics" / f"{file_broker(broker)}@collect-{stamp}.prom"
            write_new(path, f"# brokerlens: {header}\n{text}")

    exported = ExporterResult()
    if conf.exporter and brokers:
        exported = collect_exporter(client, brokers, settings.landing, settings.landing / STATE_FILE, f"{clock.date().isoformat()}/{stamp}", conf.concurrency)

    observed = [(kind, scope, policy) for kind, scope, policy in policies]
    if config is not None:
        observed += [("broker-config", broker, config) for broker in brokers]
    changed, seen_before = _changed_policies(settings.landing / STATE_FILE, cluster, observed, collected_at)
    if changed:
        lines = []
        for kind, scope, policy, previous in changed:
            key = "broker" if kind == "broker-config" else "topic" if kind.startswith("topic") else "namespace"
            for effective_at, value in _dated_change(previous, policy, seen_before, collected_at):
                lines.append(json.dumps({"effective_at": effective_at, "cluster": cluster, "kind": kind, key: scope, "policy": value}))
        write_new(root / "policies" / f"collect-{stamp}.jsonl", "\n".join(lines) + "\n")

    result = StageResult(stage="collect", day=clock.date())
    result.metrics.update(
        {
            "topics": len(topic_envelopes),
            "partitions": len(internal_envelopes),
            "policy_changes": len(changed),
            "requests": client.requests,
            "errors": len(errors),
        }
    )
    if conf.exporter:
        result.metrics.update(
            {
                "exporter_records": exported.records,
                "exporter_brokers": exported.brokers,
                "exporter_brokers_without": len(exported.without),
                "exporter_missed_records": exported.missed,
                "exporter_dropped_records_total": exported.dropped_total,
                "exporter_dispatch_errors": exported.dispatch_errors,
                "exporter_restarts": len(exported.restarts),
                "exporter_errors": len(exported.errors),
            }
        )
    result.lines.append(f"landing: {root} (collected_at {collected_at}, cluster {cluster})")
    if exported.records:
        result.lines.append(f"exporter: {exported.records} dispatch records from {exported.brokers} broker(s)")
    result.lines += exported.lines
    result.lines += [f"skipped: {e}" for e in errors + exported.errors]
    if errors and not topic_envelopes:
        raise CollectError("no topic could be collected:\n" + "\n".join(errors))
    return result


def _broker_config(client: AdminClient) -> dict:
    """Runtime configuration overlaid with the dynamic values, dispatch and cursor keys only."""
    runtime = client.get("/admin/v2/brokers/configuration/runtime", missing_ok=True) or {}
    dynamic = client.get("/admin/v2/brokers/configuration/values", missing_ok=True) or {}
    merged = {**runtime, **dynamic}
    return {k: _typed(v) for k, v in sorted(merged.items()) if BROKER_KEYS.match(k)}


def _changed_policies(state_path: Path, cluster: str, observed: list[tuple[str, str, dict | None]], collected_at: str):
    """(policies that differ from the last collected value, with that value; the time of the last
    collect, which still saw those values). Updates the state file."""
    with locked(state_path):
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        clock_key = f"{cluster}|_collected_at"
        seen_before = state.get(clock_key)
        changed = []
        for kind, scope, policy in observed:
            key = f"{cluster}|{kind}|{scope}"
            if key not in state and policy is None:
                continue  # never set: nothing to record
            if state.get(key, "absent") != policy:
                changed.append((kind, scope, policy, state.get(key)))
                state[key] = policy
        state[clock_key] = collected_at
        write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n")
    return changed, seen_before


# The limits a dispatch-rate policy (DispatchRate) or the broker configuration sets.
RATE_KEYS = re.compile(r"^dispatchThrottlingRate\w*In(Msg|Byte)$")


def _limit(value) -> float | None:
    # A value <= 0, or none, is no limit.
    return value if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _relaxed(previous: dict | None, policy: dict | None) -> dict | None:
    """The looser of two policies, limit by limit (no policy: no limit)."""
    if previous is None or policy is None:
        return None

    def looser(key: str):
        old, new = _limit(previous.get(key)), _limit(policy.get(key))
        if new is None:
            return policy.get(key, -1)
        return -1 if old is None else max(old, new)

    return {**policy, **{k: looser(k) for k in {*previous, *policy} if RATE_KEYS.match(k)}}


def _period_start(iso: str, policy: dict | None) -> str:
    """The start of the rate period (epoch-aligned, as rate_limits' grid is) that holds ``iso``."""
    period = (policy or {}).get("ratePeriodInSecond")
    seconds = period if isinstance(period, int) and not isinstance(period, bool) and period > 0 else 1
    at = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    return datetime.fromtimestamp(at // seconds * seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dated_change(previous: dict | None, policy: dict | None, seen_before: str | None, collected_at: str) -> list[tuple[str, dict | None]]:
    """The records of one policy change seen by this collect. The broker applied it at some time
    after the last collect, which still saw the old value, and at the latest now; a rate change
    builds a new, full token bucket at once, so a live broker's consumer got the raised rate
    within the period of the last collect. Judged as the limiter that may have held: the looser
    of the two from the start of that period, the new one from now."""
    if seen_before is None or previous is None:
        return [(collected_at, policy)]
    relaxed = _relaxed(previous, policy)
    if relaxed == policy:
        return [(_period_start(seen_before, policy), policy)]
    if relaxed == previous or relaxed is None:
        return [(collected_at, policy)]
    return [(_period_start(seen_before, relaxed), relaxed), (collected_at, policy)]
