"""test_timezones' phases of ``brokerlens`` commands, run in one process: in a process started under
a zone's ``TZ`` (``python tests/zone_phases.py PHASES``, which prints each command's stdout as
JSON), or in the test's own (``run_phases``). Each phase has its own environment (home, mail
sink) and zone. A phase may start from a copy of a home another process publishes (it waits for it), and
may publish its own home once its commands have run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path


def wait_for(published: str) -> None:
    deadline = time.monotonic() + 1800
    while not Path(published + ".done").exists():
        assert not Path(published + ".failed").exists(), f"the process that builds {published} failed"
        assert time.monotonic() < deadline, f"{published} not published in 30 minutes"
        time.sleep(1)


def run_phases(phases: list[dict]) -> dict[str, dict[str, str]]:
    """Every phase's commands, in order, under the phase's ``tz`` (Python's local time, by
    ``time.tzset``); {phase label: {command name: what it printed}}. On a failure, what this
    process would have published is marked failed, so that the processes waiting for it fail at
    once."""
    from brokerlens.cli import main
    from brokerlens.settings import reload_settings

    pending = [phase["publish"] for phase in phases if phase.get("publish")]
    out: dict[str, dict[str, str]] = {}
    try:
        for phase in phases:
            if phase.get("copy_of"):
                wait_for(phase["copy_of"])
                shutil.copytree(phase["copy_of"], phase["env"]["BROKERLENS_HOME"])
            os.environ.update(phase["env"], TZ=phase["tz"])
            time.tzset()
            reload_settings()
            printed = out.setdefault(phase["label"], {})
            for name, argv, stdin in phase["commands"]:
                stdin_before, sys.stdin, buffer = sys.stdin, io.StringIO(stdin), io.StringIO()
                try:
                    with contextlib.redirect_stdout(buffer):
                        main(log_to_file=False, argv=argv)
                except SystemExit as exc:
                    assert not exc.code, f"{name}: exit {exc.code}"
                finally:
                    sys.stdin = stdin_before
                printed[name] = buffer.getvalue()
            if phase.get("publish"):
                shutil.copytree(phase["env"]["BROKERLENS_HOME"], phase["publish"])
                Path(phase["publish"] + ".done").touch()
                pending.remove(phase["publish"])
    except BaseException:
        for published in pending:
            Path(published + ".failed").touch()
        raise
    return out


if __name__ == "__main__":
    print(json.dumps(run_phases(json.loads(sys.argv[1]))))
