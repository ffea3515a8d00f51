"""One Spark application for the daily DAG's tasks: ``brokerlens serve``.

A spark-submit per task starts a JVM, a SparkContext and Delta's classes seven times a day, and
each stage then runs on a cold JVM: on the demo day those costs were most of the DAG's wall
time. The stage server is one long-running driver (started by ``infra/stack.sh``, or with
``spark-submit .../brokerlens/submit.py serve`` against a cluster); the DAG's tasks send it their
command line and stream back what the command prints, ending with its exit code, the same codes
as the command's own (``brokerlens.cli``).

- Stages run one at a time, in the server's main thread (the one that owns the SparkSession);
  other requests wait in line and are told so. Each runs under its own Spark job group, which
  is cancelled when its client goes away (a killed or timed-out task).
- A stage sees the server's environment overlaid with the task's ``BROKERLENS_*`` variables and
  its connections (``AIRFLOW_CONN_*``, e.g. SMTP for ``alert``), so settings behave as under
  spark-submit; only the Spark settings are the server's, fixed when it started.
- The server listens on 127.0.0.1 only and accepts a request only with the token of its address
  file (mode 0600): ``{"url", "token", "pid"}`` at ``$BROKERLENS_HOME/run/stage-server.json``
  unless told otherwise. ``BROKERLENS_STAGE_SERVER`` names that file for Airflow's tasks.
- Before it writes its address file the server runs the daily stages once on a small generated
  day in a scratch folder (``--no-warm-up`` skips it): a JVM's first run of a stage compiles
  and loads what later runs reuse, so without it the first day after a (re)start would take
  half again as long as the next.
- The server exits when its SparkContext stops (a lost JVM): whatever supervises it restarts it.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import queue
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

from brokerlens.platform import jvm

log = logging.getLogger(__name__)

# The commands a task may run on the server: the daily DAG's stages.
COMMANDS = ("land", "validate", "build", "alert", "report")
# The last line of a response: the command's exit code.
EXIT_PREFIX = "brokerlens-exit: "
# brokerlens.cli's "unexpected" (worth a retry): a stage whose client went away before it
# started, and the server's own exit when its SparkContext has stopped.
UNEXPECTED_EXIT = 3


class StageServerError(RuntimeError):
    """The stage server cannot be reached, refused the request, or ended it without an exit code."""


def default_address_file() -> Path:
    from brokerlens.settings import get_settings

    return get_settings().home.resolve() / "run" / "stage-server.json"


@dataclass
class _Job:
    argv: list[str]
    environ: dict[str, str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    exit_code: int | None = None
    group: str = field(default_factory=lambda: f"brokerlens-{secrets.token_hex(6)}")
    gone: threading.Event = field(default_factory=threading.Event)


class _JobStream(io.TextIOBase):
    """stdout and stderr of the running command: each line goes to the job's client."""

    def __init__(self, job: _Job) -> None:
        self.job, self.pending = job, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.job.lines.put(line)
        return len(text)

    def flush(self) -> None:
        pass

    def close_out(self) -> None:
        if self.pending:
            self.job.lines.put(self.pending)
            self.pending = ""


