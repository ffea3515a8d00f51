"""SMTP shared with Airflow: one place that knows where mail goes and how to send it.

Where Airflow's SMTP connection is defined in the environment (``AIRFLOW_CONN_SMTP_DEFAULT``, or
the id in ``settings.smtp.smtp_conn_id``, as a URI or as JSON), its host, port, login, password
and extras are used with the Airflow SMTP provider's meaning (``disable_ssl`` and ``disable_tls``
default to false, so SSL is on unless disabled; ``from_email``; ``timeout``, default 30 s).
Otherwise ``settings.smtp`` applies. Passwords stay in ``SecretStr`` and are never printed.
"""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from pydantic import SecretStr

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.platform.connections import BadConnection, airflow_connection
from brokerlens.platform.redact import redact


class MailError(RuntimeError):
    """Mail could not be sent; the message names the server, never the password."""


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int | None  # None: the protocol's standard port (25, or 465 with SSL)
    login: str | None
    password: SecretStr | None
    ssl: bool
    starttls: bool
    timeout: float
    mail_from: str
    source: str  # "settings.smtp" or "Airflow connection smtp_default"

    def __str__(self) -> str:
        port = self.port or (465 if self.ssl else 25)
        security = "SSL" if self.ssl else "STARTTLS" if self.starttls else "plain"
        user = f"{self.login}@" if self.login else ""
        return f"smtp://{user}{self.host}:{port} ({security}, from {self.source})"


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def smtp_target(settings: DeliverStepSettings, environ: Mapping[str, str] | None = None) -> SmtpTarget:
    """Where mail goes: Airflow's SMTP connection when the environment defines it, else settings."""
    cfg = settings.smtp
    try:
        conn = airflow_connection(cfg.smtp_conn_id, environ)
    except BadConnection as exc:
        raise MailError(str(exc)) from None
    if conn is None:
        return SmtpTarget(
            host=cfg.host,
            port=cfg.port,
            login=cfg.user,
            password=cfg.password,
            ssl=cfg.ssl,
            starttls=cfg.starttls,
            timeout=cfg.timeout_seconds,
            mail_from=cfg.mail_from,
            source="settings.smtp",
        )
    extra = conn["extra"]
    use_ssl = not _flag(extra.get("disable_ssl", False))
    return SmtpTarget(
        host=conn["host"] or cfg.host,
        port=conn["port"],
        login=conn["login"] or None,
        password=SecretStr(conn["password"]) if conn["password"] else None,
        ssl=use_ssl,
        starttls=not use_ssl and not _flag(extra.get("disable_tls", False)),
        timeout=float(extra.get("timeout", 30)),
        mail_from=extra.get("from_email") or cfg.mail_from,
        source=f"Airflow connection {cfg.smtp_conn_id}",
    )


def build_message(
    subject: str,
    mail_from: str,
    to: list[str],
    text: str,
    html: str | None = None,
    message_id: str | None = None,
) -> EmailMessage:
    """A message with a plain-text part and, when given, an HTML alternative; a fresh
    Message-ID unless the caller derives a stable one."""
    # Whatever a mail quotes (a failure, a setting) leaves with its secrets masked.
    subject, text, html = redact(subject), redact(text), html and redact(html)
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = mail_from
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(usegmt=True)
    domain = mail_from.rpartition("@")[2] or "localhost"
    msg["Message-ID"] = message_id or make_msgid("brokerlens", domain=domain)
    msg.set_content(text)
    if html is not None:
        msg.add_alternative(html, subtype="html")
    return msg


@contextmanager
def smtp_session(target: SmtpTarget) -> Iterator[smtplib.SMTP]:
    """An open, logged-in SMTP session; any failure to get there is a MailError."""
    client: smtplib.SMTP
    try:
        if target.ssl:
            client = smtplib.SMTP_SSL(target.host, target.port or 0, timeout=target.timeout, context=ssl.create_default_context())
        else:
            client = smtplib.SMTP(target.host, target.port or 0, timeout=target.timeout)
        if target.starttls:
            client.starttls(context=ssl.create_default_context())
        if target.login:
            client.login(target.login, target.password.get_secret_value() if target.password else "")
    except (OSError, smtplib.SMTPException) as exc:
        raise MailError(f"cannot reach SMTP server {target}: {type(exc).__name__}: {exc}") from None
    try:
        yield client
    finally:
        try:
            client.quit()
        except (OSError, smtplib.SMTPException):
            client.close()


def send(client: smtplib.SMTP, target: SmtpTarget, msg: EmailMessage, partial: bool = False) -> list[str]:
    """Hand the message to the server; a MailError when it took it for nobody. Returns the
    recipients it refused: with ``partial`` the message went to the others, which the caller
    records; without, any refusal is a MailError."""
    try:
        refused = client.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise MailError(f"SMTP server {target} did not take {msg['Subject']!r}: {type(exc).__name__}: {exc}") from None
    if refused and not partial:
        raise MailError(f"SMTP server {target} refused recipients {sorted(refused)} of {msg['Subject']!r}")
    return sorted(refused)
