"""Rows for the dispatch tests: silver intervals and limits of a day, and dispatch_periods built from them."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from brokerlens.gold.dispatch.periods import dispatch_periods
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.frames import rows_frame

D1 = date(2026, 11, 21)
D2 = D1 + timedelta(days=1)
BROKER = "broker-1:8080"


def at(day: date, seconds: float) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc) + timedelta(seconds=seconds)


def offset(row, day: date = D1) -> float:
    """Seconds from ``day``'s midnight (Spark returns naive local datetimes; timestamp() agrees)."""
    return row["period_start"].timestamp() - at(day, 0).timestamp()


def partition(topic: str, n: int) -> str:
    return f"persistent://tenant/ns/{topic}-partition-{n}"


def interval(level, second, msgs, *, day=D1, bytes_=0, entries=None, redelivered=0,
             topic=None, subscription=None, seconds=1.0, grain="period"):  # fmt: skip
    return {
        "day": day, "level": level, "cluster": "c1", "broker": BROKER, "topic": topic,
        "subscription": subscription, "interval_start": at(day, second),
        "interval_seconds": float(seconds), "grain": grain, "msgs": msgs, "bytes": bytes_,
        "entries": entries, "redelivered_msgs": redelivered,
        "source": "dispatch" if grain == "period" else "topic-stats-counters",
        "counter_reset": False,
    }  # fmt: skip


def limit(level, msg_limit, *, byte_limit=None, day=D1, topic=None, start=0.0, end=86400.0,
          period=1, count_entries=False):  # fmt: skip
    return {
        "day": day, "level": level, "cluster": "c1",
        "broker": BROKER if level == "broker" else None, "topic": topic,
        "valid_from": at(day, start), "valid_to": at(day, end),
        "msg_limit": msg_limit, "byte_limit": byte_limit, "period_seconds": period,
        "count_entries": count_entries, "relative_to_publish_rate": False,
        "msg_source": "topic-policy", "byte_source": "broker-config",
    }  # fmt: skip


def frame(spark, table, rows):
    schema = table_schema(table)
    defaults = {"limiter_model": "classic"}  # debt_state rows written before a model was chosen
    return rows_frame(spark, [tuple(r.get(c, defaults.get(c)) for c in schema.column_names) for r in rows], schema.struct)


def models_frame(spark, models: dict[str, str]):
    """{broker: limiter_model} as limiter_models() returns it."""
    rows = [("c1", b, m, "test") for b, m in models.items()]
    return rows_frame(spark, rows, "cluster string, broker string, limiter_model string, limiter_model_source string")


def periods_of(spark, intervals, limits, opening=None, model=None):
    """``model``: token-bucket or classic for BROKER, or {broker: model}; None: no models (classic)."""
    models = {BROKER: model} if isinstance(model, str) else model
    out = dispatch_periods(frame(spark, "dispatch_intervals", intervals), frame(spark, "rate_limits", limits),
                           None if opening is None else frame(spark, "debt_state", opening),
                           None if models is None else models_frame(spark, models))  # fmt: skip
    return sorted(out.collect(), key=lambda r: (r["level"], r["topic"] or "", r["subscription"] or "", r["period_start"]))


TB, PERIODIC, CLASSIC = "token-bucket", "token-bucket-periodic", "classic"  # the limiter models
