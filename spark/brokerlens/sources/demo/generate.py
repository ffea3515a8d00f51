"""``brokerlens demo-data``: a realistic day of landing files in Pulsar's own formats.

Layout (schemas/landing/README.md): ``<landing>/<day>/<kind>/...``
plus ``_demo_manifest.json`` listing the deliberately bad records and what the day should show.
Everything derives from (day, scale, seed): the same inputs give byte-identical files.
"""

from __future__ import annotations

import json
import shutil
from datetime import date

from brokerlens.platform.settings import PlatformSettings
from brokerlens.platform.stage import StageFailed, StageResult

from . import bad
from .cluster import CLUSTER
from .day import Day
from .metrics import write_metrics
from .policies import write_policies
from .producers import write_producer_stats
from .stats import write_internal_stats, write_topic_stats

MANIFEST = "_demo_manifest.json"
KINDS = ("topic-stats", "internal-stats", "dispatch", "producer-stats", "policies", "metrics")


def generate_day(day: date, settings: PlatformSettings, scale: float = 1.0, seed: int = 7) -> StageResult:
    """Write ``<landing>/<day>/<kind>/...`` for all six kinds and ``_demo_manifest.json``."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    root = settings.landing / day.isoformat()
    if root.exists():
        if not (root / MANIFEST).is_file():
            # Never delete collected data: only a day demo-data wrote is replaced.
            raise StageFailed(f"{root} holds landing files that demo-data did not write; choose another day or remove them first")
        shutil.rmtree(root)  # a re-run replaces the day: same seed, same files
    dirs = {kind: root / kind for kind in KINDS}
    for d in dirs.values():
        d.mkdir(parents=True)
    # Marks the day as demo-data's from the start, so a run killed half-way can be replaced.
    (root / MANIFEST).write_text(json.dumps({"format": bad.MANIFEST_FORMAT, "complete": False}) + "\n")
    sim = Day(day, scale, seed)
    counts: dict[str, dict[str, int]] = {}
    dispatch_files, dispatch_records, dispatch_scopes = sim.simulate_dispatch(dirs["dispatch"])
    counts["dispatch"] = {"files": len(dispatch_files), "records": dispatch_records}
    sim.counters_without_exporter()
    sim.build_cursors()
    f, r = write_topic_stats(sim, dirs["topic-stats"])
    counts["topic-stats"] = {"files": f, "records": r}
    f, r, spanning = write_internal_stats(sim, dirs["internal-stats"])
    counts["internal-stats"] = {"files": f, "records": r}
    f, r = write_producer_stats(sim, dirs["producer-stats"])
    counts["producer-stats"] = {"files": f, "records": r}
    f, r, policy_changes = write_policies(sim, dirs["policies"])
    counts["policies"] = {"files": f, "records": r}
    f, r = write_metrics(sim, dirs["metrics"])
    counts["metrics"] = {"files": f, "records": r}
    bad_records = bad.sprinkle(root, settings.landing, day, CLUSTER)
    manifest = bad.manifest(sim, day, scale, seed, counts, bad_records, dispatch_scopes, policy_changes, spanning)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    result = StageResult(stage="demo-data", day=day)
    result.metrics.update(
        {
            "files": sum(c["files"] for c in counts.values()),
            "records": sum(c["records"] for c in counts.values()),
            "bad_records": len(bad_records),
            "bytes": size,
        }
    )
    result.lines.append(f"landing: {root}")
    result.lines += [f"{kind}: {c['files']} files, {c['records']} records" for kind, c in counts.items()]
    exp = manifest["expectations"]
    result.lines.append(
        f"over cap: {len(exp['subscriptions_over_cap'])}, near cap: {len(exp['subscriptions_near_cap'])}, "
        f"bad producers: {len(exp['bad_producers'])}, deliberately bad records: {len(bad_records)}"
    )
    return result
