"""Synthetic but realistic landing data: ``brokerlens demo-data`` and large dispatch series.

``generate_day(day, settings, scale=1.0, seed=7)`` writes ``<landing>/<day>/<kind>/...`` for all
six kinds in Pulsar's formats (envelopes as in schemas/landing/README.md) and
``<landing>/<day>/_demo_manifest.json``::

    {"format": 1, "complete": true, "day": "2026-11-21", "scale": 1.0, "seed": 7, "cluster": "c1",
     "counts": {"<kind>": {"files": n, "records": n}},          # good records written
     "bad_records": [{"stage": "land", "kind": "dispatch", "file": "2026-11-21/dispatch/broker-1_8080-00.jsonl",
                      "line": 383, "reason": "malformed-json", "detail": "..."}, ...],
     "expectations": {
       "cap": 10000,
       "subscriptions_over_cap" / "subscriptions_near_cap" / "subscriptions_forecast_to_cap":
           [{"topic", "subscription", "subscription_type", "broker", "ranges_end_of_day",
             "ranges_over_cap" | "ranges_per_hour", "hours_to_cap"}],
       "ranges_spanning_ledgers": [{"topic", "subscription"}],
       "bad_producers": [{"topic", "producer_name", "issues": [...]}], "good_producers": [...],
       "dispatch_exporter_brokers": [...], "dispatch_scopes": [{"level", "broker", "topic", "subscription"}],
       "counter_resets": [{"topic", "at"}], "policy_changes": [...], "brokers": [...], "topics": [...]}}

``stage``/``kind`` are the quarantine row's (``land`` + landing kind; ``build`` + ``cursor_ranges``
for the unparseable ``individuallyDeletedMessages`` inside a good envelope); ``file`` is relative
to the landing root (the ``quarantine`` table's ``source_file``), ``line`` is 1-based, null for a
whole file; ``reason`` uses the quarantine reason codes. Landing and building the day must
quarantine exactly ``bad_records``.

``big_dispatch_series(day, out_dir, n_subscriptions=10_000, subs_per_topic=4,
topics_per_broker=50, activity=0.2, seed=7, cluster="bench") -> (files, records)`` writes only
throttled dispatch JSONL (same simulation, same record format), fast, for benchmarks.
"""

from .dispatch import big_dispatch_series
from .generate import generate_day

__all__ = ["generate_day", "big_dispatch_series"]
