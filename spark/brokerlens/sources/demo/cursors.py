"""Cursor state through a day: holes left by delayed messages and slow consumers.

A cursor's mark-delete position is stuck behind its oldest hole (a delayed message not yet due,
a message a slow Shared/Key_Shared consumer still holds). Every later hole splits the
acknowledged entries into one more range of ``individuallyDeletedMessages``. The holes are laid
out once per day, in entry order, so that the range count follows a chosen curve
``R(t) = R0 + (R_end - R0) (t / T)^p`` and every snapshot is consistent with the previous ones.
Positions are global entry offsets mapped onto ledgers, so ranges can span ledgers exactly as
they do in Pulsar (``(15:49990..16:40]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schedule import fill

# managedLedgerMaxEntriesPerLedger default; ledgers also roll over by time (4 h here).
MAX_ENTRIES_PER_LEDGER = 50_000
LEDGER_ROLLOVER_SECONDS = 4 * 3600
DAY_END = 86_100  # 23:55, the last snapshot of the day
CAP = 10_000  # managedLedgerMaxUnackedRangesToPersist, the broker default
HOLE_GAP = 3  # entries added per hole so that a hole never touches the next one
# LedgerInfo of internal stats' ``ledgers`` (the fields a snapshot sets are None).
LEDGER_FIELDS = {"ledgerId": None, "entries": None, "size": None, "offloaded": False, "underReplicated": False}


@dataclass
class CursorPlan:
    ranges_start: int  # ranges at 00:00 (holes left from the previous day)
    ranges_end: int  # ranges at 23:55
    power: float  # shape of the growth curve
    entries_per_second: float  # entries written to the partition


@dataclass
class LedgerLayout:
    starts: np.ndarray  # global offset of each ledger's first entry
    ids: np.ndarray  # ledger ids (BookKeeper ids: increasing, not consecutive)

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = np.searchsorted(self.starts, offsets, side="right") - 1
        return self.ids[i], offsets - self.starts[i]


def ranges_at(plan: CursorPlan, t: np.ndarray | float) -> np.ndarray:
    frac = np.clip(np.asarray(t, dtype=float) / DAY_END, 0.0, 1.0)
    return np.round(plan.ranges_start + (plan.ranges_end - plan.ranges_start) * frac**plan.power).astype(np.int64)


class Cursor:
    """One subscription on one topic partition: hole positions for the whole day."""

    def __init__(self, plan: CursorPlan, base_offset: int, rng: np.random.Generator):
        self.plan = plan
        self.base = base_offset
        v = plan.entries_per_second
        j = np.arange(plan.ranges_end, dtype=float)
        r0, r1 = plan.ranges_start, plan.ranges_end
        # Time each hole appears: inverse of R(t); holes from yesterday in the last hour before 00:00.
        t_hole = np.where(
            j < r0,
            -3600.0 * (r0 - j) / max(r0, 1),
            DAY_END * (np.clip(j - r0 + 1, 0, None) / max(r1 - r0, 1)) ** (1.0 / plan.power),
        )
        self.hole_offsets = np.floor(base_offset + v * t_hole).astype(np.int64) + HOLE_GAP * np.arange(r1)
        self.hole_lengths = rng.integers(1, 3, r1)  # 1 or 2 unacknowledged entries per hole

    def frontier(self, t: float) -> int:
        """Last entry acknowledged-or-read at time t (read position is frontier + 1)."""
        return int(np.floor(self.base + self.plan.entries_per_second * t)) + HOLE_GAP * int(ranges_at(self.plan, t))

    def count(self, t: float) -> int:
        """Ranges at t: the planned count, less holes not yet behind the frontier (rounding)."""
        planned = int(ranges_at(self.plan, t))
        ends = self.hole_offsets[:planned] + self.hole_lengths[:planned]
        return int(np.searchsorted(ends, self.frontier(t) - 1, side="right"))

    def state(self, t: float, ledgers: LedgerLayout) -> dict:
        """markDeletePosition, readPosition, the range count and individuallyDeletedMessages at t."""
        count = self.count(t)
        frontier = self.frontier(t)
        if count == 0:
            mark = frontier - int(self.plan.entries_per_second * 2)  # acks trail reads by ~2 s
            return {"mark": _pos(ledgers, mark), "read": _pos(ledgers, frontier + 1), "ranges": 0, "text": "[]", "acked_after_mark": 0, "mark_offset": mark}
        holes = self.hole_offsets[:count]
        lengths = self.hole_lengths[:count]
        lower = holes + lengths - 1  # exclusive: the hole's last entry
        upper = np.append(holes[1:] - 1, frontier)  # inclusive: the entry before the next hole
        return {
            "mark": _pos(ledgers, int(holes[0]) - 1),
            "read": _pos(ledgers, frontier + 1),
            "ranges": count,
            "text": format_ranges(ledgers, lower, upper),
            "acked_after_mark": int((upper - lower).sum()),
            "mark_offset": int(holes[0]) - 1,
        }

    def first_offset(self) -> int:
        return int(self.hole_offsets[0]) - 1 if self.plan.ranges_end else self.base - int(self.plan.entries_per_second * 2)


def layout_ledgers(first_offset: int, last_offset: int, entries_per_second: float, first_id: int, rng: np.random.Generator) -> LedgerLayout:
    """Ledgers covering [first_offset, last_offset], rolled over by entries or by time."""
    per_ledger = int(min(MAX_ENTRIES_PER_LEDGER, max(1000, entries_per_second * LEDGER_ROLLOVER_SECONDS)))
    # Start the first ledger somewhere before the oldest needed entry.
    start = first_offset - int(rng.integers(0, per_ledger))
    count = (last_offset - start) // per_ledger + 2
    starts = start + per_ledger * np.arange(count, dtype=np.int64)
    ids = first_id + np.cumsum(rng.integers(1, 60, count))
    return LedgerLayout(starts=starts, ids=ids)


def _pos(ledgers: LedgerLayout, offset: int) -> str:
    ledger, entry = ledgers.locate(np.array([offset]))
    return f"{int(ledger[0])}:{int(entry[0])}"


def range_texts(lo_ledger: np.ndarray, lo_entry: np.ndarray, hi_ledger: np.ndarray, hi_entry: np.ndarray) -> list[str]:
    """``(l:e..l:e]`` for each open-closed range given by its ends' positions, built column-wise."""
    text = pc.binary_join_element_wise(
        "(",
        pc.cast(pa.array(lo_ledger), pa.string()),
        ":",
        pc.cast(pa.array(lo_entry), pa.string()),
        "..",
        pc.cast(pa.array(hi_ledger), pa.string()),
        ":",
        pc.cast(pa.array(hi_entry), pa.string()),
        "]",
        "",
    )
    return text.to_pylist()


