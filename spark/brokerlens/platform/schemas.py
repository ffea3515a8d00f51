"""Table schemas, read from the package's ``schemas/`` folder: the repository's top-level
``schemas/`` (the single source), linked into the package in a checkout and copied into the wheel.

One YAML file per table under ``schemas/tables/``::

    name: quarantine
    layer: bronze
    description: one line a user sees in `brokerlens tables`
    partition_by: [day]
    columns:
      - {name: day, type: date, nullable: false, description: ...}

Types are Spark SQL type names: string, int, bigint, double, boolean, date, timestamp,
array<T>, map<K,V>.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pyspark.sql import types as T

_PRIMITIVES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "int": T.IntegerType(),
    "integer": T.IntegerType(),
    "bigint": T.LongType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "float": T.FloatType(),
    "boolean": T.BooleanType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
    "binary": T.BinaryType(),
}


class SchemaError(ValueError):
    pass


def package_data(folder: str) -> Path:
    """A data folder shipped in the package (``schemas``, ``expectations``). The package is
    installed as files, never zipped, so the resource is a real folder."""
    return Path(str(resources.files("brokerlens") / folder))


def schemas_dir() -> Path:
    explicit = os.environ.get("BROKERLENS_SCHEMAS_DIR")
    return Path(explicit) if explicit else package_data("schemas")


def parse_type(text: str) -> T.DataType:
    text = text.strip()
    lowered = text.lower()
    if lowered in _PRIMITIVES:
        return _PRIMITIVES[lowered]
    if lowered.startswith("array<") and lowered.endswith(">"):
        return T.ArrayType(parse_type(text[6:-1]), containsNull=True)
    if lowered.startswith("map<") and lowered.endswith(">"):
        inner = text[4:-1]
        depth = 0
        for i, ch in enumerate(inner):
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "," and depth == 0:
                return T.MapType(parse_type(inner[:i]), parse_type(inner[i + 1 :]), True)
    if lowered.startswith("decimal(") and lowered.endswith(")"):
        precision, scale = (int(x) for x in lowered[8:-1].split(","))
        return T.DecimalType(precision, scale)
    raise SchemaError(f"unknown column type {text!r}")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool = True
    description: str = ""

    @property
    def spark_type(self) -> T.DataType:
        return parse_type(self.type)


@dataclass(frozen=True)
class TableSchema:
    name: str
    layer: str
    description: str
    columns: tuple[Column, ...]
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = field(default=())

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def struct(self) -> T.StructType:
        return T.StructType([T.StructField(c.name, c.spark_type, c.nullable) for c in self.columns])

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise SchemaError(f"table {self.name} has no column {name!r}")


def _load(path: Path) -> TableSchema:
    # libyaml's parser where PyYAML has it (its wheels do): every stage's process loads them all.
    doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    try:
        columns = tuple(Column(**c) for c in doc["columns"])
        schema = TableSchema(
            name=doc["name"],
            layer=doc["layer"],
            description=doc.get("description", ""),
            columns=columns,
            partition_by=tuple(doc.get("partition_by") or ()),
            key=tuple(doc.get("key") or ()),
        )
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"{path}: malformed schema file ({exc})") from exc
    if schema.name != path.stem:
        raise SchemaError(f"{path}: name {schema.name!r} does not match the file name")
    for col in [*schema.partition_by, *schema.key]:
        schema.column(col)
    for column in schema.columns:
        parse_type(column.type)  # fail early on a bad type name
    return schema


@lru_cache(maxsize=1)
def table_schemas() -> dict[str, TableSchema]:
    folder = schemas_dir() / "tables"
    if not folder.is_dir():
        raise SchemaError(f"schema folder {folder} not found (set BROKERLENS_SCHEMAS_DIR)")
    return {s.name: s for s in map(_load, sorted(folder.glob("*.yaml")))}


def table_schema(name: str) -> TableSchema:
    schemas = table_schemas()
    if name not in schemas:
        raise SchemaError(f"unknown table {name!r}; known tables: {', '.join(sorted(schemas))}")
    return schemas[name]
