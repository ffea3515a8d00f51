"""The settings ``brokerlens collect`` reads: the admin REST API's URL and token, and the ``collect`` section."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from brokerlens.platform.settings import PlatformSettings


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


class SourcesStepSettings(PlatformSettings):
    # Pulsar admin REST API for `brokerlens collect`; the token is a secret.
    admin_url: str | None = None
    admin_token: SecretStr | None = None
    collect: CollectSettings = Field(default_factory=CollectSettings)
