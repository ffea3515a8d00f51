"""dispatch/*.jsonl: one record per scope per throttling period (schemas/landing/README.md)."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .checks import (
    MISSING_FIELD,
    PRIORITY,
    Field,
    duplicate_problem,
    field_problems,
    first_problem,
    malformed_json,
    map_object,
    typed_columns,
    with_object,
)

KIND = "dispatch"
TABLE = "bronze_dispatch"
SUFFIXES = (".jsonl",)
WHOLE_FILE = False
LEVELS = ("broker", "topic", "subscription")

FIELDS = (
    Field("period_start", "timestamp", required=True, in_day=True),
    Field("period_seconds", "int", required=True, counter=True),
    Field("level", required=True, enum=LEVELS),
    Field("cluster", required=True),
    Field("broker"),
    Field("topic"),
    Field("subscription"),
    Field("msgs", "bigint", required=True, counter=True),
    Field("bytes", "bigint", required=True, counter=True),
    Field("entries", "bigint", counter=True),
    Field("redelivered_msgs", "bigint", counter=True),
    # brokerlens' interceptor adds these (docs/interceptor.md): "exporter", and its record number.
    Field("source"),
    Field("seq", "bigint", counter=True),
)


def parse(records: DataFrame, day: date) -> DataFrame:
    parsed = with_object(records, F.col("raw"), FIELDS, "_keys", "_t")
    k, t = F.col("_keys"), F.col("_t")
    level = t["level"]
    # The scope a level names must be there: topic from topic level down, subscription at
    # subscription level, the broker at broker level.
    scope = [
        ((level == "broker") & t["broker"].isNull(), "broker is missing (level broker)"),
        (level.isin("topic", "subscription") & t["topic"].isNull(), "topic is missing (level topic or subscription)"),
        ((level == "subscription") & t["subscription"].isNull(), "subscription is missing (level subscription)"),
    ]
    problems = [
        *malformed_json(F.col("raw"), k),
        *field_problems(map_object(k, t), FIELDS, day),
        *[(PRIORITY.index(MISSING_FIELD), cond, MISSING_FIELD, F.lit(text)) for cond, text in scope],
        (PRIORITY.index("negative-counter"), t["period_seconds"] == 0, "negative-counter", F.lit("period_seconds must be positive, got 0")),
        duplicate_problem(),
    ]
    return parsed.select(
        F.lit(day).alias("day"),
        *typed_columns(t, FIELDS),
        "source_file",
        "line",
        "raw",
        "ingested_at",
        first_problem(problems).alias("problem"),
    )
