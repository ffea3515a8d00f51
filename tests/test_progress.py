"""Progress of long steps: a few log lines when stderr is not a terminal (Airflow), a bar on one."""

from __future__ import annotations

import logging

from brokerlens.platform.progress import progress, track


def test_log_mode_logs_start_throttled_updates_and_end(caplog):
    caplog.set_level(logging.INFO, logger="brokerlens.platform.progress")
    with progress("land 2026-11-21", total=4, unit="files", mode="log", interval=3600) as step:
        for name in ("a", "b", "c", "d"):
            step.note(name)
            step.advance()
    lines = [r.getMessage() for r in caplog.records]
    # Within the interval only the start and the end are logged: quiet in task logs.
    assert lines[0] == "land 2026-11-21: started (4 files)"
    assert len(lines) == 2 and lines[1].startswith("land 2026-11-21: done, 4/4 files, 100%")


def test_log_mode_reports_while_running_once_per_interval(caplog):
    caplog.set_level(logging.INFO, logger="brokerlens.platform.progress")
    assert list(track(range(3), "build", unit="steps", mode="log", interval=0)) == [0, 1, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[1].startswith("build: 1/3 steps, 33%") and lines[3].startswith("build: 3/3 steps, 100%")
    assert lines[-1].startswith("build: done, 3/3 steps")


def test_nested_bars_share_one_display(capsys):
    with progress("build", total=2, unit="steps", mode="bar") as outer:
        with progress("dispatch", total=None, unit="periods", mode="bar") as inner:
            inner.advance(10)
        outer.advance(2)
    with progress("again", total=1, mode="bar") as step:  # the display was released
        step.advance()
    err = capsys.readouterr().err
    assert "build" in err and "dispatch" in err and "again" in err


def test_off_mode_is_silent(caplog, capsys):
    caplog.set_level(logging.INFO)
    for _ in track([1, 2], "quiet", mode="off"):
        pass
    assert not caplog.records and capsys.readouterr().err == ""


def test_a_step_left_by_an_exception_is_logged_as_stopped_not_done(caplog):
    caplog.set_level(logging.INFO, logger="brokerlens.platform.progress")
    try:
        for i in track(range(5), "land 2026-11-21", unit="kinds", mode="log", interval=3600):
            if i == 2:
                raise ValueError("unreadable")
    except ValueError:
        pass
    lines = [r.getMessage() for r in caplog.records]
    # Items 0 and 1 were advanced; the exception came while item 2 was being processed.
    assert lines[-1].startswith("land 2026-11-21: stopped, 2/5 kinds, 40%")
