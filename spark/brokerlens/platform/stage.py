"""What every stage returns: what it wrote and what a person should read about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from .tables import WriteResult


class StageFailed(RuntimeError):
    """A stage ran but its outcome must stop the pipeline (e.g. a failed critical expectation).

    The message is the readable summary; the CLI prints it and exits non-zero.
    """


@dataclass
class StageResult:
    stage: str
    day: date | None = None
    writes: list[WriteResult] = field(default_factory=list)
    # Counters for logs and tests, e.g. {"records_in": 120, "quarantined": 3}.
    metrics: dict[str, int | float] = field(default_factory=dict)
    # Lines for a person: summaries, the worst scopes, where outputs are.
    lines: list[str] = field(default_factory=list)

    def render(self) -> str:
        head = f"{self.stage}" + (f" {self.day.isoformat()}" if self.day else "")
        body = [f"  {w}" for w in self.writes]
        if self.metrics:
            body.append("  " + ", ".join(f"{k}={v}" for k, v in self.metrics.items()))
        body += [f"  {line}" for line in self.lines]
        return "\n".join([head, *body])
