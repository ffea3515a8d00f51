"""Tables by name and their upkeep: every table registered in Spark's session catalog
(``CREATE TABLE … USING delta LOCATION …``), what ``brokerlens tables`` lists, and Delta's
``VACUUM`` for ``brokerlens vacuum``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import partial

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from .schemas import table_schemas
from .settings import PlatformSettings
from .spark import in_parallel
from .tables import TableError, ensure_table, table_exists, table_location, table_version


def register_tables(spark: SparkSession, settings: PlatformSettings) -> list[str]:
    """Make every table in ``schemas/`` known to Spark SQL by its name, in the session catalog
    (``CREATE TABLE … USING delta LOCATION …``): ``DESCRIBE HISTORY``, ``VERSION AS OF``,
    ``DESCRIBE DETAIL``, ``OPTIMIZE``, ``VACUUM`` and ``MERGE`` then work by name.

    Registered at session start rather than kept in a persistent metastore: the lake's folders
    are the truth, several processes (Airflow steps, backfill days, a user's notebook) use them
    at once, which an embedded Derby metastore does not allow, and a lake moved or restored
    needs no catalogue repair. A table never written is created empty with its schema first, so
    every name exists and ``DESCRIBE TABLE`` shows the column descriptions.
    """
    names = sorted(table_schemas())
    registered = _registered.setdefault(id(spark), {})
    locations = {name: table_location(name, settings) for name in names}
    missing = [name for name in names if not (registered.get(name) == locations[name] and spark.catalog.tableExists(name))]
    # Each empty table is a Delta commit of its own, a quarter of a second of driver work and
    # file system waits: a new lake's 22 took 5.8 s one after the other.
    list(in_parallel(spark, [partial(ensure_table, name, spark, settings) for name in missing]))
    for name in missing:
        spark.sql(f"DROP TABLE IF EXISTS `{name}`")  # an external table: its data stays
        spark.sql(f"CREATE TABLE `{name}` USING delta LOCATION '{locations[name]}'")
        registered[name] = locations[name]
    return names


# Per session: the location each name was registered with (a test or a CLI call may move the lake).
_registered: dict[int, dict[str, str]] = {}


@dataclass(frozen=True)
class TableInfo:
    name: str
    layer: str
    description: str
    version: int | None
    columns: list[tuple[str, str, str]]


def describe_tables(spark: SparkSession, settings: PlatformSettings, names: Collection[str] = ()) -> list[TableInfo]:
    """The tables named (every table when none is), by name: each one's latest version is a
    ``DESCRIBE HISTORY`` of its own, so only those asked for are read."""
    return [
        TableInfo(
            name,
            schema.layer,
            schema.description,
            table_version(name, settings, spark),
            [(c.name, c.type, c.description) for c in schema.columns],
        )
        for name, schema in sorted(table_schemas().items())
        if not names or name in names
    ]


def vacuum(spark: SparkSession, name: str, settings: PlatformSettings, dry_run: bool = False) -> list[str]:
    """Delta's ``VACUUM``: delete files that no version younger than the table's retention
    (``delta.deletedFileRetentionDuration``, 7 days unless changed with ``ALTER TABLE … SET
    TBLPROPERTIES``) references, including files of writes killed before their commit. Delta's
    retention check stays on. Returns the files deleted (or, dry, that would be)."""
    if not table_exists(name, settings, spark):
        return []
    statement = f"VACUUM delta.`{table_location(name, settings)}`"
    try:
        # The files VACUUM deletes are those its dry run lists (it returns only the table's path).
        doomed = sorted(r[0] for r in spark.sql(statement + " DRY RUN").collect())
        if doomed and not dry_run:
            spark.sql(statement).collect()
        return doomed
    except AnalysisException as exc:
        raise TableError(f"{name}: vacuum failed: {str(exc).splitlines()[0]}") from exc
