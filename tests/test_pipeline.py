"""The stage registry: a stage runs with the settings it is given, down to the modules that read
the settings in force (the table layer, the holes and alert steps), in every thread."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import date

from brokerlens import pipeline
from brokerlens.platform.settings import Settings, get_settings
from brokerlens.platform.stage import StageResult


def test_a_stage_runs_with_the_settings_it_is_given(tmp_path, monkeypatch, brokerlens_home):
    given = Settings(home=tmp_path / "elsewhere")
    seen = {}

    def probe(day, settings):
        seen["argument"] = settings.home
        seen["in force"] = get_settings().home
        with ThreadPoolExecutor(1) as pool:  # land writes its kinds from threads
            seen["thread"] = pool.submit(lambda: get_settings().home).result()
        return StageResult("probe", day)

    monkeypatch.setitem(pipeline.STAGES, "probe", "unused:probe")
    monkeypatch.setattr(pipeline, "resolve", lambda target: probe)
    pipeline.run_stage("probe", date(2026, 11, 21), given)
    assert seen == {"argument": given.home, "in force": given.home, "thread": given.home}
    assert get_settings().home == brokerlens_home != given.home  # the environment's again after it
