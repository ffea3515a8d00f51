"""Airflow connections as the environment defines them (``AIRFLOW_CONN_<ID>``), read without Airflow:
the SMTP stage uses its connection, and redaction masks every connection's password."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlsplit


class BadConnection(ValueError):
    """An ``AIRFLOW_CONN_*`` variable that is not a connection URI or JSON."""


def airflow_connection(conn_id: str, environ: Mapping[str, str] | None = None) -> dict | None:
    """Airflow connection ``conn_id`` from ``AIRFLOW_CONN_<ID>`` (URI or JSON form), or None."""
    environ = os.environ if environ is None else environ
    raw = environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if not raw:
        return None
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            conn = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadConnection(f"AIRFLOW_CONN_{conn_id.upper()} is not valid JSON: {exc.msg}") from None
        extra = conn.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra) if extra.strip() else {}
        return {
            "host": conn.get("host"),
            "port": int(conn["port"]) if conn.get("port") not in (None, "") else None,
            "login": conn.get("login"),
            "password": conn.get("password"),
            "extra": extra,
        }
    parts = urlsplit(raw)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    # Airflow's URI form carries extras as query parameters, or as JSON in `__extra__`.
    extra = json.loads(query.pop("__extra__")) if "__extra__" in query else query
    return {
        "host": unquote(parts.hostname or ""),
        "port": parts.port,
        "login": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "extra": extra,
    }
