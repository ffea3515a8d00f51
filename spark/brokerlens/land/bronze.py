"""`brokerlens land`: the landing files of a day → bronze tables, bad records → quarantine.

One parser module per landing kind (schemas/landing/README.md). Each turns the day's records
into its bronze rows plus a ``problem`` (reason, detail) that is null for a good record; good
rows replace the day's bronze partition, bad ones the day's ``quarantine`` partition (stage
``land``). All parsing is Spark: files are read in parallel, never looped over on the driver.
Which files are read is settled first (:mod:`.survey`): every other file of the day's folder is a
quarantine row, and the summary counts, per kind, files seen and read, rows and quarantine rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import date
from functools import partial, reduce
from pathlib import Path
from typing import Any, NamedTuple

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from brokerlens.land.settings import LandStepSettings
from brokerlens.platform.frames import empty_frame, rows_frame
from brokerlens.platform.progress import progress
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.spark import in_parallel
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import write_table

from . import dispatch, internal_stats, metrics, policies, producer_stats, topic_stats
from .checks import mark_duplicates, quarantine_frame
from .envelope import has_copies
from .files import by_source_file, read_lines, read_whole
from .survey import KindFiles, NotRead, survey

PARSERS = (topic_stats, internal_stats, dispatch, producer_stats, policies, metrics)
KINDS = tuple(p.KIND for p in PARSERS)


def survey_day(day: date, settings: LandStepSettings) -> dict[str, KindFiles]:
    return survey(
        settings.landing,
        day.isoformat(),
        {p.KIND: p.SUFFIXES for p in PARSERS},
        whole_file={p.KIND for p in PARSERS if p.WHOLE_FILE},
        max_record=settings.land.max_record_mb << 20,
    )


class Parsed(NamedTuple):
    """A kind's parsed rows (bronze columns, ``problem``, ``raw``), and the frames that hold them on disk."""

    frame: DataFrame
    persisted: tuple[DataFrame, ...]

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()


class LandedKind(NamedTuple):
    """One landing kind's day, from :func:`land_kind`."""

    good: DataFrame  # the bronze rows
    bad: DataFrame  # the quarantine rows
    parsed: Parsed  # what both come from, persisted: unpersist it when done
    samples_not_landed: int  # /metrics samples of the families that do not land (0 for the other kinds)


def land_kind(spark: SparkSession, parser, day: date, settings: LandStepSettings, files: KindFiles | None = None) -> LandedKind:
    """One landing kind for the day (:class:`LandedKind`; when the kind has no file to read,
    its bronze rows are the empty frame, parsed too); ``files``: the kind's files from
    :func:`survey_day` (surveyed here when not given)."""
    if files is None:
        files = survey_day(day, settings)[parser.KIND]
    bad = not_read_frame(spark, files.not_read, day, parser.KIND)
    if not files.read:
        # Nothing to parse, so no parser is planned and no duplicate check runs on no rows: a
        # day of dispatch files alone landed in 6.1 to 9.8 s instead of 9.1 to 12.4 s (warm,
        # alternating, 7 runs each). The day's partition is still replaced, by no rows.
        good = empty_frame(parser.TABLE, spark)
        return LandedKind(good, bad, Parsed(good, ()), 0)
    # Parsed once, used twice (bronze and quarantine), kept on local disk: every kind's parsed
    # rows (whole Pulsar JSON documents) stay until the quarantine is written, and cached in the
    # heap they ran a 2 GB driver out of memory on 726 MB of a 2,000-partition day.
    if parser.WHOLE_FILE:
        parsed, not_landed = _parsed_envelopes(spark, parser, files.read, day), 0
    else:
        parsed, not_landed = _parsed_lines(spark, parser, files.read, day, settings)
    schema = table_schema(parser.TABLE)
    good = parsed.frame.where(F.col("problem").isNull()).select(*schema.column_names)
    bad = quarantine_frame(parsed.frame.where(F.col("problem").isNotNull()), day, parser.KIND).unionByName(bad)
    return LandedKind(good, bad, parsed, not_landed)


def _parsed_envelopes(spark: SparkSession, parser, paths: list[Path], day: date) -> Parsed:
    """A stats kind's rows, persisted. Where the kind has a one-pass reader (``parser.read``),
    it reads the files it takes and the general parser (``parser.parse``) only the files it left,
    read again (with no union over one scan, which Spark would run twice). The envelopes are
    judged copies of others only when two hold the same text (:func:`has_copies`): then every
    file is parsed again by the general parser, with the check."""
    records = read_whole(spark, paths)
    persisted: list[DataFrame] = []
    try:
        if hasattr(parser, "read"):
            taken = parser.read(records, day)
            persisted.append(taken.scanned)
            parts, left = [taken.rows], _records_of(spark, paths, records, taken.left)
        else:
            parts, left = [], records
        if left is not None:
            persisted.append(parser.parse(left, day, duplicates=False).persist(StorageLevel.DISK_ONLY))
            parts.append(persisted[-1])
        parsed = Parsed(reduce(DataFrame.unionByName, parts), tuple(persisted))
        copies = has_copies(parsed.frame)
    except BaseException:
        for frame in persisted:
            frame.unpersist()
        raise
    if not copies:
        return parsed
    parsed.unpersist()
    frame = parser.parse(records, day).persist(StorageLevel.DISK_ONLY)
    return Parsed(frame, (frame,))


