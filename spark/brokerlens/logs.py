"""Logging to stderr: stdout belongs to command output (``brokerlens sql --format json``)."""

from __future__ import annotations

import logging
import sys


def configure(verbosity: int = 0) -> None:
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("brokerlens").setLevel(level)
    for noisy in ("py4j", "great_expectations", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
