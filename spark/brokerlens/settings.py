"""brokerlens' settings: the platform's (folders, Spark) and every step's section, read from the
environment and the settings file (brokerlens.platform.settings says how). Only the edges read
them: a command, an Airflow task, the bench. Each stage and table function is
given them by its caller and declares, by its step's settings class, which sections it reads."""

from __future__ import annotations

from functools import lru_cache

from brokerlens.deliver.settings import DeliverStepSettings
from brokerlens.gold.dispatch.settings import DispatchStepSettings
from brokerlens.gold.producers.settings import ProducersStepSettings
from brokerlens.land.settings import LandStepSettings
from brokerlens.platform.redact import secret_values, watch
from brokerlens.sources.settings import SourcesStepSettings


class Settings(SourcesStepSettings, LandStepSettings, DispatchStepSettings, ProducersStepSettings, DeliverStepSettings):
    """Every step's settings (each step's class is a part of this one)."""


@lru_cache(maxsize=1)
def _environment_settings() -> Settings:
    return Settings()


def get_settings() -> Settings:
    """The settings of the environment and the settings file (read once; :func:`reload_settings`
    reads them again)."""
    return _environment_settings()


def reload_settings() -> Settings:
    """Forget the cached settings (tests and the CLI change the environment)."""
    _environment_settings.cache_clear()
    return get_settings()


# Whatever prints redacts the secrets of the environment's settings (every Settings built registers its own).
watch(lambda: secret_values(get_settings()))
