"""spark-submit application: runs one ``brokerlens`` command, e.g.
``spark-submit .../brokerlens/submit.py land --date 2026-11-21``.

This is how Airflow runs a stage (``SparkSubmitOperator``): the same command line as a user's,
with the master and resources decided by spark-submit (the ``spark_default`` connection), so a
cluster is a connection change. The stage's summary goes to stdout, which the operator copies
into the task log.

Exit codes (``brokerlens.cli``): 0 done; 1 the stage failed on its data (``StageFailed``, e.g. a
critical expectation: a retry would fail the same way); 2 bad usage, table, setting or path; 3
anything unexpected (a lost JVM, an unreachable server: worth a retry). A failure's stack trace,
if any, comes first and its one-line reason (``error: ...``) last, so the task log ends with it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    from brokerlens.cli import main as cli_main

    # stderr is the task log here: traces stay in it, before the reason.
    cli_main(log_to_file=False)


if __name__ == "__main__":
    # Run as a script, this file's folder (the package itself) comes first on sys.path, where
    # modules such as build.py or logs.py would shadow top-level modules of the same name.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    main()
