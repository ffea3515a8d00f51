"""Progress of long steps (land, build): a bar on a terminal, a few log lines elsewhere.

On an interactive stderr a rich progress bar shows the step, its count, rate and time left.
When stderr is not a terminal (Airflow task logs, CI, pipes) it logs one line when the step
starts, at most one line every ``interval`` seconds while it runs, and one line when it ends,
so a task log shows that a long step is moving without thousands of lines.

    from brokerlens.platform.progress import progress, track

    with progress("land 2026-11-21", total=len(files), unit="files") as step:
        for f in files:
            ...
            step.advance()          # or step.advance(n), step.note("dispatch/")

    for f in track(files, "land 2026-11-21", unit="files"):
        ...

Steps may nest (a build step inside ``build``): they share one display.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

Mode = Literal["auto", "bar", "log", "off"]
T = TypeVar("T")

# One rich display for all the steps open at once (rich allows one live display at a time).
_display = None
_open_bars = 0


class Step:
    """A running step: count what is done with ``advance``, say what is being done with ``note``."""

    def __init__(self, description: str, total: int | None, unit: str, mode: str, interval: float):
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self.mode = mode
        self.interval = interval
        self.started = time.monotonic()
        self._last_log = self.started
        self._note = ""
        self._task: Any = None  # rich's TaskID once the bar is shown

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.mode == "bar":
            _display.update(self._task, advance=n)
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._last_log >= self.interval:
                self._last_log = now
                log.info("%s: %s", self.description, self._status(now))

    def note(self, text: str) -> None:
        """What the step is doing now (shown next to the bar, and in the next log line)."""
        self._note = text
        if self.mode == "bar":
            _display.update(self._task, description=self._label())

    def _label(self) -> str:
        return f"{self.description} {self._note}".rstrip()

    def _status(self, now: float) -> str:
        elapsed = now - self.started
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        parts = [f"{count} {self.unit}"]
        if self.total and self.done:
            parts.append(f"{100 * self.done / self.total:.0f}%")
            left = elapsed * (self.total - self.done) / self.done
            parts.append(f"~{left:.0f}s left")
        parts.append(f"{elapsed:.0f}s elapsed")
        if self._note:
            parts.append(self._note)
        return ", ".join(parts)


def _resolve(mode: Mode) -> str:
    if mode != "auto":
        return mode
    stream = sys.stderr
    return "bar" if stream is not None and stream.isatty() else "log"


@contextmanager
def progress(
    description: str,
    total: int | None = None,
    unit: str = "items",
    mode: Mode = "auto",
    interval: float = 30.0,
) -> Iterator[Step]:
    """Show the progress of one step; ``total`` may be None when the count is not known."""
    global _display, _open_bars
    step = Step(description, total, unit, _resolve(mode), interval)
    if step.mode == "bar":
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if _display is None:
            _display = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            _display.start()
        _open_bars += 1
        step._task = _display.add_task(description, total=total, unit=unit)
    elif step.mode == "log":
        log.info("%s: started%s", description, f" ({total} {unit})" if total is not None else "")
    outcome = "stopped"  # an exception left the step: not "done"
    try:
        yield step
        outcome = "done"
    finally:
        if step.mode == "bar":
            _open_bars -= 1
            if _open_bars == 0:
                _display.stop()
                _display = None
        elif step.mode == "log":
            log.info("%s: %s, %s", description, outcome, step._status(time.monotonic()))


def track(
    items: Iterable[T],
    description: str,
    total: int | None = None,
    unit: str = "items",
    mode: Mode = "auto",
    interval: float = 30.0,
) -> Iterator[T]:
    """Iterate over ``items``, advancing a progress step by one per item."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(description, total=total, unit=unit, mode=mode, interval=interval) as step:
        for item in items:
            yield item
            step.advance()
