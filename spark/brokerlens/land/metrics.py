"""metrics/*.prom: Prometheus text exposition of broker ``/metrics``, as the broker serves it.

A file saved with ``curl http://broker-1:8080/metrics > broker-1_8080.prom`` lands as it is:

* cluster: the sample's ``cluster`` label (Pulsar puts it on every sample), else the file's;
* broker: the file name (without a ``.gz`` or ``.bz2`` of a compressed file), ``<broker>.prom`` or ``<broker>@<anything>.prom`` (``@`` starts a suffix
  that tells several scrapes of one broker apart); a ``:`` cannot be in a landing file name, so
  ``_<port>`` at the end stands for ``:<port>``: ``broker-1_8080@1000.prom`` is ``broker-1:8080``;
* time: the sample's millisecond timestamp (Pulsar 2.x-3.x write one), else the latest timestamp
  in the file, else the file's modification time (which must then lie on the landing day).

Only the families brokerlens reads (``ANALYTICS_FAMILIES``) and those of the setting
``land.metric_families`` land; the other samples are counted (``metrics_samples_not_landed``),
not parsed or checked. A line that is not a sample at all is quarantined whatever its name.

An optional first line ``# brokerlens: {"collected_at": ..., "cluster": ..., "broker": ...}``
overrides all three; a header that is present but bad quarantines the file as one record.
``# TYPE`` lines give a family's type (once per family and file, whatever the order); ``# HELP``
and other comments are skipped; every other non-blank line is a sample
``name{label="value",...} value [timestamp_ms]``.

A page is read whole, in one pass, by brokerlens' reader (``MetricsPageRows.scala``, :func:`read`)
when it takes the file (one in which :func:`parse` would find nothing to say); every other file
goes to :func:`parse`, line by line.
"""

from __future__ import annotations

import fnmatch
import json
from datetime import date
from pathlib import Path
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.land.settings import LandSettings
from brokerlens.platform.jars import METRICS_ROWS_FUNCTION

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
    with_object,
)
from .files import Lines, by_source_file, read_whole

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
# A label value: runs of plain characters between escapes (`\"`, `\\`, `\n`), which Java's regex
# engine matches without a backtracking step per character, as `(?:[^"\\]|\\.)*` takes.
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"'
_FAMILY_SUFFIX = r"_(bucket|sum|count|total|created)$"
_FILE_NAME = r"([^/@]+?)(@[^/]*)?\.prom(\.gz|\.bz2)?$"
_SKIPPED = "the file's samples are not landed"
_NAME = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)"
# The families build reads from bronze_metrics (the only ones landed by default): the out
# counters (silver.intervals), a cursor's range count (silver.cursors) and the broker's version
# (gold.brokers).
MSG_OUT_COUNTER, BYTES_OUT_COUNTER = "pulsar_out_messages_total", "pulsar_out_bytes_total"
# A cursor's range count (ManagedCursorMetrics). Pulsar names it brk_ml_cursor_...; broker /metrics
# writes every brk_ name as pulsar_ (PrometheusMetricsGenerator, already in 3.0.x and 4.x), and the
# brk_ name appears in /admin/v2/broker-stats/metrics dumps: both are read.
CURSOR_RANGES_METRICS = (
    "pulsar_ml_cursor_nonContiguousDeletedMessagesRange",
    "brk_ml_cursor_nonContiguousDeletedMessagesRange",
)
VERSION_METRIC = "pulsar_version_info"  # its `version` label
ANALYTICS_FAMILIES = (MSG_OUT_COUNTER, BYTES_OUT_COUNTER, *CURSOR_RANGES_METRICS, VERSION_METRIC)


def _family_pattern(settings: LandSettings) -> str | None:
    """The Java regex of ``land.metric_families``' glob patterns (fnmatch's translation is one:
    (?s:...) and \\Z), none without a pattern."""
    return "|".join(f"^{fnmatch.translate(p)}" for p in settings.metric_families) or None


def _landed(settings: LandSettings) -> F.Column | None:
    """Whether a landing line lands (headers, comments, lines that are not a sample, and the
    samples of the kept families); None: every line does (``land.metric_families`` has ``*``)."""
    if "*" in settings.metric_families:
        return None
    raw = F.trim("raw")
    name = F.regexp_extract(raw, _NAME, 1)
    kept = name.isin(*ANALYTICS_FAMILIES)
    if pattern := _family_pattern(settings):
        kept = kept | name.rlike(pattern)
    return raw.startswith("#") | kept | ~raw.rlike(_SAMPLE)


