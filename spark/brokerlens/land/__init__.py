"""`brokerlens land`: the landing files of a day → bronze tables, bad records → quarantine.

One parser module per landing kind (schemas/landing/README.md). Each turns the day's records
into its bronze rows plus a ``problem`` (reason, detail) that is null for a good record; good
rows replace the day's bronze partition, bad ones the day's ``quarantine`` partition (stage
``land``). All parsing is Spark: files are read in parallel, never looped over on the driver.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import date

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from brokerlens.platform.progress import progress
from brokerlens.platform.schemas import table_schema
from brokerlens.platform.settings import Settings
from brokerlens.platform.spark import get_spark
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import write_table

from . import dispatch, internal_stats, metrics, policies, producer_stats, topic_stats
from .checks import UNREADABLE_FILE, mark_duplicates, quarantine_frame
from .files import landing_files, read_lines, read_whole, split_readable

PARSERS = (topic_stats, internal_stats, dispatch, producer_stats, policies, metrics)
KINDS = tuple(p.KIND for p in PARSERS)
LAND_THREADS = 3


def land_kind(parser, day: date, settings: Settings) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(bronze rows, quarantine rows, the parsed frame both come from: persisted, unpersist
    it when done) of one landing kind for the day."""
    spark = get_spark(settings)
    paths = landing_files(settings.landing, day.isoformat(), parser.KIND, parser.SUFFIXES)
    readable, unreadable = split_readable(paths, settings.landing)
    records = (read_whole if parser.WHOLE_FILE else read_lines)(spark, readable)
    if not parser.WHOLE_FILE:  # whole files are judged for duplicates per envelope, inside
        records = mark_duplicates(records, within_file=getattr(parser, "DUPLICATES_WITHIN_FILE", False))
    # Parsed once, used twice (bronze and quarantine), kept on local disk: every kind's parsed
    # rows (whole Pulsar JSON documents) stay until the quarantine is written, and cached in the
    # heap they ran a 2 GB driver out of memory on 726 MB of a 2,000-partition day.
    parsed = parser.parse(records, day).persist(StorageLevel.DISK_ONLY)
    schema = table_schema(parser.TABLE)
    good = parsed.where(F.col("problem").isNull()).select(*schema.column_names)
    bad = quarantine_frame(parsed.where(F.col("problem").isNotNull()), day, parser.KIND)
    if unreadable:
        rows = [
            (day, "land", parser.KIND, u.source_file, None, UNREADABLE_FILE, u.detail, None, u.ingested_at)
            for u in unreadable
        ]
        bad = bad.unionByName(spark.createDataFrame(rows, table_schema("quarantine").struct))
    return good, bad, parsed


def _land_kind_to_bronze(parser, day: date, settings: Settings):
    good, bad, parsed = land_kind(parser, day, settings)
    write = write_table(good, parser.TABLE, mode="replace", partitions=[{"day": day}], settings=settings)
    return write, bad, parsed


def land_day(day: date, settings: Settings) -> StageResult:
    result = StageResult("land", day)
    quarantined, parsed_frames = [], []
    # The kinds land in parallel threads: most of a small kind's time is the driver's (plans,
    # Delta's commit), which then overlaps with the other kinds' Spark jobs. The threads take
    # this one's Spark job group, by which the stage server cancels a stage.
    land_kind_to_bronze = inheritable_thread_target(get_spark(settings))(_land_kind_to_bronze)
    with progress(f"land {day}", total=len(PARSERS), unit="kinds") as step, ThreadPoolExecutor(LAND_THREADS) as pool:
        futures = [pool.submit(land_kind_to_bronze, parser, day, settings) for parser in PARSERS]
        for parser, future in zip(PARSERS, futures):
            write, bad, parsed = future.result()
            step.note(parser.KIND)
            step.advance()
            parsed_frames.append(parsed)
            result.writes.append(write)
            result.metrics[f"{parser.KIND}_rows"] = write.rows
            quarantined.append(bad)
    everything = quarantined[0]
    for frame in quarantined[1:]:
        everything = everything.unionByName(frame)
    write = write_table(everything, "quarantine", mode="replace", partitions=[{"day": day, "stage": "land"}], settings=settings)
    result.writes.append(write)
    counts = everything.groupBy("kind", "reason").count().orderBy("kind", "reason").collect()
    for frame in parsed_frames:
        frame.unpersist()
    result.metrics["quarantined"] = sum(r["count"] for r in counts)
    for row in counts:
        result.lines.append(f"quarantined {row['kind']}: {row['reason']} {row['count']}")
    if not counts:
        result.lines.append("quarantined: none")
    return result
