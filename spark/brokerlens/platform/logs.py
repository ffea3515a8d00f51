"""Logging to stderr: stdout belongs to command output (``brokerlens sql --format json``).

A command run from a shell also keeps a log file (``$BROKERLENS_HOME/logs/brokerlens.log``, or
``BROKERLENS_LOG_FILE``): Java's and Spark's own stderr and the stack trace of a failure go
there, so that the terminal shows only brokerlens's lines and a one-line error.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from .redact import redact, redacting
from .times import iso

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def formatter() -> logging.Formatter:
    """Log lines stamped with the time of day in UTC (``13:21:51Z``), like every time brokerlens prints."""
    stamped = logging.Formatter(FORMAT, "%H:%M:%SZ")
    stamped.converter = time.gmtime
    return stamped


def configure(verbosity: int = 0) -> None:
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("brokerlens").setLevel(level)
    for noisy in ("py4j", "great_expectations", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_file() -> Path:
    explicit = os.environ.get("BROKERLENS_LOG_FILE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("BROKERLENS_HOME", "var")) / "logs" / "brokerlens.log"


def divert_stderr(command: str) -> Path | None:
    """Send this process's file descriptor 2 (where the JVM that PySpark starts writes its
    warnings and traces) to the log file, and keep ``sys.stderr`` on the terminal.

    Returns the log file, or None when it cannot be opened (then nothing changes).
    """
    path = log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    except OSError:
        return None
    sys.stderr.flush()
    terminal = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    terminal_stream = os.fdopen(terminal, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    sys.stderr = redacting(terminal_stream)
    stamp = iso(datetime.now(timezone.utc).replace(microsecond=0))
    os.write(2, f"\n==== {stamp} brokerlens {command} (pid {os.getpid()})\n".encode())
    return path


def to_log_file(text: str) -> None:
    """Append ``text``, redacted, to whatever file descriptor 2 is (the log file once diverted)."""
    os.write(2, (redact(text).rstrip("\n") + "\n").encode("utf-8", "backslashreplace"))