# Pages up to this size are read whole by brokerlens' reader: a task holds a page about five
# times over (its bytes, its text, its lines, the rows), two tasks at once on a 2-core driver.
# Larger and compressed ones go to the general parser, which streams their lines.
READER_MAX_BYTES = 16 << 20


class MetricsRead(NamedTuple):
    """What :func:`read` gives."""

    rows: DataFrame | None  # the reader's rows, as parse gives them (None: it took no file)
    left: list[Path]  # the files for the general parser
    not_landed: int  # samples of the other families in the files it took
    scanned: DataFrame | None  # what the rows come from, persisted: unpersist it when done


def read(spark: SparkSession, paths: list[Path], day: date, settings: LandSettings) -> MetricsRead:
    """The ``paths`` brokerlens' /metrics reader takes, as :func:`parse` gives them, and those
    it leaves to :func:`parse`: compressed and larger pages, and every page in which that parser
    finds a problem (one Spark job reads them, here)."""
    whole = [p for p in paths if p.name.endswith(".prom") and p.stat().st_size <= READER_MAX_BYTES]
    if not whole:
        return MetricsRead(None, paths, 0, None)
    spec = {
        "header": _HEADER,
        "type": _TYPE,
        "sample": _SAMPLE,
        "label": _LABEL,
        "family_suffix": _FAMILY_SUFFIX,
        "types": list(METRIC_TYPES),
        "families": list(ANALYTICS_FAMILIES),
        "family_pattern": _family_pattern(settings),
        "keep_all": "*" in settings.metric_families,
    }
    start, end = day_bounds(day)
    page = F.call_function(METRICS_ROWS_FUNCTION, F.col("raw"), F.lit(json.dumps(spec)), F.lit(start), F.lit(end), F.col("ingested_at"))
    scanned = read_whole(spark, whole).select("source_file", "ingested_at", page.alias("_p")).persist(StorageLevel.DISK_ONLY)
    try:
        files = scanned.select("source_file", "_p.left", "_p.not_landed").collect()  # a row per file
    except BaseException:
        scanned.unpersist()
        raise
    by_name = by_source_file(whole)
    if {r["source_file"] for r in files} != by_name.keys():
        # Spark named a file otherwise than by its path (files._source_file): the general parser reads them all.
        scanned.unpersist()
        return MetricsRead(None, paths, 0, None)
    taken = {r["source_file"] for r in files if not r["left"]}
    p, s = F.col("_p"), F.col("_s")
    rows = scanned.where(~p["left"]).select("source_file", "ingested_at", "_p", F.explode(p["samples"]).alias("_s"))
    rows = rows.select(
        *_located(
            day, p["header_collected_at"], p["header_cluster"], p["header_broker"], s["labels"], s["sample_timestamp"], p["file_cluster"], p["file_stamp"]
        ),
        *[s[c].alias(c) for c in ("metric", "metric_type", "labels", "value", "sample_timestamp")],
        "source_file",
        s["line"].alias("line"),
        s["raw"].alias("raw"),
        "ingested_at",
        F.lit(None).cast("struct<reason:string,detail:string>").alias("problem"),
    )
    read_whole_paths = set(whole)
    left = [path for name, path in by_name.items() if name not in taken] + [path for path in paths if path not in read_whole_paths]
    return MetricsRead(rows, left, sum(r["not_landed"] for r in files if not r["left"]), scanned)


def _located(
    day: date, header_at: Column, header_cluster: Column, header_broker: Column, labels: Column, stamp: Column, file_cluster: Column, file_stamp: Column
) -> list[Column]:
    """A sample's day, collected_at, cluster and broker: the header's, else the sample's own
    (timestamp, ``cluster`` label), else the file's (its latest sample timestamp, its largest
    ``cluster`` label; its modification time; its name)."""
    return [
        F.lit(day).alias("day"),
        F.coalesce(header_at, stamp, file_stamp, F.col("ingested_at")).alias("collected_at"),
        F.coalesce(header_cluster, labels["cluster"], file_cluster).alias("cluster"),
        F.coalesce(header_broker, F.nullif(broker_from_file(F.col("source_file")), F.lit(""))).alias("broker"),
    ]


