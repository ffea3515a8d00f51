"""The settings ``brokerlens land`` reads: the ``land`` section."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from brokerlens.platform.settings import PlatformSettings


class LandSettings(BaseModel):
    """`brokerlens land`."""

    # The largest record (a stats JSON file, or a line) handed to Spark; a larger one is
    # quarantined. Spark copies a record a few times while parsing it, in the driver's memory
    # (spark.driver_memory) shared by three kinds landing at once.
    max_record_mb: int = Field(default=32, ge=1)
    # /metrics families landed besides those brokerlens reads (land.metrics.ANALYTICS_FAMILIES),
    # as glob patterns on the sample name ("pulsar_subscription_*"); ["*"] lands every sample. A
    # broker's page holds a few dozen series per topic partition, of which build reads one or two:
    # the others are counted, not landed.
    metric_families: list[str] = Field(default_factory=list)

    @field_validator("metric_families")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        if any(not p.strip() for p in patterns):
            raise ValueError("land.metric_families: an empty pattern matches no sample name")
        return patterns


class LandStepSettings(PlatformSettings):
    land: LandSettings = Field(default_factory=LandSettings)
