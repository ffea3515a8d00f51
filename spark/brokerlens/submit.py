"""spark-submit application: runs one ``brokerlens`` command, e.g.
``spark-submit .../brokerlens/submit.py land --date 2026-11-21``.

This is how Airflow runs a stage (``SparkSubmitOperator``): the same command line as a user's,
with the master and resources decided by spark-submit (the ``spark_default`` connection), so a
cluster is a connection change. The stage's summary goes to stdout, which the operator copies
into the task log.

Exit codes: 0 done; 1 the stage failed on its data (``StageFailed``, e.g. a critical expectation:
a retry would fail the same way); 2 bad usage, table or schema; 3 anything unexpected (a lost
JVM, an unreachable server: worth a retry).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

UNEXPECTED_EXIT = 3


def main() -> None:
    from brokerlens.cli import main as cli_main

    try:
        cli_main()
    except Exception:  # SystemExit passes: the CLI's own exit codes stand
        traceback.print_exc()
        sys.exit(UNEXPECTED_EXIT)


if __name__ == "__main__":
    # Run as a script, this file's folder (the package itself) comes first on sys.path, where
    # modules such as build.py or logs.py would shadow top-level modules of the same name.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    main()