def format_ranges(ledgers: LedgerLayout, lower: np.ndarray, upper: np.ndarray) -> str:
    """``[(l:e..l:e], ...]`` for open-closed ranges of global offsets."""
    return "[" + ", ".join(range_texts(*ledgers.locate(lower), *ledgers.locate(upper))) + "]"


def ledger_list(ledgers: LedgerLayout, from_offset: int, to_offset: int, entry_bytes: float) -> tuple[list[dict], int, int]:
    """``ledgers`` of internal stats from the one holding from_offset to the current one.

    The current (open) ledger is listed with 0 entries, as Pulsar does; its entries are
    ``currentLedgerEntries``. Returns (ledgers, current entries, current size).
    """
    first = int(np.searchsorted(ledgers.starts, from_offset, side="right") - 1)
    current = int(np.searchsorted(ledgers.starts, to_offset, side="right") - 1)
    out = []
    for i in range(first, current + 1):
        closed = i < current
        n = int(ledgers.starts[i + 1] - ledgers.starts[i]) if closed else 0
        out.append(fill(LEDGER_FIELDS, ledgerId=int(ledgers.ids[i]), entries=n, size=int(n * entry_bytes)))
    current_entries = int(to_offset - ledgers.starts[current] + 1)
    return out, current_entries, int(current_entries * entry_bytes)
