"""When the demo's collector runs (topic stats every 10 minutes, internal stats every 3 hours,
broker /metrics every hour) and how it writes: compact JSON as the admin REST API returns it,
UTC times, file names from collection times."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import numpy as np

DAY = 86400
SNAPSHOTS = 300 + 600 * np.arange(144)  # topic stats every 10 minutes, 00:05 … 23:55
INTERNAL = SNAPSHOTS[17::18]  # internal stats every 3 hours, 02:55 … 23:55
METRICS = SNAPSHOTS[5::6]  # /metrics scrapes every hour, 00:55 … 23:55


def dumps(obj) -> str:
    # Jackson's compact output, as the admin REST API returns it.
    return json.dumps(obj, separators=(",", ":"))


def fill(fields: dict, **values) -> dict:
    """A stats object: ``fields`` (its keys in the admin API's order, None for the fields a snapshot
    sets) with the snapshot's ``values``, exactly for the None ones."""
    unset = {k for k, v in fields.items() if v is None}
    if unset != values.keys():
        raise KeyError(f"values for {sorted(unset ^ values.keys())} (set exactly: {sorted(unset)})")
    return {k: values.get(k, v) for k, v in fields.items()}


def iso(day: date, second: float, millis: bool = False) -> str:
    t = datetime(day.year, day.month, day.day, tzinfo=timezone.utc) + timedelta(seconds=float(second))
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond // 1000:03d}" if millis else "") + "Z"


def hhmm(second: int) -> str:
    return f"{second // 3600:02d}{second % 3600 // 60:02d}"


def hash_stable(text: str) -> int:
    # Python's hash() is salted per process; files must not depend on it.
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h
