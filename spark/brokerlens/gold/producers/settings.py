"""The settings the producers step of ``build`` reads: the ``producers`` section."""

from __future__ import annotations

from pydantic import BaseModel, Field

from brokerlens.platform.settings import PlatformSettings


class PublishRateLimit(BaseModel):
    """A publish-rate limit per topic partition, in EMQX notation ("1000", "100KB,10s")."""

    # "tenant/namespace" or a topic ("persistent://tenant/ns/topic"); a topic entry wins.
    scope: str
    msgs: str | None = None
    bytes: str | None = None


class ProducerSettings(BaseModel):
    """Producer lint and health, and publish-rate limits as token buckets."""

    # A snapshot is "near the limit" at this share of the pending-queue limit.
    saturation_threshold: float = Field(default=0.9, gt=0, le=1)
    # Client statsIntervalSeconds: the span each ProducerStats snapshot counts over.
    stats_interval_seconds: float = Field(default=60.0, gt=0)
    publish_rate_limits: list[PublishRateLimit] = Field(default_factory=list)


class ProducersStepSettings(PlatformSettings):
    producers: ProducerSettings = Field(default_factory=ProducerSettings)