def _parsed_lines(spark: SparkSession, parser, paths: list[Path], day: date, settings: LandStepSettings) -> tuple[Parsed, int]:
    """A line kind's rows, persisted, and its samples not landed (/metrics). Where the kind has a
    one-pass reader (``parser.read``), it reads the files it takes and the general parser
    (``parser.parse``) the files it left, line by line."""
    parts: list[DataFrame] = []
    persisted: list[DataFrame] = []
    not_landed = 0
    try:
        if hasattr(parser, "read"):
            taken = parser.read(spark, paths, day, settings.land)
            if taken.rows is not None:
                parts.append(taken.rows)
                persisted.append(taken.scanned)
            paths, not_landed = taken.left, taken.not_landed
        if paths:
            lines = read_lines(spark, paths)
            # The samples of other /metrics families are dropped before anything is parsed.
            records, others = metrics.landed_records(lines, settings.land) if parser is metrics else (lines.records, 0)
            records = mark_duplicates(records, within_file=getattr(parser, "DUPLICATES_WITHIN_FILE", False))
            persisted.append(parser.parse(records, day).persist(StorageLevel.DISK_ONLY))
            parts.append(persisted[-1])
            not_landed += others
    except BaseException:
        for frame in persisted:
            frame.unpersist()
        raise
    return Parsed(reduce(DataFrame.unionByName, parts), tuple(persisted)), not_landed


def _records_of(spark: SparkSession, paths: list[Path], records: DataFrame, names: frozenset[str]) -> DataFrame | None:
    """The ``records`` of the files named ``names`` (their source_file), none when there is no
    name: read again by their paths, or taken from ``records`` (all files read again) should a
    name not be its path's (Spark names a file by its URI, unescaped: files._source_file)."""
    if not names:
        return None
    by_name = by_source_file(paths)
    if names <= by_name.keys():
        return read_whole(spark, [by_name[n] for n in sorted(names)])
    return records.where(F.col("source_file").isin(*sorted(names)))


def not_read_frame(spark: SparkSession, not_read: list[NotRead], day: date, kind: str) -> DataFrame:
    rows = [(day, "land", kind, n.source_file, None, n.reason, n.detail, None, n.ingested_at) for n in not_read]
    return rows_frame(spark, rows, table_schema("quarantine").struct)


def _land_kind_to_bronze(spark: SparkSession, parser, day: date, settings: LandStepSettings, files: KindFiles, kept: ExitStack):
    landed = land_kind(spark, parser, day, settings, files)
    kept.callback(landed.parsed.unpersist)  # at the end of land, also when this kind or another fails
    write = write_table(landed.good, parser.TABLE, mode="replace", partitions=[{"day": day}], settings=settings)
    # The kind's quarantine rows, taken out of its parsed rows here, beside the other kinds' work
    # (on disk: a hostile day's can be many). Left to the quarantine's write, one job over every
    # kind's parsed rows ran after all of them, each of its tasks sent every kind's plan (2.5 MB),
    # and it took 4.8 s of a demo day's 36 s land.
    return write, landed.bad.localCheckpoint(storageLevel=StorageLevel.DISK_ONLY), landed.samples_not_landed


def land_day(spark: SparkSession, day: date, settings: LandStepSettings) -> StageResult:
    result = StageResult("land", day)
    quarantined = []
    # The kinds land in parallel threads (platform.spark.in_parallel).
    files = survey_day(day, settings)
    with ExitStack() as kept:
        calls = [partial(_land_kind_to_bronze, spark, parser, day, settings, files[parser.KIND], kept) for parser in PARSERS]
        with progress(f"land {day}", total=len(PARSERS), unit="kinds") as step:
            for parser, (write, bad, not_landed) in zip(PARSERS, in_parallel(spark, calls)):
                step.note(parser.KIND)
                step.advance()
                result.writes.append(write)
                result.metrics[f"{parser.KIND}_rows"] = write.rows
                if parser is metrics:
                    result.metrics["metrics_samples_not_landed"] = not_landed
                quarantined.append(bad)
        # Folders of no known kind: every file in them is a quarantine row, none is read.
        quarantined += [not_read_frame(spark, f.not_read, day, kind) for kind, f in files.items() if kind not in KINDS]
        everything = reduce(DataFrame.unionByName, quarantined)
        # Counted beside the write, from the same rows: each kind's are kept on disk already, so
        # counting them passes over no parsed rows again.
        done: Iterator[Any] = in_parallel(
            spark,
            [
                partial(write_table, everything, "quarantine", mode="replace", partitions=[{"day": day, "stage": "land"}], settings=settings),
                partial(quarantine_counts, everything),
            ],
        )
        write, counts = done
        result.writes.append(write)
    _summarise(result, files, counts)
    return result


def quarantine_counts(quarantine: DataFrame) -> list[Row]:
    """(kind, reason, count) of the ``quarantine`` rows."""
    return quarantine.groupBy("kind", "reason").count().orderBy("kind", "reason").collect()


def _summarise(result: StageResult, files: dict[str, KindFiles], counts: list) -> None:
    """Per kind: files seen, read, bronze rows, quarantine rows; then the quarantine by reason."""
    result.metrics["files_seen"] = sum(f.seen for f in files.values())
    result.metrics["files_read"] = sum(len(f.read) for f in files.values())
    result.metrics["quarantined"] = sum(r["count"] for r in counts)
    per_kind: dict[str, int] = {}
    for row in counts:
        per_kind[row["kind"]] = per_kind.get(row["kind"], 0) + row["count"]
    for kind, found in files.items():
        rows = result.metrics.get(f"{kind}_rows", 0)
        line = f"{kind}: {found.seen} files seen, {len(found.read)} read, {rows} rows, {per_kind.get(kind, 0)} quarantined"
        if not_landed := result.metrics.get(f"{kind}_samples_not_landed"):
            line += f", {not_landed} samples of other families not landed (land.metric_families)"
        result.lines.append(line)
    for row in counts:
        result.lines.append(f"quarantined {row['kind']}: {row['reason']} {row['count']}")
    if not counts:
        result.lines.append("quarantined: none")
