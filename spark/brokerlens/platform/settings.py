"""Settings: one TOML file plus environment variables, over an embedded default that needs no setup.

Precedence (highest first): environment (``BROKERLENS_*``, nested with ``__``, e.g.
``BROKERLENS_SPARK__MASTER=spark://host:7077``), the settings file (``$BROKERLENS_CONFIG``, else
``./brokerlens.toml`` when present), then the defaults below. Everything lives under
``home`` (``$BROKERLENS_HOME``, default ``./var``) unless a path is set explicitly.

This module holds the platform's part (folders, Spark, commits). Each step owns its section in
its own ``settings`` module and declares the settings it reads as a subclass of
:class:`PlatformSettings` (``LandStepSettings``, ``HolesStepSettings``, ...);
:class:`brokerlens.settings.Settings`, which the edges build, is all of them at once.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .redact import remember, secret_values


class SparkSettings(BaseModel):
    master: str = "local[*]"
    # A Spark Connect server (sc://host:port): the session is its client, and the master, the
    # memory and the JARs are the server's (``brokerlens connect-server`` starts one).
    remote: str | None = None
    # Where `brokerlens connect-server` listens.
    connect_host: str = "127.0.0.1"
    connect_port: int = 15002
    app_name: str = "brokerlens"
    # Small default: a day of telemetry on one machine does not need 200 shuffle tasks.
    shuffle_partitions: int = 8
    driver_memory: str = "2g"
    ui: bool = False
    # JVM options appended to brokerlens' own for the driver (a local session's, and the DAG's
    # spark-submit's), e.g. "-XX:TieredStopAtLevel=1": with the quick compiler only, a one-shot
    # command in a new JVM is up to a third faster, a JVM that runs on slower (docs/operations.md).
    driver_java_options: str = ""
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf")
    @classmethod
    def _utc_session(cls, conf: dict[str, str]) -> dict[str, str]:
        # Days are UTC days and Spark writes timestamps as text in the session's zone.
        zone = conf.get("spark.sql.session.timeZone", "UTC")
        if zone != "UTC":
            raise ValueError(f"spark.sql.session.timeZone is {zone!r}: brokerlens' sessions are in UTC, remove the setting")
        return conf


class PlatformSettings(BaseSettings):
    """The settings every step reads: where things live, the Spark session, Delta commits."""

    model_config = SettingsConfigDict(env_prefix="BROKERLENS_", env_nested_delimiter="__", extra="ignore")

    home: Path = Path("var")
    landing_dir: Path | None = None
    # A local folder or a Hadoop URI (s3a://bucket/lake, abfss://…): the lake may be remote.
    lake_dir: str | None = None
    quarantine_dir: Path | None = None
    reports_dir: Path | None = None
    outbox_dir: Path | None = None
    commit_retries: int = 20
    spark: SparkSettings = Field(default_factory=SparkSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config = settings_file()
        if config is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config))
        return tuple(sources)

    def model_post_init(self, context) -> None:
        # Every secret setting, whatever its name, is masked in all output from now on.
        remember(secret_values(self))

    def path(self, name: str) -> Path:
        """Resolved folder ``landing``, ``lake``, ``quarantine``, ``reports`` or ``outbox``."""
        explicit = getattr(self, f"{name}_dir")
        return Path(explicit if explicit is not None else self.home / name).resolve()

    @property
    def landing(self) -> Path:
        return self.path("landing")

    @property
    def lake(self) -> Path:
        """The lake as a local folder (tests, tools); :attr:`lake_uri` is what tables use."""
        return self.path("lake")

    @property
    def lake_uri(self) -> str:
        if self.lake_dir is not None and "://" in self.lake_dir:
            return self.lake_dir
        return str(self.lake)

    @property
    def quarantine(self) -> Path:
        return self.path("quarantine")

    @property
    def reports(self) -> Path:
        return self.path("reports")

    @property
    def outbox(self) -> Path:
        return self.path("outbox")


def settings_file() -> Path | None:
    explicit = os.environ.get("BROKERLENS_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"BROKERLENS_CONFIG points at {path}, which is not a file")
        return path
    default = Path("brokerlens.toml")
    return default if default.is_file() else None
