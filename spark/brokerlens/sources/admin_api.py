"""The admin REST API client ``brokerlens collect`` reads a cluster with: auth header, timeouts,
retries with doubling back-off, one HTTP session per thread."""

from __future__ import annotations

import logging
import threading
import time

import requests

from brokerlens.platform.stage import StageFailed
from brokerlens.sources.settings import SourcesStepSettings

log = logging.getLogger("brokerlens.sources.collect")

RETRY_STATUS = {429, 500, 502, 503, 504}


class CollectError(StageFailed):
    """The admin API could not be read; the message says which request and why (never the token)."""


class AdminClient:
    """Thin client over the admin REST API: auth header, timeouts, retries, one session per thread."""

    def __init__(self, url: str, settings: SourcesStepSettings, send_token: bool = True):
        self.base = url.rstrip("/")
        self.conf = settings.collect
        # The admin token is Pulsar's: never sent to another service (Prometheus).
        self._token = settings.admin_token if send_token else None
        self._local = threading.local()
        self.requests = 0

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["Accept"] = "application/json"
            if self._token is not None:
                session.headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
            self._local.session = session
        return session

    def get(self, path: str, params: dict | None = None, missing_ok: bool = False, text: bool = False):
        """JSON of ``GET path`` (its text with ``text``; ``path`` may be a whole URL); None for
        204/empty/null, and for 404/405 when ``missing_ok``."""
        response = self.response(path, params, missing_ok)
        if response is None or response.status_code == 204 or not response.content.strip():
            return None
        if text:
            return response.text
        try:
            return response.json()
        except ValueError as exc:
            raise CollectError(f"GET {path}: response is not JSON ({exc})") from None

    def response(self, path: str, params: dict | None = None, missing_ok: bool = False) -> requests.Response | None:
        """The successful response of ``GET path`` (headers and body), after the retries; None for
        404/405 when ``missing_ok``."""
        attempt = 0
        while True:
            self.requests += 1
            try:
                url = path if path.startswith("http") else self.base + path
                response = self._session().get(url, params=params, timeout=self.conf.timeout_seconds)
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = f"{type(exc).__name__}"
            else:
                status = response.status_code
                if status in (401, 403):
                    raise CollectError(f"GET {path}: HTTP {status}, the admin API refused the credentials (check admin_token and the role's permissions)")
                if status in (404, 405) and missing_ok:
                    return None
                if status not in RETRY_STATUS:
                    if status >= 400:
                        raise CollectError(f"GET {path}: HTTP {status} {_reason(response)}")
                    return response
                problem = f"HTTP {status} {_reason(response)}"
            if attempt >= self.conf.retries:
                raise CollectError(f"GET {path}: {problem} after {attempt + 1} attempts")
            delay = self.conf.backoff_seconds * (2**attempt)
            log.warning("GET %s: %s; retry %d/%d in %.1fs", path, problem, attempt + 1, self.conf.retries, delay)
            time.sleep(delay)
            attempt += 1


def _reason(response: requests.Response) -> str:
    # Pulsar's error body is {"reason": "..."}.
    try:
        return str(response.json().get("reason", ""))[:200]
    except (ValueError, AttributeError):
        return response.text[:200]
