"""Timestamps between Python and Spark, whatever the time zone of the process, the JVM or the session.

A Spark TIMESTAMP is an instant (microseconds since the epoch). PySpark's ``collect()`` hands it
back as a *naive* datetime in the Python process's zone (``TZ``), so a printer that takes it for
UTC is off by the zone's offset; Arrow-less ``toPandas()`` does the same, and Arrow ``toPandas()``
localises to ``spark.sql.session.timeZone`` instead. Arrow batches carry the instant itself,
tagged UTC, so every row that leaves Spark for a person or a program goes through :func:`collect`:
each TIMESTAMP (in structs, arrays and maps too) an aware UTC datetime, whatever the zones. A
TIMESTAMP_NTZ has no zone and stays the naive wall time it holds. Printers then write instants
with :func:`iso` or :func:`minute`, which say UTC. The other way, brokerlens gives Spark aware
datetimes only: a naive one given to ``createDataFrame`` or ``lit`` is read in the process's zone
(given to :func:`brokerlens.platform.frames.rows_frame`, as UTC).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import DataType


def collect(df: DataFrame) -> list[Row]:
    """``df.collect()``, with every TIMESTAMP an aware UTC datetime."""
    import pyarrow as pa
    from pyspark.sql import Row

    try:
        table = df.toArrow()
    except pa.ArrowInvalid:
        # Arrow refuses a null under a field Spark declares non-nullable, and some commands'
        # results carry them (DESCRIBE HISTORY's operationMetrics of an OPTIMIZE): all-nullable.
        df = df.to(_nullable(df.schema))
        table = df.toArrow()
    fields = df.schema.fields
    make = Row(*[f.name for f in fields])
    columns = [list(map(_converter(f.dataType), table.column(i).to_pylist())) for i, f in enumerate(fields)]
    return [make(*values) for values in zip(*columns)]


def first(df: DataFrame) -> Row | None:
    """``df.first()``, with every TIMESTAMP an aware UTC datetime."""
    rows = collect(df.limit(1))
    return rows[0] if rows else None


def _nullable(kind: DataType) -> Any:
    """``kind`` with every field, array element and map value nullable, at every depth."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(kind, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in kind.fields])
    if isinstance(kind, ArrayType):
        return ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, MapType):
        return MapType(_nullable(kind.keyType), _nullable(kind.valueType), True)
    return kind


def _converter(kind: DataType) -> Callable[[Any], Any]:
    """Arrow's Python value of a Spark type as ``collect()`` gives it (structs as Rows, maps as dicts)."""
    # Imported here: the command line's start-up (logs) uses this module without Spark.
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

    if isinstance(kind, TimestampType):
        convert = lambda v: v.astimezone(timezone.utc)  # noqa: E731
    elif isinstance(kind, StructType):
        make, parts = Row(*kind.names), [(f.name, _converter(f.dataType)) for f in kind.fields]
        convert = lambda v: make(*[c(v[name]) for name, c in parts])  # noqa: E731
    elif isinstance(kind, ArrayType):
        element = _converter(kind.elementType)
        convert = lambda v: [element(e) for e in v]  # noqa: E731
    elif isinstance(kind, MapType):
        key, value = _converter(kind.keyType), _converter(kind.valueType)
        convert = lambda v: {key(k): value(e) for k, e in v}  # noqa: E731
    else:
        return lambda v: v
    return lambda v: None if v is None else convert(v)


def utc(value: datetime) -> datetime:
    """An aware datetime in UTC; a naive one is refused rather than guessed at."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value.isoformat()}: its zone is unknown")
    return value.astimezone(timezone.utc)


def iso(value: datetime) -> str:
    """An instant as ISO 8601 in UTC, ``2026-11-21T11:40:22Z``; a naive TIMESTAMP_NTZ as it is."""
    if value.tzinfo is None:
        return value.isoformat()
    return utc(value).isoformat().replace("+00:00", "Z")


def json_default(value: Any) -> str:
    """``json.dumps(default=...)``: instants by :func:`iso`, anything else (days) as text."""
    return iso(value) if isinstance(value, datetime) else str(value)


def minute(value: datetime | None, missing: str = "n/a", zone: str = " UTC") -> str:
    """An instant to the minute for people, ``2026-11-21 11:40 UTC`` (``zone=""`` under a heading
    that says UTC)."""
    return missing if value is None else utc(value).strftime("%Y-%m-%d %H:%M") + zone
