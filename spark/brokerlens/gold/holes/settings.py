"""The settings the holes step of ``build`` reads: the ``alerts`` section (``alert`` and ``report``
read its recipients and thresholds too)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from brokerlens.platform.settings import PlatformSettings


class AlertOverride(BaseModel):
    """Hole-alert settings for one cluster and/or namespace; the most specific match wins per key.

    ``namespace`` is ``tenant/namespace``; with both set, both must match.
    """

    cluster: str | None = None
    namespace: str | None = None
    # managedLedgerMaxUnackedRangesToPersist to assume (wins over the policies' broker config).
    cap: int | None = Field(default=None, gt=0)
    warning_ranges: int | None = Field(default=None, gt=0)
    horizon_hours: float | None = Field(default=None, gt=0)


class RecipientGroup(BaseModel):
    name: str
    # Globs over "tenant/namespace" (fnmatch), e.g. "payments/*"; empty: matches nothing.
    namespaces: list[str] = Field(default_factory=list)
    to: list[str] = Field(min_length=1)


class AlertSettings(BaseModel):
    """Hole-risk alerts on unacked ranges (cursor_ranges, hole_alerts)."""

    # Warn before the cap (8,000 of 10,000 ranges), so there is time to act; the cap default is Pulsar's 10,000.
    warning_ranges: int = Field(default=8000, gt=0)
    default_cap: int = Field(default=10000, gt=0)
    # How brokers persist the ack state (README "Ack-state persistence modes"). auto: per broker from
    # managedLedgerPersistIndividualAckAsLongArray, else its version (>= 4.1: long-array), else
    # ranges. ranges or long-array: that mode for every broker.
    persist_mode: Literal["auto", "ranges", "long-array"] = "auto"
    horizon_hours: float = Field(default=24.0, gt=0)
    # Growth is the least-squares slope over the snapshots of the last growth_window_hours.
    growth_window_hours: float = Field(default=6.0, gt=0)
    growth_min_snapshots: int = Field(default=3, ge=2)
    overrides: list[AlertOverride] = Field(default_factory=list)
    # An alert goes to every group whose globs match its namespace, else to default_group.
    groups: list[RecipientGroup] = Field(default_factory=list)
    default_group: RecipientGroup = Field(default_factory=lambda: RecipientGroup(name="default", to=["pulsar-ops@localhost"]))
    # Unchanged (ongoing) alerts are mailed again after this many days; 0: never.
    reminder_days: int = Field(default=3, ge=0)
    subject_prefix: str = "[brokerlens]"


class HolesStepSettings(PlatformSettings):
    alerts: AlertSettings = Field(default_factory=AlertSettings)
