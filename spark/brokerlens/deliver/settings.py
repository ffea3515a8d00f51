"""The settings ``brokerlens alert`` and ``brokerlens report`` read: the ``smtp`` and ``report``
sections, and the holes step's ``alerts``."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from brokerlens.gold.holes.settings import HolesStepSettings


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


class DeliverStepSettings(HolesStepSettings):
    smtp: SmtpSettings = Field(default_factory=SmtpSettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
