"""Reading landing files with Spark: whole files for stats JSON, numbered lines for the rest.

Every reader returns records as ``source_file, line, raw, ingested_at``:

* ``source_file`` is relative to the landing root (``2026-11-21/dispatch/b1.jsonl``);
* ``line`` is the 1-based line (null for a whole-file record);
* ``ingested_at`` is the file's modification time (when it landed), so landing a day twice
  gives identical rows.

Files that cannot be opened, or that hold binary content, never reach Spark: they come back
as ``unreadable`` and become one quarantine row each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

RECORD_SCHEMA = T.StructType(
    [
        T.StructField("source_file", T.StringType(), False),
        T.StructField("line", T.IntegerType(), True),
        T.StructField("raw", T.StringType(), True),
        T.StructField("ingested_at", T.TimestampType(), False),
    ]
)
# Enough of a file's head to tell text from binary (a NUL byte never occurs in JSON or
# Prometheus text) without reading gigabytes on the driver.
_SNIFF_BYTES = 4096


@dataclass(frozen=True)
class Unreadable:
    source_file: str
    detail: str
    ingested_at: datetime


def landing_files(landing: Path, day: str, kind: str, suffixes: tuple[str, ...]) -> list[Path]:
    folder = landing / day / kind
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes))


def relative(path: Path, landing: Path) -> str:
    return path.relative_to(landing).as_posix()


def split_readable(paths: list[Path], landing: Path) -> tuple[list[Path], list[Unreadable]]:
    good, bad = [], []
    for path in paths:
        try:
            with path.open("rb") as handle:
                head = handle.read(_SNIFF_BYTES)
            problem = "binary content (NUL bytes), not text" if b"\x00" in head else None
        except OSError as exc:
            problem = f"cannot read: {exc.strerror or exc}"
        if problem is None:
            good.append(path)
            continue
        try:
            mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        except OSError:
            mtime = datetime.fromtimestamp(0, tz=timezone.utc)
        bad.append(Unreadable(relative(path, landing), problem, mtime))
    return good, bad


def _source_file(path_col: str) -> F.Column:
    # <landing>/<day>/<kind>/<file>: the last three components are the landing-relative path.
    return F.url_decode(F.substring_index(F.col(path_col), "/", -3))


def read_whole(spark: SparkSession, paths: list[Path]) -> DataFrame:
    """One record per file (stats JSON), all files in one Spark job."""
    if not paths:
        return spark.createDataFrame([], RECORD_SCHEMA)
    df = spark.read.text([str(p) for p in paths], wholetext=True)
    return df.select(
        _source_file("_metadata.file_path").alias("source_file"),
        F.lit(None).cast("int").alias("line"),
        F.col("value").alias("raw"),
        F.col("_metadata.file_modification_time").alias("ingested_at"),
    )


def read_lines(spark: SparkSession, paths: list[Path]) -> DataFrame:
    """One record per non-blank line with its real 1-based line number.

    Spark splits big files into blocks read in parallel; a row's line number is its position
    within its block plus the lines of the file's earlier blocks. Within a block the row ids of
    ``monotonically_increasing_id`` are consecutive, so no per-row loop or single-task read is
    needed however big the file.
    """
    if not paths:
        return spark.createDataFrame([], RECORD_SCHEMA)
    df = spark.read.text([str(p) for p in paths]).select(
        F.col("value").alias("raw"),
        F.col("_metadata.file_path").alias("path"),
        F.col("_metadata.file_block_start").alias("block"),
        F.col("_metadata.file_modification_time").alias("ingested_at"),
        F.monotonically_increasing_id().alias("rid"),
    )
    blocks = df.groupBy("path", "block").agg(F.min("rid").alias("first_rid"), F.count("*").alias("n"))
    earlier = Window.partitionBy("path").orderBy("block").rowsBetween(Window.unboundedPreceding, -1)
    blocks = blocks.withColumn("before", F.coalesce(F.sum("n").over(earlier), F.lit(0)))
    numbered = df.join(F.broadcast(blocks), ["path", "block"])
    return numbered.where(F.trim("raw") != "").select(
        _source_file("path").alias("source_file"),
        (F.col("rid") - F.col("first_rid") + F.col("before") + 1).cast("int").alias("line"),
        "raw",
        "ingested_at",
    )
