"""metrics/*.prom: Prometheus text exposition of broker ``/metrics``.

Each file starts with ``# brokerlens: {"collected_at": ..., "cluster": ..., "broker": ...}``;
``# TYPE`` lines give each family's type, ``# HELP`` and other comments are skipped, and every
other non-blank line is a sample ``name{label="value",...} value [timestamp_ms]``.
A file without a valid header is quarantined as one record (its samples cannot be placed).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .checks import (
    MALFORMED_LINE,
    MISSING_FIELD,
    NEGATIVE_COUNTER,
    OUTSIDE_DAY,
    PRIORITY,
    WRONG_TYPE,
    Field,
    day_bounds,
    duplicate_problem,
    field_problems,
    first_problem,
    malformed_json,
    parse_object,
)

KIND = "metrics"
TABLE = "bronze_metrics"
SUFFIXES = (".prom",)
WHOLE_FILE = False
DUPLICATES_WITHIN_FILE = True  # the same sample text in two scrapes is two samples
METRIC_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")

HEADER = (
    Field("collected_at", "timestamp", required=True, in_day=True),
    Field("cluster", required=True),
    Field("broker"),
)
_HEADER = r"^#\s*brokerlens:\s*(.*)$"
_TYPE = r"^#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\S+)\s*$"
_SAMPLE = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?[ \t]+(\S+)([ \t]+(-?[0-9]+))?[ \t]*$"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"'
_FAMILY_SUFFIX = r"_(bucket|sum|count|total|created)$"
_SKIPPED = "the file's samples are not landed"


def _problem(reason: str, detail: F.Column) -> F.Column:
    return F.struct(F.lit(reason).alias("reason"), detail.alias("detail"))


def _value(text: F.Column) -> F.Column:
    lowered = F.lower(text)
    return (
        F.when(lowered.isin("+inf", "inf"), F.lit(float("inf")))
        .when(lowered == "-inf", F.lit(float("-inf")))
        .when(lowered == "nan", F.lit(float("nan")))
        .otherwise(text.try_cast("double"))
    )


def parse(records: DataFrame, day: date) -> DataFrame:
    raw = F.trim("raw")
    lines = records.withColumn(
        "_class",
        F.when(raw.rlike(_HEADER), "header")
        .when(raw.rlike(_TYPE), "type")
        .when(raw.startswith("#"), "comment")
        .otherwise("sample"),
    )

    # Header: the first `# brokerlens:` line of each file.
    header_text = F.regexp_extract(raw, _HEADER, 1)
    keys, typed = parse_object(header_text, HEADER)
    first = Window.partitionBy("source_file").orderBy("line")
    headers = (
        lines.where(F.col("_class") == "header")
        .withColumn("_n", F.row_number().over(first))
        .where("_n = 1")
        .withColumns({"_k": keys, "_t": typed})
    )
    header_problem = first_problem(
        [*malformed_json(header_text, F.col("_k"), "header: "), *field_problems(F.col("_k"), F.col("_t"), HEADER, day, "header ")]
    )
    headers = headers.withColumn("problem", header_problem)
    bad_headers = headers.where(F.col("problem").isNotNull()).withColumn(
        "problem", _problem_with_suffix(F.col("problem"))
    )
    good_headers = headers.where(F.col("problem").isNull()).select(
        "source_file",
        F.col("_t.collected_at").alias("collected_at"),
        F.col("_t.cluster").alias("cluster"),
        F.col("_t.broker").alias("broker"),
    )
    headerless = (
        lines.select("source_file", "ingested_at")
        .distinct()
        .join(headers.select("source_file"), "source_file", "left_anti")
        .select(
            "source_file",
            F.lit(None).cast("int").alias("line"),
            F.lit(None).cast("string").alias("raw"),
            "ingested_at",
            _problem(MISSING_FIELD, F.lit(f"no '# brokerlens: {{...}}' header line: {_SKIPPED}")).alias("problem"),
        )
    )

    # TYPE lines: family -> type, per file.
    family_type = F.regexp_extract(raw, _TYPE, 2)
    types = lines.where(F.col("_class") == "type").select(
        "*",
        F.regexp_extract(raw, _TYPE, 1).alias("family"),
        family_type.alias("metric_type"),
        F.when(
            ~family_type.isin(*METRIC_TYPES),
            _problem(
                "unknown-enum",
                F.concat(F.lit("# TYPE "), family_type, F.lit(f" is not one of {', '.join(METRIC_TYPES)}")),
            ),
        ).alias("problem"),
    )
    bad_types = types.where(F.col("problem").isNotNull())
    good_types = types.where(F.col("problem").isNull()).select("source_file", "family", "metric_type")

    # Samples.
    match = raw.rlike(_SAMPLE)
    labels_text = F.regexp_extract(raw, _SAMPLE, 3)
    value_text = F.regexp_extract(raw, _SAMPLE, 4)
    stamp_text = F.regexp_extract(raw, _SAMPLE, 6)
    samples = lines.where(F.col("_class") == "sample").select(
        "*",
        F.when(match, F.regexp_extract(raw, _SAMPLE, 1)).alias("metric"),
        F.map_from_arrays(
            F.regexp_extract_all(labels_text, F.lit(_LABEL), 1),
            F.transform(
                F.regexp_extract_all(labels_text, F.lit(_LABEL), 2),
                lambda v: F.regexp_replace(F.regexp_replace(v, r'\\(["\\])', "$1"), r"\\n", "\n"),
            ),
        ).alias("labels"),
        _value(value_text).alias("value"),
        F.when(stamp_text != "", F.timestamp_millis(stamp_text.cast("bigint"))).alias("sample_timestamp"),
    )
    samples = samples.join(F.broadcast(good_headers), "source_file")
    exact = good_types.withColumnRenamed("family", "metric").withColumnRenamed("metric_type", "_exact_type")
    stripped = good_types.withColumnRenamed("family", "_family").withColumnRenamed("metric_type", "_family_type")
    samples = (
        samples.join(exact, ["source_file", "metric"], "left")
        .withColumn("_family", F.regexp_replace("metric", _FAMILY_SUFFIX, ""))
        .join(stripped, ["source_file", "_family"], "left")
        .withColumn("metric_type", F.coalesce("_exact_type", "_family_type"))
    )
    start, end = day_bounds(day)
    stamp = F.col("sample_timestamp")
    sample_problem = first_problem(
        [
            (PRIORITY.index(MALFORMED_LINE), ~match, MALFORMED_LINE, F.lit("not a Prometheus sample: name{labels} value [timestamp]")),
            (PRIORITY.index(WRONG_TYPE), F.col("value").isNull(), WRONG_TYPE, F.concat(F.lit("sample value is not a number: "), value_text)),
            (
                PRIORITY.index(NEGATIVE_COUNTER),
                (F.col("metric_type") == "counter") & (F.col("value") < 0),
                NEGATIVE_COUNTER,
                F.concat(F.lit("counter "), F.col("metric"), F.lit(" is negative: "), value_text),
            ),
            (
                PRIORITY.index(OUTSIDE_DAY),
                (stamp < F.lit(start)) | (stamp >= F.lit(end)),
                OUTSIDE_DAY,
                F.concat(F.lit("sample timestamp "), stamp_text, F.lit(f" is not on {day.isoformat()}")),
            ),
            duplicate_problem(),
        ]
    )
    rows = samples.select(
        F.lit(day).alias("day"),
        "collected_at", "cluster", "broker", "metric", "metric_type", "labels", "value", "sample_timestamp",
        "source_file", "line", "raw", "ingested_at",
        sample_problem.alias("problem"),
    )
    quarantine_only = [
        frame.select("source_file", "line", "raw", "ingested_at", "problem")
        for frame in (bad_headers, headerless, bad_types)
    ]
    for frame in quarantine_only:
        rows = rows.unionByName(frame, allowMissingColumns=True)
    return rows


def _problem_with_suffix(problem: F.Column) -> F.Column:
    return F.struct(problem["reason"].alias("reason"), F.concat(problem["detail"], F.lit(f" ({_SKIPPED})")).alias("detail"))
