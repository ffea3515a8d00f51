"""Record checks shared by the landing parsers, as Spark column expressions.

The checks see a JSON object as a :class:`JsonObject`: per field, is it there, its text, its
typed value (null when the JSON holds another type: a wrong type). A JSON-lines record is parsed
as ``map<string,string>`` (which keys are present, with their text) and into a typed struct
(:func:`with_object`); a stats document is parsed once into a ``VARIANT`` whose fields are read
by their JSON type (:func:`variant_object`). Each check yields ``(priority, condition, reason,
detail)``; a record's problem is the first condition that holds, in priority order, so one
record gets one clear reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# Reason codes (schemas/tables/quarantine.yaml), in the order a record is judged.
MALFORMED_JSON = "malformed-json"
MALFORMED_LINE = "malformed-line"
MISSING_FIELD = "missing-field"
WRONG_TYPE = "wrong-type"
UNKNOWN_ENUM = "unknown-enum"
NEGATIVE_COUNTER = "negative-counter"
OUTSIDE_DAY = "outside-day"
DUPLICATE = "duplicate"
UNREADABLE_FILE = "unreadable-file"
PRIORITY = [MALFORMED_JSON, MALFORMED_LINE, MISSING_FIELD, WRONG_TYPE, UNKNOWN_ENUM, NEGATIVE_COUNTER, OUTSIDE_DAY, DUPLICATE]

RAW_LIMIT = 64 * 1024  # quarantine.raw is truncated to 64 KiB
# Repeated records (hash, first file and line: ~150 bytes each) broadcast to the duplicate
# check's join up to this many: ~150 MB at most on the driver and each executor.
BROADCAST_REPEATS = 1_000_000


@dataclass(frozen=True)
class Field:
    """One key of a JSON object, by its Pulsar name."""

    key: str
    type: str = "string"
    required: bool = False
    counter: bool = False  # a negative value is a bad record
    enum: tuple[str, ...] = ()
    in_day: bool = False  # a timestamp that must lie within the landing day
    column: str | None = None

    @property
    def name(self) -> str:
        return self.column or snake(self.key)


def snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def struct_ddl(fields: tuple[Field, ...]) -> str:
    return ", ".join(f"`{f.key}` {f.type}" for f in fields)


INTEGRAL = ("bigint", "int")
# Spark renders a JSON number as map<string,string> value in plain or scientific notation.
_DECIMAL = r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$"


def with_object(frame: DataFrame, text: Column, fields: tuple[Field, ...], keys: str, typed: str, applies: Column | None = None) -> DataFrame:
    """``frame`` with the JSON object ``text`` parsed (where ``applies``) into columns ``keys``
    (its present keys, map<string,string>) and ``typed`` (a struct of ``fields``).

    A whole number written with a fraction or in scientific notation (``1.2E7``, ``800.0``, as JSON
    re-serialised by some tools) is that number; Spark's JSON reader leaves it null for an
    integer field. A fraction that is not whole stays a wrong type.

    The two parses are columns of their own, a projection before the one that reads the fields
    from them. Written as one expression, with the parses repeated in each field's value, Spark
    did not share them all (it generates no code for ``from_json``, so that projection is not
    part of the stage's generated code): 40,822 dispatch lines took 2.5 to 3.2 s to parse into
    both instead of 1.0 to 1.2 s.
    """

    def where(parsed: Column) -> Column:
        return parsed if applies is None else F.when(applies, parsed)

    frame = frame.withColumns({keys: where(F.from_json(text, "map<string,string>")), typed: where(F.from_json(text, struct_ddl(fields)))})
    if not any(f.type in INTEGRAL for f in fields):
        return frame
    k, t = F.col(keys), F.col(typed)

    def value(f: Field) -> Column:
        if f.type not in INTEGRAL:
            return t[f.key]
        number = F.when(k[f.key].rlike(_DECIMAL), k[f.key].try_cast("double"))
        return F.coalesce(t[f.key], F.when(number == F.floor(number), number.cast(f.type)))

    return frame.withColumn(typed, F.when(t.isNotNull(), F.struct(*[value(f).alias(f.key) for f in fields])))


@dataclass(frozen=True)
class JsonObject:
    """How the checks read a JSON object, per :class:`Field`: is the key there (and not null),
    its text (for a problem's detail), its typed value (null for a value of another type)."""

    present: Callable[[Field], Column]
    text: Callable[[Field], Column]
    value: Callable[[Field], Column]


def map_object(keys: Column, typed: Column) -> JsonObject:
    """The object of :func:`with_object`'s (present keys, typed struct)."""
    return JsonObject(lambda f: keys[f.key].isNotNull(), lambda f: keys[f.key], lambda f: typed[f.key])


# A VARIANT's JSON types (schema_of_variant) that each field type accepts, as with_object does:
# whole numbers for integers (also written 800.0, 1.2E7 or "123"), any number or NaN/Infinity for
# a double, true/false for a boolean, a string or whole number (epoch seconds) for a timestamp.
_INTEGRAL_JSON = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_FRACTIONAL_JSON = ("FLOAT", "DOUBLE")
_NON_NUMBERS = ("NaN", "+NaN", "-NaN", "Infinity", "+Infinity", "-Infinity", "INF", "+INF", "-INF")
_SCALARS = (*INTEGRAL, "double", "boolean", "timestamp", "string")
# Each field of a stats object is looked up once (variant_fields), not once per check: every
# lookup copies the object's bytes out of the row and rebuilds the value it returns (a topic's
# stats, 8 KB, were rebuilt about six times per envelope). Scalars come out as their own VARIANT,
# typed by their JSON type after; containers whose members are read again by field as VARIANTs;
# the other containers are only checked (an object, an array) and counted, as empty structs.
_MEMBER_CONTAINERS = {"map<string,string>": "map<string,variant>", "array<string>": "array<variant>"}
_SHAPE_CONTAINERS = {"map<string,string>": "struct<>", "array<string>": "array<struct<>>"}


def _path(f: Field) -> str:
    return f"$.{f.key}"


def variant_fields(v: Column, fields: tuple[Field, ...], members: tuple[str, ...] = ()) -> Column:
    """The ``fields`` of the VARIANT object ``v``, looked up in one pass (materialise it once,
    then :func:`typed_variant` and :func:`variant_object`); ``members``: the keys of the
    containers whose members are read. A value of another JSON type nulls only its own field."""

    def read_as(f: Field) -> str:
        if f.type in _SCALARS:
            return "variant"
        return (_MEMBER_CONTAINERS if f.key in members else _SHAPE_CONTAINERS).get(f.type, f.type)

    return F.try_variant_get(v, "$", f"struct<{','.join(f'`{f.key}`:{read_as(f)}' for f in fields)}>")


def variant_value(value: Column, f: Field) -> Column:
    """``f``'s typed value from its :func:`variant_fields` entry; null when absent or of
    another JSON type.

    ``try_variant_get`` alone would cast like SQL's CAST (the string ``"123"`` to 123, 1.5 to 1):
    the value's own JSON type is checked first, so that a wrong type is one, as from_json has it.
    """
    if f.type not in _SCALARS:
        return value
    if f.type == "string":
        return F.try_variant_get(value, "$", "string")
    json_type = F.schema_of_variant(value)
    integral = json_type.isin(*_INTEGRAL_JSON)
    number = integral | json_type.isin(*_FRACTIONAL_JSON) | json_type.startswith("DECIMAL")
    as_double = F.try_variant_get(value, "$", "double")
    if f.type in INTEGRAL:
        # As with_object reads them: a string holding a whole number (as protobuf's JSON writes
        # 64-bit integers) is that number too.
        number_text = (json_type == "STRING") & F.try_variant_get(value, "$", "string").rlike(_DECIMAL)
        return F.when(integral, F.try_variant_get(value, "$", f.type)).when(
            (number | number_text) & (as_double == F.floor(as_double)), as_double.try_cast(f.type)
        )
    if f.type == "double":
        return F.when(number | ((json_type == "STRING") & F.try_variant_get(value, "$", "string").isin(*_NON_NUMBERS)), as_double)
    if f.type == "boolean":
        return F.when(json_type == "BOOLEAN", F.try_variant_get(value, "$", "boolean"))
    return F.when(integral | (json_type == "STRING"), F.try_variant_get(value, "$", "timestamp"))


def typed_variant(values: Column, fields: tuple[Field, ...]) -> Column:
    """The typed struct of a :func:`variant_fields` column, null where it is (materialise it once too)."""
    return F.when(values.isNotNull(), F.struct(*[variant_value(values[f.key], f).alias(f.key) for f in fields]))


def variant_object(v: Column, values: Column, typed: Column) -> JsonObject:
    """The checks' view of the VARIANT object ``v``, its :func:`variant_fields` ``values`` and
    their :func:`typed_variant` ``typed``. A container of another type is null in ``values``:
    only then is ``v`` looked up again, to tell a wrong type from an absent key."""

    def present(f: Field) -> Column:
        if f.type in _SCALARS:
            return has_value(values[f.key])
        return typed[f.key].isNotNull() | has_value(F.variant_get(v, _path(f), "variant"))

    def text(f: Field) -> Column:
        return F.try_variant_get(values[f.key] if f.type in _SCALARS else F.variant_get(v, _path(f), "variant"), "$", "string")

    return JsonObject(present, text, lambda f: typed[f.key])


def has_value(v: Column) -> Column:
    """A VARIANT that is there and not JSON ``null`` (as a key whose value is null is absent)."""
    return v.isNotNull() & ~F.is_variant_null(v)


def is_json_object(v: Column) -> Column:
    # An object casts to the empty struct; anything else does not.
    return F.try_variant_get(v, "$", "struct<>").isNotNull()


def typed_columns(typed: Column, fields: tuple[Field, ...]) -> list[Column]:
    return [typed[f.key].alias(f.name) for f in fields]


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=timezone.utc)
    return start, start + timedelta(days=1)


def field_problems(obj: JsonObject, fields: tuple[Field, ...], day: date, where: str = "") -> list[tuple[int, Column, str, Column]]:
    start, end = day_bounds(day)
    out = []
    for f in fields:
        label = f"{where}{f.key}"
        present = obj.present(f)
        value = obj.value(f)
        if f.required:
            out.append((PRIORITY.index(MISSING_FIELD), ~present, MISSING_FIELD, F.lit(f"{label} is missing")))
        out.append(
            (
                PRIORITY.index(WRONG_TYPE),
                present & value.isNull(),
                WRONG_TYPE,
                F.concat(F.lit(f"{label} should be {f.type}, got "), F.substring(obj.text(f), 1, 200)),
            )
        )
        if f.enum:
            out.append(
                (
                    PRIORITY.index(UNKNOWN_ENUM),
                    value.isNotNull() & ~value.isin(*f.enum),
                    UNKNOWN_ENUM,
                    F.concat(F.lit(f"{label} {{"), value, F.lit(f"}} is not one of {', '.join(f.enum)}")),
                )
            )
        if f.counter:
            out.append(
                (
                    PRIORITY.index(NEGATIVE_COUNTER),
                    value < 0,
                    NEGATIVE_COUNTER,
                    F.concat(F.lit(f"{label} is negative: "), value.cast("string")),
                )
            )
        if f.in_day:
            out.append(
                (
                    PRIORITY.index(OUTSIDE_DAY),
                    (value < F.lit(start)) | (value >= F.lit(end)),
                    OUTSIDE_DAY,
                    F.concat(F.lit(f"{label} "), F.date_format(value, "yyyy-MM-dd'T'HH:mm:ss'Z'"), F.lit(f" is not on {day.isoformat()}")),
                )
            )
    return out


def json_problems(valid: Column, is_object: Column, where: str = "") -> list[tuple[int, Column, str, Column]]:
    """Not JSON at all, or JSON but not an object."""
    return [
        (PRIORITY.index(MALFORMED_JSON), ~valid, MALFORMED_JSON, F.lit(f"{where}not valid JSON")),
        (PRIORITY.index(MALFORMED_JSON), ~is_object, MALFORMED_JSON, F.lit(f"{where}not a JSON object")),
    ]


def malformed_json(text: Column, keys: Column, where: str = "") -> list[tuple[int, Column, str, Column]]:
    """:func:`json_problems` of a text parsed by :func:`with_object` into ``keys``."""
    return json_problems(F.try_parse_json(text).isNotNull(), keys.isNotNull(), where)


def member_problems(v: Column) -> list[tuple[int, Column, str, Column]]:
    """:func:`json_problems` of a VARIANT member of a parent object (a partition's stats, a
    subscription) that must be an object: a string member is judged by its text, as the JSON it
    would hold."""
    is_object = is_json_object(v)  # first: schema_of_variant would walk a whole object
    as_text = F.try_parse_json(F.try_variant_get(v, "$", "string"))
    valid = is_object | F.when(F.schema_of_variant(v) == "STRING", as_text.isNotNull()).otherwise(has_value(v))
    return json_problems(valid, is_object)


def first_problem(problems: list[tuple[int, Column, str, Column]]) -> Column:
    """struct(reason, detail) of the first problem that holds, or null."""
    ordered = sorted(problems, key=lambda p: p[0])
    return F.coalesce(
        *[F.when(cond, F.struct(F.lit(reason).alias("reason"), detail.alias("detail"))) for _, cond, reason, detail in ordered],
        F.lit(None).cast("struct<reason:string,detail:string>"),
    )


def mark_duplicates(records: DataFrame, within_file: bool = False) -> DataFrame:
    """Add ``duplicate_of`` (file:line of the first copy) to records whose raw text repeats.

    Only hashes and positions are shuffled, never the records: the repeated hashes are found
    first (one Spark job). Most days have none, and then the records are not joined at all;
    otherwise the repeats are broadcast to the records when few, joined by a shuffle when not.
    """
    scope = ["source_file"] if within_file else []
    keyed = records.withColumn("_hash", F.sha2("raw", 256))
    position = F.struct(F.col("source_file"), F.coalesce(F.col("line"), F.lit(0)).alias("line"))
    first = (
        keyed.select(*scope, "_hash", position.alias("_pos"))
        .groupBy(*scope, "_hash")
        .agg(F.min("_pos").alias("_first"), F.count("*").alias("_n"))
        .where("_n > 1")
        .drop("_n")
    )
    repeated = first.count()
    if repeated == 0:
        return records.withColumn("duplicate_of", F.lit(None).cast("string"))
    joined = keyed.join(F.broadcast(first) if repeated <= BROADCAST_REPEATS else first, [*scope, "_hash"], "left")
    is_copy = F.col("_first").isNotNull() & (
        (F.col("_first.source_file") != F.col("source_file")) | (F.col("_first.line") != F.coalesce(F.col("line"), F.lit(0)))
    )
    where = F.when(F.col("_first.line") > 0, F.concat(F.lit(":"), F.col("_first.line").cast("string"))).otherwise(F.lit(""))
    return joined.withColumn("duplicate_of", F.when(is_copy, F.concat(F.col("_first.source_file"), where))).drop("_hash", "_first")


def duplicate_problem() -> tuple[int, Column, str, Column]:
    return (
        PRIORITY.index(DUPLICATE),
        F.col("duplicate_of").isNotNull(),
        DUPLICATE,
        F.concat(F.lit("exact copy of "), F.col("duplicate_of")),
    )


def quarantine_frame(bad: DataFrame, day: date, kind: str) -> DataFrame:
    """Quarantine rows from a frame with source_file, line, raw, ingested_at, problem."""
    return bad.select(
        F.lit(day).alias("day"),
        F.lit("land").alias("stage"),
        F.lit(kind).alias("kind"),
        "source_file",
        F.col("line").cast("int").alias("line"),
        F.col("problem.reason").alias("reason"),
        F.col("problem.detail").alias("detail"),
        F.substring("raw", 1, RAW_LIMIT).alias("raw"),
        "ingested_at",
    )
