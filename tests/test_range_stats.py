"""brokerlens_range_stats (gold/holes/RangeStats.scala) against a plain-Python reading of
gold/holes/ranges.py's docstring, on random range strings: well formed or not, empty, backwards
and cross-ledger ranges, ledger sizes unknown, caps of 0 to 10,000 or none. The rule each figure
follows where something is unknown is the SQL the function replaced (aggregates skip nulls; a
comparison with a null is null)."""

from __future__ import annotations

import math
import random
import re
from datetime import datetime

from brokerlens.gold.holes.ranges import RANGE, with_range_stats
from brokerlens.platform.frames import rows_frame

FIELDS = ["outline_ok", "ranges_parsed", "bad_ranges", "acked_entries", "exposure_entries", "ledgers", "max_ranges_per_ledger", "ranges_per_ledger"]
LONG_ARRAY = ["long_array_ledgers", "long_array_bytes", "long_array_exposure"]


def nsum(values):
    """SQL's sum: nulls skipped, null when nothing is left."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def varint(x: int) -> int:
    return 1 + sum(x >= 1 << (7 * k) for k in range(1, 9))


def reference(text: str | None, sizes: dict | None, cap: int | None) -> dict | None:
    if text is None:
        return None
    text = re.sub(r",\]$", "]", re.sub("[ \t\n\x0b\f\r]", "", text).replace("\u2025", ".."))
    found = [(m.group(0), *map(int, m.groups())) for m in re.finditer(RANGE, text)]
    out = dict.fromkeys(FIELDS + LONG_ARRAY)
    out["outline_ok"] = text == "[" + ",".join(f[0] for f in found) + "]" and all(-(2**63) <= n < 2**63 for f in found for n in f[1:])
    if not out["outline_ok"] or not found:
        return out
    ledgers: dict[int, list] = {}
    previous = None
    for pos, (_, ll, le, ul, ue) in enumerate(found):
        wrong = ll > ul or (ll == ul and le >= ue)
        bad = (True if wrong else None) if previous is None else (wrong or previous[0] > ll or (previous[0] == ll and previous[1] > le))
        if ll == ul:
            entries = ue - le
        elif sizes is None or sizes.get(ll) is None or any(v is None for k, v in sizes.items() if ll < k < ul):
            entries = None
        else:
            entries = sizes[ll] - 1 - le + sum(v for k, v in sizes.items() if ll < k < ul) + ue + 1
        beyond = None if cap is None else pos > cap
        unknown = None if beyond is None and entries is None else int(bool(beyond) and entries is None)
        ledgers.setdefault(ul, []).append((ll, le, ue, bad, entries, beyond, unknown))
        previous = (ul, ue)
    run_unknown, run_entries, kept_all = 0, [], []
    for ul in sorted(ledgers):
        rows = ledgers[ul]
        entries = nsum(r[4] for r in rows)
        run_unknown += sum(r[4] is None for r in rows)
        run_entries.append(entries)
        kept = None if run_unknown or cap is None else nsum(run_entries) - entries <= cap
        first = min(le + 1 if ll == ul else 0 for ll, le, *_ in rows)
        last = max(r[2] for r in rows)
        words, zero = math.floor(last / 64) + 1, math.floor(first / 64)
        list_map = 1 + varint(ul) + zero * 2 + (words - zero) * 11
        kept_all.append((kept, 1 + varint(list_map) + list_map, entries))
    every = [r for rows in ledgers.values() for r in rows]
    exposure_unknown = nsum(r[6] for r in every)
    out.update(
        ranges_parsed=len(found),
        bad_ranges=nsum(int(r[3]) if r[3] is not None else None for r in every),
        acked_entries=nsum(r[4] for r in every) if all(r[4] is not None for r in every) else None,
        exposure_entries=(nsum(r[4] for r in every if r[5]) or 0) if exposure_unknown == 0 else None,
        ledgers=len(ledgers),
        max_ranges_per_ledger=max(len(rows) for rows in ledgers.values()),
        ranges_per_ledger={ul: len(rows) for ul, rows in ledgers.items()},
    )
    if all(k is not None for k, _, _ in kept_all):
        out.update(
            long_array_ledgers=sum(k for k, _, _ in kept_all),
            long_array_bytes=sum(b for k, b, _ in kept_all if k),
            long_array_exposure=sum(e or 0 for k, _, e in kept_all if not k),
        )
    return out


def random_string(rng: random.Random) -> str | None:
    parts, ledger, entry = [], rng.randrange(1, 5), rng.randrange(-1, 5)
    for _ in range(rng.choice([0, 1, 1, 2, 3, 5, 20, 150])):
        kind = rng.random()
        upper = (
            (ledger, entry)
            if kind < 0.1
            else (ledger + 1, rng.randrange(-1, 5))
            if kind < 0.2
            else (ledger - 1, entry + 3)
            if kind < 0.25
            else (ledger, entry + rng.randrange(1, 70))
        )
        parts.append(f"({ledger}:{entry}..{upper[0]}:{upper[1]}]")
        ledger, entry = (upper[0], upper[1] + rng.randrange(0, 3)) if rng.random() < 0.7 else (upper[0] + rng.randrange(0, 2), rng.randrange(-1, 10))
        if rng.random() < 0.05:
            ledger -= 2
    text = "[" + rng.choice([",", ", ", ",\n"]).join(parts) + "]"
    damage = rng.random()
    if damage < 0.05:
        return text.replace("..", "\u2025", 1)
    if damage < 0.08:
        return text[:-1] + ", ]"
    if damage < 0.10:
        return text.replace(",", ",,", 1)
    if damage < 0.12:
        return text.replace("(", "", 1)
    if damage < 0.13:
        return None
    if damage < 0.14:
        return text.replace("1", "99999999999999999999", 1)  # beyond a 64-bit integer: malformed
    return text


def test_range_stats_equal_the_reference_on_random_strings(spark):
    rng = random.Random(7)
    cases = []
    for i in range(2000):
        sizes = None if rng.random() < 0.1 else {k: (None if rng.random() < 0.05 else rng.randrange(0, 80)) for k in range(-1, 12) if rng.random() < 0.8}
        cases.append((f"t{i}", rng.choice([0, 1, 3, 10000, None]), random_string(rng), sizes))
    frame = rows_frame(
        spark,
        [("c", topic, "s", datetime(2026, 11, 20, 1), cap, text, sizes) for topic, cap, text, sizes in cases],
        "cluster string, topic string, subscription string, snapshot_at timestamp, cap bigint, individually_deleted_messages string, ledger_entries map<bigint,bigint>",
    )
    got = {r["topic"]: r for r in with_range_stats(frame).collect()}
    malformed = with_ranges = 0
    for topic, cap, text, sizes in cases:
        expected = reference(text, sizes, cap)
        row = got[topic]
        actual = None if text is None else {f: row[f] for f in FIELDS + LONG_ARRAY}
        assert actual == expected, (text, sizes, cap)
        malformed += expected is not None and not expected["outline_ok"]
        with_ranges += expected is not None and expected["ranges_parsed"] is not None
    assert malformed > 50 and with_ranges > 1000  # both kinds of string were compared