def landed_records(lines: Lines, settings: LandSettings) -> tuple[DataFrame, int]:
    """(the records of ``lines`` that land (:func:`_landed`), kept once on local disk; how many
    samples do not land). The lines that land are a few percent of a page's: kept, they are what
    the duplicate check, the per-file summary and the rows read, instead of each of them numbering
    and filtering the files' text again. The samples not landed are the lines read less those that
    land, counted on what is kept, not by a pass of their own over the text."""
    landed = _landed(settings)
    if landed is None:
        return lines.records, 0
    kept = lines.records.where(landed).localCheckpoint(storageLevel=StorageLevel.DISK_ONLY)
    return kept, lines.count() - kept.count()


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
    lines = _lines(records, day)
    by_family = _by_family(lines)
    files = _files(by_family)
    c, h = F.col("_class"), F.col("_header")
    header_bad = h["problem"].isNotNull()
    clusterless = F.col("_has_samples") & h["t"]["cluster"].isNull() & F.col("_file_cluster").isNull()
    bad_header_line = (c == "header") & (F.col("line") == h["line"]) & header_bad
    kept = lines.join(F.broadcast(files), "source_file").where(
        ((c == "sample") & ~header_bad & ~clusterless) | ((c == "type") & F.col("_type_problem").isNotNull()) | bad_header_line
    )
    # A sample's type: its family's `# TYPE` in its file, by its name or by the name without a
    # suffix (`_bucket`, `_sum`, ...). Joined, not broadcast: a day of scrapes holds thousands of
    # files, each typing a few hundred families.
    types = by_family.where(F.col("_family_type").isNotNull()).select("source_file", "family", "_family_type")
    kept = (
        kept.join(types.withColumnsRenamed({"family": "metric", "_family_type": "_exact_type"}), ["source_file", "metric"], "left")
        .withColumn("_family", F.regexp_replace("metric", _FAMILY_SUFFIX, ""))
        .join(types.withColumnsRenamed({"family": "_family", "_family_type": "_stripped_type"}), ["source_file", "_family"], "left")
    )
    metric = F.col("metric")
    start, end = day_bounds(day)
    stamp = F.col("sample_timestamp")
    value_text, stamp_text = F.col("_value_text"), F.col("_stamp_text")
    file_time_only = h["t"]["collected_at"].isNull() & F.col("_file_stamp").isNull()
    mtime = F.col("ingested_at")
    sample_problem = first_problem(
        [
            (PRIORITY.index(MALFORMED_LINE), metric.isNull(), MALFORMED_LINE, F.lit("not a Prometheus sample: name{labels} value [timestamp]")),
            (PRIORITY.index(WRONG_TYPE), F.col("value").isNull(), WRONG_TYPE, F.concat(F.lit("sample value is not a number: "), value_text)),
            (
                PRIORITY.index(NEGATIVE_COUNTER),
                (F.col("metric_type") == "counter") & (F.col("value") < 0),
                NEGATIVE_COUNTER,
                F.concat(F.lit("counter "), metric, F.lit(" is negative: "), value_text),
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
    rows = kept.withColumn("metric_type", F.coalesce("_exact_type", "_stripped_type")).select(
        *_located(
            day,
            h["t"]["collected_at"],
            h["t"]["cluster"],
            h["t"]["broker"],
            F.col("labels"),
            F.col("sample_timestamp"),
            F.col("_file_cluster"),
            F.col("_file_stamp"),
        ),
        "metric",
        "metric_type",
        "labels",
        "value",
        "sample_timestamp",
        "source_file",
        "line",
        "raw",
        "ingested_at",
        F.when(bad_header_line, _problem_with_suffix(h["problem"])).when(c == "type", F.col("_type_problem")).otherwise(sample_problem).alias("problem"),
    )
    # A file whose samples have no cluster: one quarantine row, none of its samples lands.
    no_cluster = files.where(~header_bad & clusterless).select(
        "source_file",
        F.lit(None).cast("int").alias("line"),
        F.lit(None).cast("string").alias("raw"),
        F.col("_file_ingested_at").alias("ingested_at"),
        _problem(
            MISSING_FIELD,
            F.lit(f"no sample has a 'cluster' label and there is no '# brokerlens: {{...}}' header: {_SKIPPED}"),
        ).alias("problem"),
    )
    return rows.unionByName(no_cluster, allowMissingColumns=True)


def _lines(records: DataFrame, day: date) -> DataFrame:
    """Each line classified (header, type, comment, sample) and parsed as its class asks, once:
    the per-file summary and the rows both read these columns."""
    raw = F.trim("raw")
    c = F.col("_class")
    lines = records.withColumn(
        "_class",
        F.when(raw.rlike(_HEADER), "header").when(raw.rlike(_TYPE), "type").when(raw.startswith("#"), "comment").otherwise("sample"),
    )
    # Header `# brokerlens: {...}`: only a file's first one counts (:func:`_files`).
    header_text = F.regexp_extract(raw, _HEADER, 1)
    lines = with_object(lines, header_text, HEADER, "_k", "_t", applies=c == "header")
    header_problem = first_problem(
        [*malformed_json(header_text, F.col("_k"), "header: "), *field_problems(map_object(F.col("_k"), F.col("_t")), HEADER, day, "header ")]
    )
    # `# TYPE family type`: a family's type in this file.
    family_type = F.regexp_extract(raw, _TYPE, 2)
    type_problem = _problem(
        "unknown-enum",
        F.concat(F.lit("# TYPE "), family_type, F.lit(f" is not one of {', '.join(METRIC_TYPES)}")),
    )
    # A sample `name{labels} value [timestamp_ms]`.
    is_sample = c == "sample"
    labels_text = F.regexp_extract(raw, _SAMPLE, 3)
    value_text = F.regexp_extract(raw, _SAMPLE, 4)
    stamp_text = F.regexp_extract(raw, _SAMPLE, 6)
    labels = F.map_from_arrays(
        F.regexp_extract_all(labels_text, F.lit(_LABEL), 1),
        F.transform(
            F.regexp_extract_all(labels_text, F.lit(_LABEL), 2),
            lambda v: F.when(v.contains("\\"), F.regexp_replace(F.regexp_replace(v, r'\\(["\\])', "$1"), r"\\n", "\n")).otherwise(v),
        ),
    )
    return lines.select(
        "source_file",
        "line",
        "raw",
        "ingested_at",
        "duplicate_of",
        "_class",
        F.when(c == "header", F.struct(F.col("line"), header_problem.alias("problem"), F.col("_t").alias("t"))).alias("_header_line"),
        F.when(c == "type", F.regexp_extract(raw, _TYPE, 1)).alias("family"),
        F.when((c == "type") & family_type.isin(*METRIC_TYPES), family_type).alias("_family_type"),
        F.when((c == "type") & ~family_type.isin(*METRIC_TYPES), type_problem).alias("_type_problem"),
        F.when(is_sample & raw.rlike(_SAMPLE), F.regexp_extract(raw, _SAMPLE, 1)).alias("metric"),
        F.when(is_sample, labels).alias("labels"),
        F.when(is_sample, _value(value_text)).alias("value"),
        F.when(is_sample & (stamp_text != ""), F.timestamp_millis(stamp_text.cast("bigint"))).alias("sample_timestamp"),
        F.when(is_sample, value_text).alias("_value_text"),
        F.when(is_sample, stamp_text).alias("_stamp_text"),
    )


def _by_family(lines: DataFrame) -> DataFrame:
    """Per file and family (null for the lines that are not `# TYPE`): the family's first valid
    type by name, and the file's first header line (``_header``: line, problem, typed fields),
    largest ``cluster`` label and sample timestamp, whether it has samples, when it landed. The
    file summary and the types both come from it, one aggregate over the lines."""
    return lines.groupBy("source_file", "family").agg(
        F.min("_family_type").alias("_family_type"),
        F.min_by("_header_line", "_header_line.line").alias("_header"),
        F.max(F.col("labels")["cluster"]).alias("_file_cluster"),
        F.max("sample_timestamp").alias("_file_stamp"),
        F.max(F.col("_class") == "sample").alias("_has_samples"),
        F.max("ingested_at").alias("_file_ingested_at"),
    )


def _files(by_family: DataFrame) -> DataFrame:
    """One row per file (:func:`_by_family`, over its families)."""
    return by_family.groupBy("source_file").agg(
        F.min_by("_header", "_header.line").alias("_header"),
        F.max("_file_cluster").alias("_file_cluster"),
        F.max("_file_stamp").alias("_file_stamp"),
        F.max("_has_samples").alias("_has_samples"),
        F.max("_file_ingested_at").alias("_file_ingested_at"),
    )


def _problem_with_suffix(problem: F.Column) -> F.Column:
    return F.struct(problem["reason"].alias("reason"), F.concat(problem["detail"], F.lit(f" ({_SKIPPED})")).alias("detail"))
