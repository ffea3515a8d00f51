"""Secrets never leave the process: one filter over every text that does.

The secrets are not a hand-kept list. They are every ``SecretStr`` value of every settings
object the process made (:class:`~brokerlens.platform.settings.PlatformSettings` registers its own when
it is built; a secret setting added later is covered by its type), of the settings in force,
the passwords of the Airflow connections in the environment (``AIRFLOW_CONN_*``), and the
password of any ``scheme://user:password@host`` URL (a Prometheus or relay URL with basic
auth). :func:`redact` replaces each with :data:`MASK`, also URL-encoded or JSON-escaped.

:func:`install` puts the filter where text leaves a command: every log record (the record
factory, so every handler, whoever added it) and ``sys.stdout`` / ``sys.stderr`` (the ``error:``
line, exception messages, stage summaries). Files and mails pass their text through
:func:`redact` where they are written.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TextIO, cast
from urllib.parse import quote

from pydantic import BaseModel, SecretStr

from .connections import airflow_connection

MASK = "**********"  # what pydantic shows for a SecretStr
_URL_PASSWORD = re.compile(r"(?<=://)([^/\s:@\"'<>]*):([^/\s@\"'<>]+)@")
_lock = threading.Lock()
_remembered: set[str] = set()
_cache: dict = {"key": None, "pattern": None}


def secret_values(model: BaseModel) -> set[str]:
    """Every ``SecretStr`` value in ``model`` and its nested models, lists and maps."""
    found: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, SecretStr):
            found.add(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(model)
    return {s for s in found if s}


def remember(secrets: Iterable[str]) -> None:
    """Redact these from now on (settings objects register theirs when built)."""
    with _lock:
        _remembered.update(s for s in secrets if s)


def _connection_passwords() -> set[str]:
    found = set()
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CONN_")]:
        try:
            conn = airflow_connection(name.removeprefix("AIRFLOW_CONN_"))
        except Exception:  # a malformed connection: its own command says so
            continue
        if conn and conn.get("password"):
            found.add(str(conn["password"]))
    return found


_sources: list[Callable[[], Iterable[str]]] = []


def watch(source: Callable[[], Iterable[str]]) -> None:
    """Ask ``source`` for the secrets in force whenever text is redacted (the settings module
    registers the settings in force, so this module needs no import of it)."""
    _sources.append(source)


def _in_force() -> set[str]:
    found: set[str] = set()
    for source in _sources:
        try:
            found.update(source())
        except Exception:  # invalid settings: the error says so, with what was remembered redacted
            continue
    return found


def known_secrets() -> set[str]:
    """Every secret :func:`redact` masks now (but URL passwords, found in the text itself)."""
    secrets = _in_force() | _connection_passwords()
    with _lock:
        return secrets | _remembered


def _pattern() -> re.Pattern | None:
    secrets = known_secrets()
    key = frozenset(secrets)
    if _cache["key"] != key:
        variants = {v for s in secrets for v in (s, quote(s, safe=""), json.dumps(s)[1:-1]) if v}
        # Longest first: a secret that contains another is masked whole.
        ordered = sorted(variants, key=len, reverse=True)
        _cache.update(key=key, pattern=re.compile("|".join(map(re.escape, ordered))) if ordered else None)
    return _cache["pattern"]


def redact(text: str) -> str:
    """``text`` with every known secret, and every URL's password, replaced by :data:`MASK`."""
    if not text:
        return text
    pattern = _pattern()
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", text)


class RedactingStream(io.TextIOBase):
    """A text stream that writes to ``target`` what :func:`redact` leaves of each write.

    No ``buffer`` attribute: click's ``echo`` would write bytes to it, past the filter."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.target.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    @property  # read-only here: it is the target's
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.target, "errors", None)


def redacting(stream: TextIO) -> TextIO:
    return stream if isinstance(stream, RedactingStream) else cast(TextIO, RedactingStream(stream))


_base_factory = logging.getLogRecordFactory()


def _record(*args, **kwargs) -> logging.LogRecord:
    """A log record whose message and traceback are redacted once, before any handler sees it."""
    record = _base_factory(*args, **kwargs)
    record.msg, record.args = redact(record.getMessage()), ()
    if record.exc_info:
        # Formatters print exc_text when set; the exception itself is dropped, for a formatter
        # that renders exc_info on its own (pyspark.logger's JSONFormatter) would print it unredacted.
        record.exc_text = redact(record.exc_text or logging.Formatter().formatException(record.exc_info))
        record.exc_info = None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


def install() -> None:
    """The filter on every log record and on ``sys.stdout`` / ``sys.stderr`` (idempotent)."""
    logging.setLogRecordFactory(_record)
    sys.stdout, sys.stderr = redacting(sys.stdout), redacting(sys.stderr)