@contextmanager
def _environ(overlay: dict[str, str]) -> Iterator[None]:
    """``overlay`` in ``os.environ`` for the block; the server's own values afterwards."""
    before = {k: os.environ.get(k) for k in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ``brokerlens``' own entry point, given by the command that starts the server (``cli.main``):
# called with ``log_to_file=False`` and the job's arguments.
Command = Callable[..., None]


def _run(spark, command: Command, job: _Job) -> int:
    """The command of ``job`` as ``brokerlens`` would run it, in this process: its exit code."""
    from brokerlens.platform import logs
    from brokerlens.settings import reload_settings

    stream = _JobStream(job)
    code: int = 0
    with _environ(job.environ):
        reload_settings()
        jvm.set_job_group(spark, job.group, "brokerlens " + " ".join(job.argv))
        try:
            with redirect_stdout(stream), redirect_stderr(stream):
                try:
                    command(log_to_file=False, argv=job.argv)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            stream.close_out()
            spark.catalog.clearCache()  # what a failed stage left cached
            logs.configure(0)  # the server's own log again
    reload_settings()
    return code


def _handler(server: StageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
            log.debug("%s " + format, self.address_string(), *args)

        def _reply(self, status: int, body: dict) -> None:
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if secrets.compare_digest(given.encode(), server.token.encode()):
                return True
            self._reply(401, {"error": "no or wrong token: read it from the server's address file"})
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/health":
                return self._reply(404, {"error": f"no {self.path}; GET /health, POST /run"})
            if self._authorized():
                running = server.running and " ".join(server.running.argv)
                self._reply(200, {"pid": os.getpid(), "stages_run": server.stages_run, "running": running, "waiting": server.jobs.qsize()})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/run":
                return self._reply(404, {"error": f"no {self.path}; GET /health, POST /run"})
            if not self._authorized():
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                argv, environ = list(map(str, body["argv"])), {str(k): str(v) for k, v in body.get("environ", {}).items()}
            except (ValueError, KeyError, TypeError) as exc:
                return self._reply(400, {"error": f"the body must be JSON {{argv, environ}}: {exc}"})
            if not argv or argv[0] not in COMMANDS:
                return self._reply(400, {"error": f"the server runs only {', '.join(COMMANDS)}, not {argv[:1]}"})
            if any(not (k.startswith("BROKERLENS_") or k.startswith("AIRFLOW_CONN_")) for k in environ):
                return self._reply(400, {"error": "environ may hold only BROKERLENS_* and AIRFLOW_CONN_* variables"})
            job = _Job(argv, environ)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            ahead = server.submit(job)
            try:
                if ahead:
                    self._line(f"stage server: {ahead} stage(s) ahead of this one; waiting")
                while (line := job.lines.get()) is not None:
                    self._line(line)
                self._line(f"{EXIT_PREFIX}{job.exit_code}")
            except OSError:  # the task went away (killed, timed out): stop its Spark jobs
                server.cancel(job)

        def _line(self, line: str) -> None:
            self.wfile.write((line + "\n").encode("utf-8", "backslashreplace"))
            self.wfile.flush()

    return Handler


class StageServer:
    """The HTTP side in a background thread; :meth:`serve_forever` runs the stages."""

    def __init__(self, spark, command: Command, address_file: Path, port: int = 0) -> None:
        self.spark, self.command, self.address_file = spark, command, address_file
        self.token = secrets.token_urlsafe(32)
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.stages_run = 0
        self.running: _Job | None = None
        self.http = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def submit(self, job: _Job) -> int:
        """Queue ``job``; how many stages are ahead of it (running or waiting)."""
        ahead = self.jobs.qsize() + (self.running is not None)
        self.jobs.put(job)
        return ahead

    def cancel(self, job: _Job) -> None:
        job.gone.set()
        log.warning("client of %s went away: cancelling its Spark jobs", " ".join(job.argv))
        jvm.cancel_job_group(self.spark, job.group)

    def stop(self) -> None:
        self.jobs.put(None)

    def _write_address(self) -> None:
        self.address_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.address_file.with_name(self.address_file.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "token": self.token, "pid": os.getpid()}, f)
        partial.replace(self.address_file)

    def serve_forever(self) -> int:
        """Run stages until stopped (SIGTERM, SIGINT) or the SparkContext is gone; exit code."""
        threading.Thread(target=self.http.serve_forever, name="stage-server-http", daemon=True).start()
        self._write_address()
        log.info("stage server on %s (address file %s), Spark %s", self.url, self.address_file, jvm.master(self.spark))
        try:
            while (job := self.jobs.get()) is not None:
                if job.gone.is_set():
                    job.exit_code = UNEXPECTED_EXIT
                else:
                    started, self.running = time.monotonic(), job
                    log.info("running brokerlens %s", " ".join(job.argv))
                    job.exit_code = _run(self.spark, self.command, job)
                    self.stages_run, self.running = self.stages_run + 1, None
                    log.info("brokerlens %s: exit %s in %.1f s", " ".join(job.argv), job.exit_code, time.monotonic() - started)
                job.lines.put(None)
                if jvm.context_stopped(self.spark):
                    log.error("the SparkContext has stopped: the stage server exits")
                    return UNEXPECTED_EXIT
            return 0
        finally:
            self.address_file.unlink(missing_ok=True)
            self.http.shutdown()


# The warm-up's generated day: small, but every stage's every path (quarantine, alerts, report).
WARM_UP_DAY, WARM_UP_SCALE = date(2026, 1, 1), 0.01


def warm_up(spark: SparkSession) -> float:
    """The daily stages on a generated day in a scratch folder, every path of it there (never
    the real lake); seconds taken."""
    from brokerlens.pipeline import DAILY_STEPS, run_stage
    from brokerlens.settings import get_settings

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="brokerlens-warm-up-") as scratch:
        folders = dict.fromkeys(("landing_dir", "lake_dir", "quarantine_dir", "reports_dir", "outbox_dir"))
        settings = get_settings().model_copy(update={"home": Path(scratch), **folders})
        run_stage("demo-data", WARM_UP_DAY, settings, scale=WARM_UP_SCALE)
        for stage, layer in DAILY_STEPS:
            options: dict[str, object] = {"layer": layer} if layer else {}
            if stage == "alert":
                options["dry_run"] = True  # no mail about a made-up day
            run_stage(stage, WARM_UP_DAY, settings, spark, **options)
    return time.monotonic() - started


