"""Timestamps between Python and Spark, whatever the process's time zone.

Spark computes in UTC (``spark.sql.session.timeZone``), but PySpark hands a collected timestamp
back as a naive datetime in the *process's* zone (``TZ``), and reads a naive datetime given to
``createDataFrame`` or ``lit`` in that zone too. So brokerlens gives Spark aware datetimes only,
and makes collected ones aware with :func:`utc` before formatting or comparing them.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc(value: datetime | None) -> datetime | None:
    """A datetime collected from Spark (naive, local wall time) or an aware one, in UTC."""
    return None if value is None else value.astimezone(timezone.utc)
