"""Settings: one TOML file plus environment variables, over an embedded default that needs no setup.

Precedence (highest first): environment (``BROKERLENS_*``, nested with ``__``, e.g.
``BROKERLENS_SPARK__MASTER=spark://host:7077``), the settings file (``$BROKERLENS_CONFIG``, else
``./brokerlens.toml`` when present), then the defaults below. Everything lives under
``home`` (``$BROKERLENS_HOME``, default ``./var``) unless a path is set explicitly.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .redact import remember, secret_values, watch


class SparkSettings(BaseModel):
    master: str = "local[*]"
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


class SmtpSettings(BaseModel):
    """SMTP relay. Airflow's SMTP connection (``smtp_conn_id``) wins when Airflow has it."""

    host: str = "127.0.0.1"
    port: int = 8025
    user: str | None = None
    password: SecretStr | None = None
    starttls: bool = False
    ssl: bool = False
    timeout_seconds: float = 10.0
    mail_from: str = "brokerlens@localhost"
    smtp_conn_id: str = "smtp_default"


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


class ReportSettings(BaseModel):
    """The daily HTML report (`brokerlens report`)."""

    # Charts are drawn for this many worst dispatch scopes and subscriptions closest to the cap.
    top_scopes: int = Field(default=5, ge=1)
    top_subscriptions: int = Field(default=5, ge=1)
    # Longest table in a section; the report says when rows were left out.
    max_rows: int = Field(default=25, ge=1)
    # Days of cursor_ranges (the report's day included) in the trend charts.
    trend_days: int = Field(default=3, ge=1)
    # Where the reports folder is served (e.g. https://ops.example.com/brokerlens): the alert mail
    # links to <base_url>/<day>/brokerlens-<day>.html; unset, it links to the file itself.
    base_url: str | None = None


class CollectSettings(BaseModel):
    """`brokerlens collect`: how to talk to the Pulsar admin REST API (URL and token are top-level)."""

    timeout_seconds: float = Field(default=10.0, gt=0)
    # Retries after a connection error, a timeout, HTTP 429 or 5xx; back-off doubles each time.
    retries: int = Field(default=3, ge=0)
    backoff_seconds: float = Field(default=0.5, ge=0)
    # Concurrent requests (a thread pool); keep small on a busy cluster.
    concurrency: int = Field(default=8, ge=1)
    # Envelope cluster name; default: the first cluster /admin/v2/clusters lists.
    cluster: str | None = None
    # Tenants to collect; empty: all of /admin/v2/tenants.
    tenants: list[str] = Field(default_factory=list)
    internal_stats: bool = True
    # Also scrape each broker's /metrics into landing (metrics/<broker>@collect-<time>.prom).
    metrics: bool = False
    # Fetch each broker's interceptor records (GET /admin/v2/brokerlens/dispatch, docs/interceptor.md)
    # into dispatch/exporter-<broker>-<time>.jsonl; a broker without the interceptor is skipped.
    exporter: bool = True


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


class Settings(BaseSettings):
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
    smtp: SmtpSettings = Field(default_factory=SmtpSettings)
    # Pulsar admin REST API for `brokerlens collect`; the token is a secret.
    admin_url: str | None = None
    admin_token: SecretStr | None = None
    collect: CollectSettings = Field(default_factory=CollectSettings)
    land: LandSettings = Field(default_factory=LandSettings)
    # Free-form sections owned by the stages (alerts, lint, ...); each stage validates its own.
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    producers: ProducerSettings = Field(default_factory=ProducerSettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)

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


@lru_cache(maxsize=1)
def _environment_settings() -> Settings:
    return Settings()


def get_settings() -> Settings:
    """The settings of the environment and the settings file (read once; :func:`reload_settings`
    reads them again). Only the edges read them (a command, an Airflow task, the stage server,
    the bench); every stage and table function is given its settings by its caller."""
    return _environment_settings()


def reload_settings() -> Settings:
    """Forget the cached settings (tests and the CLI change the environment)."""
    _environment_settings.cache_clear()
    return get_settings()


# Whatever prints redacts the secrets of the environment's settings (every Settings built registers its own).
watch(lambda: secret_values(get_settings()))
