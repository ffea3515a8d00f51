"""The settings the dispatch step of ``build`` reads: the ``dispatch`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from brokerlens.platform.settings import PlatformSettings


class DispatchSettings(BaseModel):
    """Dispatch throttling (`build`): which rate limiter the brokers run (README "Dispatch throttling")."""

    # auto: per broker from dispatchRateLimiterFactoryClassName, else its version (3.2 to 3.3.4 and
    # 4.0.0 to 4.0.3: token-bucket; 3.3.5+ and 4.0.4+: token-bucket-periodic), else classic. Any
    # other value: that model for every broker.
    limiter_model: Literal["auto", "classic", "token-bucket", "token-bucket-periodic"] = "auto"
    # Pulsar's counting rules, as broker.conf defaults; a broker's landed config (bronze_policies
    # broker-config) overrides them per broker. false: deliveries to a subscription whose cursor
    # is caught up (consumers connected, backlog below the threshold) are not charged.
    dispatch_throttling_on_non_backlog_consumer_enabled: bool = True
    # true: entries that entry filters reject or reschedule are charged too (Pulsar 2.11+).
    dispatch_throttling_for_filtered_entries_enabled: bool = False
    # A cursor with at least this many entries of backlog is "backlogged" (inactive).
    managed_ledger_cursor_backlogged_threshold: int = Field(default=1000, ge=0)


class DispatchStepSettings(PlatformSettings):
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)
