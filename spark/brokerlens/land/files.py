"""Reading landing files with Spark: whole files for stats JSON, numbered lines for the rest.

Every reader returns records as ``source_file, line, raw, ingested_at``:

* ``source_file`` is relative to the landing root (``2026-11-21/dispatch/b1.jsonl``);
* ``line`` is the 1-based line (null for a whole-file record);
* ``ingested_at`` is the file's modification time (when it landed), so landing a day twice
  gives identical rows.

Which files are read is decided before (:mod:`brokerlens.land.survey`): files that cannot be
opened, or that hold binary content, never reach Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from brokerlens.platform.frames import rows_frame

RECORD_SCHEMA = T.StructType(
    [
        T.StructField("source_file", T.StringType(), False),
        T.StructField("line", T.IntegerType(), True),
        T.StructField("raw", T.StringType(), True),
        T.StructField("ingested_at", T.TimestampType(), False),
    ]
)
# A byte-order mark some Windows tools write first: not part of the JSON or Prometheus text.
BOM = "\ufeff"


def _without_bom(text: F.Column) -> F.Column:
    return F.when(text.startswith(BOM), F.substring(text, 2, 2**31 - 1)).otherwise(text)


def _source_file(path_col: str) -> F.Column:
    # <landing>/<day>/<kind>/<file>: the last three components are the landing-relative path,
    # unescaped from the file's URI. url_decode reads "+" as a space (a form's encoding), which
    # a URI's path does not escape: kept as the "+" of the file's name, as the survey names it.
    tail = F.substring_index(F.col(path_col), "/", -3)
    return F.url_decode(F.replace(tail, F.lit("+"), F.lit("%2B")))


def by_source_file(paths: list[Path]) -> dict[str, Path]:
    """``paths`` by the ``source_file`` a reader gives each (``<day>/<kind>/<file>``, as
    :func:`_source_file` has it), to find a file again by the name on its records."""
    return {"/".join(p.parts[-3:]): p for p in paths}


def read_whole(spark: SparkSession, paths: list[Path]) -> DataFrame:
    """One record per file (stats JSON), all files in one Spark job."""
    if not paths:
        return rows_frame(spark, [], RECORD_SCHEMA)
    df = spark.read.text([str(p) for p in paths], wholetext=True)
    return df.select(
        _source_file("_metadata.file_path").alias("source_file"),
        F.lit(None).cast("int").alias("line"),
        _without_bom(F.col("value")).alias("raw"),
        F.col("_metadata.file_modification_time").alias("ingested_at"),
    )


@dataclass(frozen=True)
class Lines:
    """The records of :func:`read_lines`, and the file blocks their line numbers came from."""

    records: DataFrame
    blocks: DataFrame  # kept: a row per file block, with its non-blank lines (``records``)

    def count(self) -> int:
        """How many records (non-blank lines), summed over the kept blocks: no pass over the files."""
        return self.blocks.agg(F.sum("records")).first()[0] or 0


def read_lines(spark: SparkSession, paths: list[Path]) -> Lines:
    """One record per non-blank line with its real 1-based line number.

    Spark splits big files into blocks read in parallel; a row's line number is its position
    within its block plus the lines of the file's earlier blocks. Within a block the row ids of
    ``monotonically_increasing_id`` are consecutive, so no per-row loop or single-task read is
    needed however big the file. The blocks (a row each) are counted first and kept, so that
    the records' count (:meth:`Lines.count`) needs no pass of its own.
    """
    if not paths:
        return Lines(rows_frame(spark, [], RECORD_SCHEMA), rows_frame(spark, [], "records bigint"))
    df = spark.read.text([str(p) for p in paths]).select(
        _without_bom(F.col("value")).alias("raw"),
        F.col("_metadata.file_path").alias("path"),
        F.col("_metadata.file_block_start").alias("block"),
        F.col("_metadata.file_modification_time").alias("ingested_at"),
        F.monotonically_increasing_id().alias("rid"),
    )
    nonblank = F.trim("raw") != ""
    blocks = df.groupBy("path", "block").agg(F.min("rid").alias("first_rid"), F.count("*").alias("n"), F.count_if(nonblank).alias("records"))
    earlier = Window.partitionBy("path").orderBy("block").rowsBetween(Window.unboundedPreceding, -1)
    blocks = blocks.withColumn("before", F.coalesce(F.sum("n").over(earlier), F.lit(0))).localCheckpoint()
    numbered = df.join(F.broadcast(blocks.drop("n", "records")), ["path", "block"])
    records = numbered.where(nonblank).select(
        _source_file("path").alias("source_file"),
        (F.col("rid") - F.col("first_rid") + F.col("before") + 1).cast("int").alias("line"),
        "raw",
        "ingested_at",
    )
    return Lines(records, blocks)
