"""The broker interceptor's per-period ``dispatch`` records (docs/interceptor.md), fetched by
``brokerlens collect`` from each broker and landed as
``<landing>/<day of period_start>/dispatch/exporter-<broker>-<HHMMSS-mmm>.jsonl``.

Each broker serves ``GET /admin/v2/brokerlens/dispatch?after=<seq>&epoch=<epoch>&limit=<n>`` on
its web service port (the admin API's port), authenticated with the admin token. Collect keeps
the last landed ``seq`` and the broker's ``epoch`` (its interceptor's start) in its state file,
``exporter|<broker>`` keys beside the policies: a new epoch (the broker restarted) starts again
from the first record the new process holds. The state moves only after the records are landed, so
a run that fails in between fetches them again (and land quarantines an exact copy as a
duplicate, never counts it twice).

Records the interceptor dropped at its bound before collect fetched them
(``X-Brokerlens-Missed-Records``) are a gap in that broker's periods: logged as a warning and
counted in the result's metrics (``exporter_missed_records``) and lines. A broker without the
interceptor answers 404: said once (the state remembers it), and not an error.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .admin_api import AdminClient, CollectError
from .landing import locked, write_atomic, write_new
from .prometheus import file_broker

log = logging.getLogger("brokerlens.sources.collect")

PATH = "/admin/v2/brokerlens/dispatch"
# Records per request; a broker holding more is read in several pages.
PAGE = 20_000
HEADER = "X-Brokerlens-"


@dataclass
class ExporterResult:
    records: int = 0
    files: list[Path] = field(default_factory=list)
    brokers: int = 0  # brokers whose interceptor answered
    without: list[str] = field(default_factory=list)  # brokers that answered 404
    missed: int = 0  # records dropped at the bound before collect fetched them, this run
    dropped_total: int = 0  # the interceptors' drop counters since their start, summed
    dispatch_errors: int = 0
    restarts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def broker_url(client: AdminClient, broker: str) -> str:
    """The broker's web service as the admin client reaches the cluster: same scheme, the broker's
    ``host:port`` as the admin API lists it."""
    return f"{urlsplit(client.base).scheme or 'http'}://{broker}"


def _int(headers, name: str) -> int:
    try:
        return int(headers.get(HEADER + name, 0))
    except ValueError:
        return 0


def fetch_broker(client: AdminClient, broker: str, state: dict) -> tuple[list[str], dict, dict] | None:
    """(record lines, new state, figures) of one broker after ``state`` ({"epoch", "seq"}); None
    when the broker has no interceptor (404)."""
    epoch, after = state.get("epoch"), int(state.get("seq", 0))
    lines: list[str] = []
    figures = {"missed": 0, "dropped": 0, "dispatch_errors": 0, "restarted": False}
    while True:
        params = {"after": after, "limit": PAGE}
        if epoch is not None:
            params["epoch"] = epoch
        response = client.response(broker_url(client, broker) + PATH, params=params, missing_ok=True)
        if response is None:
            return None
        headers = response.headers
        served_epoch = headers.get(HEADER + "Epoch")
        if served_epoch is None:
            raise CollectError(f"GET {broker}{PATH}: no {HEADER}Epoch header (not brokerlens' interceptor?)")
        if epoch is not None and served_epoch != str(epoch):
            # The broker restarted: its sequences start again; `after` was ignored by it.
            figures["restarted"] = True
            after = 0
        epoch = served_epoch
        figures["missed"] += _int(headers, "Missed-Records")
        figures["dropped"] = _int(headers, "Dropped-Records")
        figures["dispatch_errors"] = _int(headers, "Dispatch-Errors")
        page = [line for line in response.text.splitlines() if line.strip()]
        lines += page
        if page:
            after = json.loads(page[-1])["seq"]
        if len(page) < PAGE or after >= _int(headers, "Last-Seq"):
            break
    return lines, {"epoch": epoch, "seq": after}, figures


def land_records(landing: Path, broker: str, stamp: str, lines: list[str]) -> list[Path]:
    """One file per day of ``period_start`` (a fetch around midnight holds two days)."""
    by_day: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        try:
            day = str(json.loads(line)["period_start"])[:10]
        except (ValueError, KeyError, TypeError):
            day = stamp[:10]  # land quarantines it, with the reason
        by_day[day].append(line)
    paths = []
    for day, day_lines in sorted(by_day.items()):
        path = landing / day / "dispatch" / f"exporter-{file_broker(broker)}-{stamp[11:]}.jsonl"
        paths.append(write_new(path, "\n".join(day_lines) + "\n"))
    return paths


def collect_exporter(client: AdminClient, brokers: list[str], landing: Path, state_path: Path, stamp: str, concurrency: int = 4) -> ExporterResult:
    """Fetch, land and remember each broker's new records. ``stamp`` is ``YYYY-MM-DD/HHMMSS-mmm``
    of the collection (the file names' time; the day is only used for an unreadable line)."""
    from concurrent.futures import ThreadPoolExecutor

    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    result = ExporterResult()

    def one(broker: str):
        try:
            return fetch_broker(client, broker, state.get(f"exporter|{broker}") or {})
        except CollectError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(brokers) or 1)), thread_name_prefix="exporter") as pool:
        fetched = list(zip(brokers, pool.map(one, brokers), strict=True))

    updates: dict[str, dict] = {}
    for broker, got in fetched:
        key = f"exporter|{broker}"
        if isinstance(got, CollectError):
            log.warning("collect: exporter on %s: %s", broker, got)
            result.errors.append(f"exporter on {broker}: {got}")
            continue
        if got is None:
            result.without.append(broker)
            if (state.get(key) or {}).get("installed", True):
                message = f"exporter: not installed on {broker} (404 on {PATH}); its dispatch periods come from counters only"
                log.info("collect: %s", message)
                result.lines.append(message)
            updates[key] = {"installed": False}
            continue
        lines, new_state, figures = got
        result.brokers += 1
        if figures["restarted"]:
            message = f"exporter: {broker} restarted (epoch {(state.get(key) or {}).get('epoch')} -> {new_state['epoch']}); what the old process had not served is lost"
            log.warning("collect: %s", message)
            result.restarts.append(broker)
            result.lines.append(message)
        if figures["missed"]:
            message = f"exporter: {broker} dropped {figures['missed']} records at its bound before collect fetched them (a gap in its periods; {figures['dropped']} dropped since it started)"
            log.warning("collect: %s", message)
            result.lines.append(message)
        result.missed += figures["missed"]
        result.dropped_total += figures["dropped"]
        result.dispatch_errors += figures["dispatch_errors"]
        if lines:
            result.files += land_records(landing, broker, stamp, lines)
            result.records += len(lines)
        updates[key] = {**new_state, "installed": True}

    if updates:
        # Read again under the lock: the policies' state, or another collect's, may have been written since.
        with locked(state_path):
            current = json.loads(state_path.read_text()) if state_path.is_file() else {}
            current.update(updates)
            write_atomic(state_path, json.dumps(current, indent=1, sort_keys=True) + "\n")
    return result
