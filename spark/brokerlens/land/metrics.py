"""metrics/*.prom: Prometheus text exposition of broker ``/metrics``, as the broker serves it.

A file saved with ``curl http://broker-1:8080/metrics > broker-1_8080.prom`` lands as it is:

* cluster: the sample's ``cluster`` label (Pulsar puts it on every sample), else the file's;
* broker: the file name (without a ``.gz`` or ``.bz2`` of a compressed file), ``<broker>.prom`` or ``<broker>@<anything>.prom`` (``@`` starts a suffix
  that tells several scrapes of one broker apart); a ``:`` cannot be in a landing file name, so
  ``_<port>`` at the end stands for ``:<port>``: ``broker-1_8080@1000.prom`` is ``broker-1:8080``;
* time: the sample's millisecond timestamp (Pulsar 2.x-3.x write one), else the latest timestamp
  in the file, else the file's modification time (which must then lie on the landing day).

An optional first line ``# brokerlens: {"collected_at": ..., "cluster": ..., "broker": ...}``
overrides all three; a header that is present but bad quarantines the file as one record.
``# TYPE`` lines give a family's type (once per family and file, whatever the order); ``# HELP``
and other comments are skipped; every other non-blank line is a sample
``name{label="value",...} value [timestamp_ms]``.
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
    map_object,
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
_FILE_NAME = r"([^/@]+?)(@[^/]*)?\.prom(\.gz|\.bz2)?$"
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


def broker_from_file(source_file: F.Column) -> F.Column:
    """``<broker>[@<anything>].prom`` → broker, ``_<port>`` at its end read as ``:<port>``."""
    return F.regexp_replace(F.regexp_extract(source_file, _FILE_NAME, 1), r"_([0-9]+)$", ":$1")


def parse(records: DataFrame, day: date) -> DataFrame:
    raw = F.trim("raw")
    lines = records.withColumn(
        "_class",
        F.when(raw.rlike(_HEADER), "header").when(raw.rlike(_TYPE), "type").when(raw.startswith("#"), "comment").otherwise("sample"),
    )

    # Optional header: the first `# brokerlens:` line of each file.
    header_text = F.regexp_extract(raw, _HEADER, 1)
    keys, typed = parse_object(header_text, HEADER)
    first = Window.partitionBy("source_file").orderBy("line")
    headers = lines.where(F.col("_class") == "header").withColumn("_n", F.row_number().over(first)).where("_n = 1").withColumns({"_k": keys, "_t": typed})
    header_problem = first_problem(
        [*malformed_json(header_text, F.col("_k"), "header: "), *field_problems(map_object(F.col("_k"), F.col("_t")), HEADER, day, "header ")]
    )
    headers = headers.withColumn("problem", header_problem)
    bad_headers = headers.where(F.col("problem").isNotNull()).withColumn("problem", _problem_with_suffix(F.col("problem")))
    good_headers = headers.where(F.col("problem").isNull()).select(
        "source_file",
        F.col("_t.collected_at").alias("_h_collected_at"),
        F.col("_t.cluster").alias("_h_cluster"),
        F.col("_t.broker").alias("_h_broker"),
    )

    # TYPE lines: family -> type, per file (a scrape file holding several scrapes repeats them).
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
    good_types = types.where(F.col("problem").isNull()).groupBy("source_file", "family").agg(F.min("metric_type").alias("metric_type"))

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
    # Where each file's samples belong: its header, else its own labels, timestamps and name.
    files = (
        samples.groupBy("source_file")
        .agg(
            F.max(F.col("labels")["cluster"]).alias("_file_cluster"),
            F.max("sample_timestamp").alias("_file_stamp"),
        )
        .join(good_headers, "source_file", "left")
        .join(bad_headers.select("source_file"), "source_file", "left_anti")
    )
    clusterless = files.where(F.col("_h_cluster").isNull() & F.col("_file_cluster").isNull()).select("source_file")
    samples = samples.join(F.broadcast(files.join(clusterless, "source_file", "left_anti")), "source_file")
    no_cluster = (
        lines.select("source_file", "ingested_at")
        .distinct()
        .join(clusterless, "source_file")
        .select(
            "source_file",
            F.lit(None).cast("int").alias("line"),
            F.lit(None).cast("string").alias("raw"),
            "ingested_at",
            _problem(
                MISSING_FIELD,
                F.lit(f"no sample has a 'cluster' label and there is no '# brokerlens: {{...}}' header: {_SKIPPED}"),
            ).alias("problem"),
        )
    )
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
    file_time_only = F.col("_h_collected_at").isNull() & F.col("_file_stamp").isNull()
    mtime = F.col("ingested_at")
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
            (
                PRIORITY.index(OUTSIDE_DAY),
                file_time_only & ((mtime < F.lit(start)) | (mtime >= F.lit(end))),
                OUTSIDE_DAY,
                F.concat(
                    F.lit("no header and no sample timestamp in the file, and its modification time "),
                    F.date_format(mtime, "yyyy-MM-dd'T'HH:mm:ss'Z'"),
                    F.lit(f" is not on {day.isoformat()}"),
                ),
            ),
            duplicate_problem(),
        ]
    )
    rows = samples.select(
        F.lit(day).alias("day"),
        F.coalesce("_h_collected_at", "sample_timestamp", "_file_stamp", "ingested_at").alias("collected_at"),
        F.coalesce("_h_cluster", F.col("labels")["cluster"], "_file_cluster").alias("cluster"),
        F.coalesce("_h_broker", F.nullif(broker_from_file(F.col("source_file")), F.lit(""))).alias("broker"),
        "metric",
        "metric_type",
        "labels",
        "value",
        "sample_timestamp",
        "source_file",
        "line",
        "raw",
        "ingested_at",
        sample_problem.alias("problem"),
    )
    quarantine_only = [frame.select("source_file", "line", "raw", "ingested_at", "problem") for frame in (bad_headers, no_cluster, bad_types)]
    for frame in quarantine_only:
        rows = rows.unionByName(frame, allowMissingColumns=True)
    return rows


def _problem_with_suffix(problem: F.Column) -> F.Column:
    return F.struct(problem["reason"].alias("reason"), F.concat(problem["detail"], F.lit(f" ({_SKIPPED})")).alias("detail"))