def serve(command: Command, address_file: Path | None = None, port: int = 0, warm: bool = True) -> int:
    """Start Spark, warm it up, then serve stages until SIGTERM or SIGINT: ``brokerlens serve``,
    which gives its own entry point as ``command``."""
    # The server's own lines go to its own stderr, also while a stage's output goes to its client.
    from brokerlens.platform import logs
    from brokerlens.platform.spark import get_spark
    from brokerlens.settings import get_settings

    own = logging.StreamHandler(sys.stderr)
    own.setFormatter(logs.formatter())
    log.addHandler(own)
    log.propagate = False
    spark = get_spark(get_settings())
    if warm:
        log.info("stage server: warming up on a generated day")
        log.info("stage server: warmed up in %.1f s", warm_up(spark))
    server = StageServer(spark, command, address_file or default_address_file(), port)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    return server.serve_forever()


def run_remote(
    address_file: Path,
    argv: list[str],
    environ: dict[str, str],
    on_line: Callable[[str], None],
    keep: Callable[[http.client.HTTPConnection], None] = lambda _: None,
) -> int:
    """Run ``brokerlens <argv>`` on the stage server of ``address_file``: each line it prints to
    ``on_line``, then its exit code. ``keep`` gets the connection (closing it cancels the stage)."""
    try:
        address = json.loads(address_file.read_text())
    except (OSError, ValueError) as exc:
        raise StageServerError(f"no stage server address in {address_file} ({exc}); start one with `brokerlens serve`") from None
    url = urlsplit(address["url"])
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=None)
    keep(connection)
    body = json.dumps({"argv": argv, "environ": environ})
    try:
        connection.request("POST", "/run", body, {"Authorization": f"Bearer {address['token']}", "Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise StageServerError(f"stage server {address['url']} refused the request: {response.status} {response.read().decode().strip()}")
        for raw in response:
            line = raw.decode("utf-8", "backslashreplace").rstrip("\n")
            if line.startswith(EXIT_PREFIX):
                return int(line.removeprefix(EXIT_PREFIX))
            on_line(line)
    except OSError as exc:
        raise StageServerError(f"stage server {address['url']} (pid {address.get('pid')}): {exc}") from None
    finally:
        connection.close()
    raise StageServerError(f"stage server {address['url']} ended the stage without an exit code: see its log")
