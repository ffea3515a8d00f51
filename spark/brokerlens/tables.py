"""The table layer: the only module that knows how tables are stored.

Jobs ask it for a DataFrame (``read_table``) and give it a DataFrame (``write_table``).

Default storage ("delta-rs", DESIGN.md "Delta Lake without Maven"):

* Spark writes Parquet files in parallel into ``<table>/_staging/<write id>/`` (a folder of its
  own per write, so concurrent writers never share Spark's ``_temporary`` folder), the driver
  moves them into the table's partition folders and commits them as one atomic Delta
  transaction with delta-rs: add actions, plus remove actions for a partition or full
  overwrite. Until that commit no reader sees the files; a killed write leaves orphans that
  ``vacuum`` deletes, never visible rows.
* A write may carry an application transaction ``(app_id, version)``. If the table has already
  committed that version (or a later one) for that app id, the write is skipped: re-running an
  append is a no-op, never a duplicate. Partition overwrites are idempotent by themselves (a
  clean replace) and record the transaction for lineage.
* Conflicting concurrent commits (parallel backfill runs) are retried on a fresh snapshot.
* Reads ask delta-rs for the active files of a version and hand them to ``spark.read.parquet``
  with ``basePath``, so partition columns come back; time travel is the same call.

With ``table_format = "native"`` the same functions use Spark's ``format("delta")`` (the
delta-spark JARs must be on the classpath).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Iterable, Literal, Mapping
from urllib.parse import quote, unquote

import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    Transaction,
    create_table_with_add_actions,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from .schemas import TableSchema, table_schema, table_schemas
from .settings import Settings, get_settings
from .spark import get_spark

log = logging.getLogger(__name__)

WriteMode = Literal["append", "overwrite", "replace"]
PartitionSpec = Mapping[str, object]
STAGING = "_staging"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class TableError(RuntimeError):
    """A table cannot be read or written as asked; the message says why."""


@dataclass(frozen=True)
class WriteResult:
    table: str
    version: int | None
    files: int
    rows: int
    skipped: bool = False

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.table}: already committed by this transaction, nothing written"
        return f"{self.table}: {self.rows} rows in {self.files} files, version {self.version}"


def table_path(name: str, settings: Settings | None = None) -> Path:
    table_schema(name)  # unknown names fail here with the list of known tables
    return (settings or get_settings()).lake / name


def table_exists(name: str, settings: Settings | None = None) -> bool:
    return DeltaTable.is_deltatable(str(table_path(name, settings)))


def delta_table(name: str, settings: Settings | None = None) -> DeltaTable:
    try:
        return DeltaTable(str(table_path(name, settings)))
    except TableNotFoundError as exc:
        raise TableError(f"table {name} has not been written yet") from exc


def _native(settings: Settings) -> bool:
    return settings.table_format == "native"


def _check_native(spark: SparkSession) -> None:
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception as exc:  # py4j wraps ClassNotFoundException
        raise TableError(
            "table_format = 'native' needs the Delta Lake JARs on Spark's classpath "
            "(io.delta:delta-spark_2.13 and io.delta:delta-storage, version 4.x, e.g. "
            "spark.jars.packages on a cluster with Maven access); they are not there. "
            "Use table_format = 'delta-rs' (the default) to write Delta tables without them."
        ) from exc


def empty_frame(name: str, spark: SparkSession | None = None) -> DataFrame:
    spark = spark or get_spark()
    return spark.createDataFrame([], table_schema(name).struct)


# --------------------------------------------------------------------------------------- read


def read_table(
    name: str,
    version: int | None = None,
    timestamp: datetime | str | None = None,
    spark: SparkSession | None = None,
    settings: Settings | None = None,
) -> DataFrame:
    """The table as a DataFrame: latest, or as of a version or a timestamp (time travel).

    A table that has never been written reads as empty, with its schema.
    """
    settings = settings or get_settings()
    spark = spark or get_spark(settings)
    schema = table_schema(name)
    path = table_path(name, settings)
    if version is not None and timestamp is not None:
        raise TableError("give a version or a timestamp, not both")
    if _native(settings):
        _check_native(spark)
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        if timestamp is not None:
            reader = reader.option("timestampAsOf", str(timestamp))
        return reader.load(str(path)).select(*schema.column_names)
    if not DeltaTable.is_deltatable(str(path)):
        if version is not None or timestamp is not None:
            raise TableError(f"table {name} has not been written yet: no version to travel to")
        return empty_frame(name, spark)
    try:
        dt = DeltaTable(str(path))
        if version is not None:
            dt.load_as_version(version)
        elif timestamp is not None:
            dt.load_as_version(_as_datetime(timestamp))
    except (DeltaError, ValueError, OSError) as exc:
        raise TableError(f"cannot read {name} as of {version or timestamp}: {exc}") from exc
    files = dt.file_uris()
    if not files:
        return empty_frame(name, spark)
    return (
        spark.read.schema(schema.struct)
        .option("basePath", str(path))
        .parquet(*files)
        .select(*schema.column_names)
    )


def _as_datetime(value: datetime | str) -> datetime:
    stamp = datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


# -------------------------------------------------------------------------------------- write


def conform(df: DataFrame, schema: TableSchema) -> DataFrame:
    """Columns in schema order with schema types; a missing or unexpected column is an error."""
    have = set(df.columns)
    missing = [c for c in schema.column_names if c not in have]
    extra = [c for c in df.columns if c not in set(schema.column_names)]
    if missing or extra:
        raise TableError(
            f"DataFrame does not match schemas/tables/{schema.name}.yaml: "
            f"missing columns {missing}, unexpected columns {extra}"
        )
    return df.select(*[F.col(c.name).cast(c.spark_type).alias(c.name) for c in schema.columns])


def write_table(
    df: DataFrame,
    name: str,
    mode: WriteMode = "append",
    partitions: Iterable[PartitionSpec] | None = None,
    txn: tuple[str, int] | None = None,
    settings: Settings | None = None,
) -> WriteResult:
    """Write ``df`` to table ``name`` in one atomic commit.

    mode: ``append`` adds rows; ``overwrite`` replaces the whole table; ``replace`` replaces
    exactly the given ``partitions`` (e.g. ``[{"day": date(2026, 11, 21)}]``): rows of other
    partitions in ``df`` are an error, and a given partition with no rows ends up empty.
    txn: ``(app_id, version)``; if already committed, the write is skipped.
    """
    settings = settings or get_settings()
    schema = table_schema(name)
    frame = conform(df, schema)
    wanted = _partition_filters(schema, mode, partitions)
    if _native(settings):
        return _write_native(frame, schema, mode, wanted, txn, settings)

    root = table_path(name, settings)
    if txn is not None and _already_committed(root, txn):
        log.info("%s: transaction %s already committed, skipping", name, txn)
        return WriteResult(name, None, 0, 0, skipped=True)
    staging = root / STAGING / uuid.uuid4().hex
    try:
        writer = frame.write.mode("errorifexists")
        if schema.partition_by:
            writer = writer.partitionBy(*schema.partition_by)
        writer.parquet(str(staging))
        adds = _move_into_table(staging, root, schema, wanted)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        version = _commit(root, schema, mode, adds, wanted, txn, settings)
    except BaseException:
        for add in adds:  # never referenced by the log: safe to delete now
            (root / unquote(add.path)).unlink(missing_ok=True)
        raise
    rows = sum(json.loads(a.stats)["numRecords"] for a in adds)
    if version is None:
        return WriteResult(name, None, 0, 0, skipped=True)
    log.info("%s: committed version %s (%s rows, %s files, %s)", name, version, rows, len(adds), mode)
    return WriteResult(name, version, len(adds), rows)


def _partition_filters(
    schema: TableSchema, mode: WriteMode, partitions: Iterable[PartitionSpec] | None
) -> list[dict[str, str | None]] | None:
    if mode not in ("append", "overwrite", "replace"):
        raise TableError(f"unknown write mode {mode!r}")
    if mode != "replace":
        if partitions is not None:
            raise TableError("partitions are only given with mode='replace'")
        return None
    if not schema.partition_by:
        raise TableError(f"table {schema.name} is not partitioned: use mode='overwrite'")
    specs = list(partitions or [])
    if not specs:
        raise TableError("mode='replace' needs the partitions to replace")
    out = []
    for spec in specs:
        if set(spec) != set(schema.partition_by):
            raise TableError(
                f"partition {dict(spec)} must name exactly {list(schema.partition_by)}"
            )
        out.append({k: _partition_string(spec[k]) for k in schema.partition_by})
    return out


def _partition_string(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _move_into_table(
    staging: Path, root: Path, schema: TableSchema, wanted: list[dict] | None
) -> list[AddAction]:
    staged = []
    for file in sorted(staging.rglob("*.parquet")):
        rel = file.relative_to(staging)
        values: dict[str, str | None] = {}
        for part in rel.parts[:-1]:
            key, _, raw = part.partition("=")
            raw = unquote(raw)
            values[key] = None if raw == _HIVE_NULL else raw
        if wanted is not None and values not in wanted:
            raise TableError(
                f"{schema.name}: rows for partition {values} are outside the partitions "
                f"being replaced {wanted}"
            )
        staged.append((file, rel, values))
    adds = []
    for file, rel, values in staged:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
        stat = target.stat()
        adds.append(
            AddAction(
                # Delta paths are URIs: escape Spark's own %-escapes in partition folder names.
                path=quote(rel.as_posix(), safe='/='),
                size=stat.st_size,
                partition_values=values,
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps({"numRecords": pq.ParquetFile(target).metadata.num_rows}),
            )
        )
    return adds


def _already_committed(root: Path, txn: tuple[str, int]) -> bool:
    if not DeltaTable.is_deltatable(str(root)):
        return False
    done = DeltaTable(str(root)).transaction_version(txn[0])
    return done is not None and done >= txn[1]


def _commit(
    root: Path,
    schema: TableSchema,
    mode: WriteMode,
    adds: list[AddAction],
    wanted: list[dict] | None,
    txn: tuple[str, int] | None,
    settings: Settings,
) -> int | None:
    """Commit, retrying on a conflicting concurrent commit. None: txn already committed."""
    arrow_schema = to_arrow_schema(schema.struct)
    properties = CommitProperties(
        app_transactions=[Transaction(txn[0], txn[1], int(time.time() * 1000))] if txn else None,
        custom_metadata={"brokerlens.mode": mode},
    )
    delta_mode = "append" if mode == "append" else "overwrite"
    filters = None
    if wanted is not None:
        filters = [
            [(k, "=", v) if v is not None else (k, "=", None) for k, v in spec.items()]
            for spec in wanted
        ]
    attempts = max(1, settings.commit_retries)
    for attempt in range(1, attempts + 1):
        try:
            if not DeltaTable.is_deltatable(str(root)):
                try:
                    create_table_with_add_actions(
                        str(root),
                        DeltaSchema.from_arrow(arrow_schema),
                        adds,
                        mode="error",
                        partition_by=list(schema.partition_by) or None,
                        name=schema.name,
                        description=schema.description,
                        commit_properties=properties,
                    )
                    return 0
                except DeltaError as exc:
                    if not DeltaTable.is_deltatable(str(root)):
                        raise
                    log.info("%s: created concurrently (%s), committing into it", schema.name, exc)
            dt = DeltaTable(str(root))
            if txn is not None:
                done = dt.transaction_version(txn[0])
                if done is not None and done >= txn[1]:
                    return None
            kwargs = {}
            if filters is not None:
                kwargs["partition_filters"] = filters if len(filters) > 1 else filters[0]
            dt.create_write_transaction(
                adds,
                delta_mode,
                arrow_schema,
                partition_by=list(schema.partition_by) or None,
                commit_properties=properties,
                **kwargs,
            )
            dt.update_incremental()
            return dt.version()
        except CommitFailedError as exc:
            if attempt == attempts:
                raise TableError(
                    f"{schema.name}: commit still conflicting after {attempts} attempts: {exc}"
                ) from exc
            pause = min(5.0, 0.05 * 2**attempt) * (0.5 + random.random())
            log.info("%s: commit conflict (%s), retrying in %.2fs", schema.name, exc, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def _write_native(
    frame: DataFrame,
    schema: TableSchema,
    mode: WriteMode,
    wanted: list[dict] | None,
    txn: tuple[str, int] | None,
    settings: Settings,
) -> WriteResult:
    _check_native(frame.sparkSession)
    writer = frame.write.format("delta").mode("append" if mode == "append" else "overwrite")
    if schema.partition_by:
        writer = writer.partitionBy(*schema.partition_by)
    if wanted is not None:
        clauses = [
            " AND ".join(
                f"{k} IS NULL" if v is None else f"{k} = '{v}'" for k, v in spec.items()
            )
            for spec in wanted
        ]
        writer = writer.option("replaceWhere", " OR ".join(f"({c})" for c in clauses))
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
    path = table_path(schema.name, settings)
    writer.save(str(path))
    version = DeltaTable(str(path)).version()
    return WriteResult(schema.name, version, -1, -1)


# ------------------------------------------------------------------------------ catalogue


def register_tables(spark: SparkSession | None = None, settings: Settings | None = None) -> list[str]:
    """Register every table in ``schemas/`` as a temporary view by its name.

    Tables not written yet are registered empty, so queries over them return no rows
    instead of failing.
    """
    settings = settings or get_settings()
    spark = spark or get_spark(settings)
    names = sorted(table_schemas())
    for name in names:
        read_table(name, spark=spark, settings=settings).createOrReplaceTempView(name)
    return names


@dataclass(frozen=True)
class TableInfo:
    name: str
    layer: str
    description: str
    version: int | None
    columns: list[tuple[str, str, str]]


def describe_tables(settings: Settings | None = None) -> list[TableInfo]:
    settings = settings or get_settings()
    out = []
    for name, schema in sorted(table_schemas().items()):
        path = table_path(name, settings)
        version = DeltaTable(str(path)).version() if DeltaTable.is_deltatable(str(path)) else None
        out.append(
            TableInfo(
                name,
                schema.layer,
                schema.description,
                version,
                [(c.name, c.type, c.description) for c in schema.columns],
            )
        )
    return out


def vacuum(
    name: str, retention_hours: int = 168, dry_run: bool = False, settings: Settings | None = None
) -> list[str]:
    """Delete files no version within the retention references, including orphans of
    killed writes (``full`` vacuum), and stale staging folders."""
    settings = settings or get_settings()
    root = table_path(name, settings)
    if not DeltaTable.is_deltatable(str(root)):
        return []
    dt = DeltaTable(str(root))
    removed = dt.vacuum(
        retention_hours=retention_hours,
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=True,
    )
    cutoff = time.time() - retention_hours * 3600
    staging = root / STAGING
    for folder in staging.iterdir() if staging.is_dir() else []:
        if folder.stat().st_mtime < cutoff:
            removed.append(str(folder))
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)
    return removed
