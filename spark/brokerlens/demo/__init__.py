"""Synthetic but realistic landing data: ``brokerlens demo-data`` and large dispatch series.

``generate_day(day, settings, scale=1.0, seed=7)`` writes a day of all six landing kinds plus
``_demo_manifest.json``; ``big_dispatch_series(day, out_dir, n_subscriptions, ...)`` writes
only throttled dispatch JSONL, fast, for benchmarks.
"""

from .dispatch import big_dispatch_series
from .generate import generate_day

__all__ = ["generate_day", "big_dispatch_series"]
