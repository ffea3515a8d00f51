"""The envelope around Pulsar's own stats JSON (topic-stats, internal-stats).

A file holds one envelope or a JSON array of envelopes::

    {"collected_at": ..., "cluster": ..., "broker": ..., "topic": ..., "stats": {...verbatim...}}

``stats`` is a topic's stats, or a partitioned topic's (``partitioned-stats --per-partition``,
``PartitionedTopicInternalStats``) whose ``partitions`` map holds each partition's stats: those
become one row per partition. Partitioned stats without per-partition detail stay one row for
the partitioned topic.
"""

from __future__ import annotations

import json
from datetime import date
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerlens.platform.jars import STATS_ROWS_FUNCTION

from .checks import (
    MALFORMED_JSON,
    PRIORITY,
    Field,
    day_bounds,
    duplicate_problem,
    field_problems,
    first_problem,
    is_json_object,
    json_problems,
    mark_duplicates,
    member_problems,
    typed_variant,
    variant_fields,
    variant_object,
)

FIELDS = (
    Field("collected_at", "timestamp", required=True, in_day=True),
    Field("cluster", required=True),
    Field("broker"),
    Field("topic", required=True),
    Field("stats", "map<string,string>", required=True),
)
_PARTITION_SUFFIX = r"-partition-[0-9]+$"
# Each row's envelope: its record (position in the file) and a 64-bit hash of its text. Two
# envelopes of one hash only send their kind through the exact duplicate check (has_copies).
ENVELOPE = "_envelope"


def _text_type(children: str, verbatim: tuple[str, ...]) -> str:
    """A topic's stats as text where it is kept as Pulsar wrote it (key order, number text):
    its children (``subscriptions``, ``cursors``) by name, and the ``verbatim`` keys."""
    return f"struct<`{children}`:map<string,string>{''.join(f',`{k}`:string' for k in verbatim)}>"


def explode_envelopes(records: DataFrame, day: date, children: str, verbatim: tuple[str, ...] = (), duplicates: bool = True) -> DataFrame:
    """Rows: source_file, line (null), record, raw (the envelope's text), ingested_at, problem,
    collected_at, cluster, broker, topic (per partition), partitioned_topic, ``_in_partitions``
    (the row is a member of a ``partitions`` map), ``_stats`` (that topic's stats, a VARIANT)
    and ``_text`` (its children and ``verbatim`` keys as text, :func:`_text_type`), and
    ``ENVELOPE`` (record and text hash of the envelope the row comes from). A bad envelope is one
    row with its problem and no stats. Without ``duplicates``, no envelope is judged a copy of
    another: :func:`has_copies` tells afterwards whether that was right.

    Each envelope is parsed once into a VARIANT, which the checks and typed reads use; its text
    is parsed once more, for the pieces kept as Pulsar wrote them.
    """
    # A single envelope is read as an array of one, so that every envelope's text is Jackson's
    # compact rendering and an exact copy is found whichever way the files were written.
    is_array = F.ltrim("raw").startswith("[")
    elements = F.from_json(F.when(is_array, F.col("raw")).otherwise(F.concat(F.lit("["), "raw", F.lit("]"))), "array<string>")
    # The file's text is kept only where no envelope holds it (not an array of JSON values, or an
    # empty one: the quarantine row's raw). On every envelope row it multiplied a file's size
    # by its envelopes, through the duplicate check's shuffle too.
    parsed = records.withColumn("_elements", elements)  # parsed once, used three times below
    whole = parsed.select(
        "source_file",
        "ingested_at",
        F.when(F.coalesce(F.size("_elements"), F.lit(0)) == 0, F.col("raw")).alias("_file_text"),
        F.when(F.col("_elements").isNull(), F.lit(True)).alias("_bad_array"),
        F.posexplode_outer("_elements").alias("_pos", "raw"),
    )
    # mark_duplicates orders copies by (source_file, line): use the record number meanwhile.
    whole = whole.withColumn("line", (F.col("_pos") + 1).cast("int"))
    whole = mark_duplicates(whole) if duplicates else whole.withColumn("duplicate_of", F.lit(None).cast("string"))
    whole = whole.withColumnRenamed("line", "record").withColumn("line", F.lit(None).cast("int"))
    whole = whole.withColumn(ENVELOPE, F.struct(F.col("record").alias("record"), F.when(F.col("raw").isNotNull(), F.xxhash64("raw")).alias("hash")))
    env = whole.withColumn("_env", F.try_parse_json("raw"))
    env = env.withColumn("_f", variant_fields(F.col("_env"), FIELDS))
    env = env.withColumn("_t", typed_variant(F.col("_f"), FIELDS))
    t = F.col("_t")
    where = F.when(F.col("record") > 1, F.concat(F.lit("record "), F.col("record").cast("string"), F.lit(": "))).otherwise(F.lit(""))
    problems = [
        (PRIORITY.index(MALFORMED_JSON), F.col("_bad_array").isNotNull(), MALFORMED_JSON, F.lit("not valid JSON (an envelope or an array of envelopes)")),
        *json_problems(F.col("_env").isNotNull(), is_json_object(F.col("_env"))),
        *field_problems(variant_object(F.col("_env"), F.col("_f"), t), FIELDS, day),
        duplicate_problem(),
    ]
    env = _with_problem(env, "problem", problems, where).withColumn("raw", F.coalesce("raw", "_file_text"))
    good = F.col("problem").isNull()
    text_type = _text_type(children, verbatim)
    member = f"struct<stats:variant,text:{text_type}>"
    texts = F.from_json("raw", f"struct<stats:{text_type}>")["stats"]
    env = env.withColumn("_partitions", F.when(good, F.try_variant_get("_env", "$.stats.partitions", "map<string,variant>")))
    partitioned = F.size("_partitions") > 0
    # The partitions' text as one map; one partition that is not an object nulls that map, and
    # then each partition's text is read on its own. (Never null: a partition without its text
    # still lands.)
    partition_texts = F.coalesce(
        F.from_json("raw", f"struct<stats:struct<partitions:map<string,{text_type}>>>")["stats"]["partitions"],
        F.transform_values(_partitions_text(), lambda _, text: F.from_json(text, text_type)),
        F.create_map().cast(f"map<string,{text_type}>"),
    )
    per_partition = (
        F.when(partitioned, F.map_zip_with("_partitions", partition_texts, lambda _, stats, text: F.struct(stats.alias("stats"), text.alias("text"))))
        .when(good, F.create_map(t["topic"], F.struct(F.variant_get("_env", "$.stats", "variant").alias("stats"), texts.alias("text"))))
        # A bad envelope stays one row (its topic may be missing: a placeholder key, nulled below).
        .otherwise(F.create_map(F.lit(""), F.lit(None).cast(member)))
    )
    topic = t["topic"]
    exploded = env.select(
        "source_file",
        "line",
        "record",
        ENVELOPE,
        "raw",
        "ingested_at",
        "problem",
        t["collected_at"].alias("collected_at"),
        t["cluster"].alias("cluster"),
        t["broker"].alias("broker"),
        F.when(partitioned, topic).alias("_partitioned"),
        F.explode(per_partition).alias("topic", "_member"),
    )
    exploded = exploded.withColumns(
        {
            "topic": F.when(F.col("problem").isNull(), F.col("topic")),
            "_in_partitions": F.col("_partitioned").isNotNull(),
            "_stats": F.col("_member.stats"),
            "_text": F.col("_member.text"),
        }
    )
    return exploded.withColumn(
        "partitioned_topic",
        F.coalesce(
            "_partitioned",
            F.when(F.col("topic").rlike(_PARTITION_SUFFIX), F.regexp_replace("topic", _PARTITION_SUFFIX, "")),
        ),
    ).drop("_partitioned", "_member")


def _with_problem(frame: DataFrame, name: str, problems: list, where: Column, applies: Column | None = None) -> DataFrame:
    """``frame`` with column ``name``: the first of ``problems`` that holds (where ``applies``),
    its detail after ``where``. The first problem is a column of its own, so that Spark builds it
    once: written into the struct three times, it outgrew a generated method's 64 KB."""
    frame = frame.withColumn("_first_problem", first_problem(problems))
    first = F.col("_first_problem")
    holds = first.isNotNull() if applies is None else applies & first.isNotNull()
    problem = F.struct(first["reason"].alias("reason"), F.concat(where, first["detail"]).alias("detail"))
    return frame.withColumn(name, F.when(holds, problem)).drop("_first_problem")


def _stats_text(in_partitions: Column, topic: Column) -> Column:
    """A topic's stats as Jackson renders them from the envelope's text (a quarantine row's raw)."""
    return F.when(in_partitions, _partitions_text()[topic]).otherwise(F.from_json("raw", "struct<stats:string>")["stats"])


def _partitions_text() -> Column:
    """Each partition's stats in the envelope's text, as Jackson renders them, by partition."""
    return F.from_json("raw", "struct<stats:struct<partitions:map<string,string>>>")["stats"]["partitions"]


def explode_children(
    records: DataFrame,
    day: date,
    topic_fields: tuple[Field, ...],
    children: str,
    child_fields: tuple[Field, ...],
    label: str,
    extra_child_problems=lambda child: [],
    verbatim: tuple[str, ...] = (),
    duplicates: bool = True,
) -> DataFrame:
    """Envelopes → one row per topic partition x child (``subscriptions``, ``cursors``).

    Rows carry ``_ts`` (typed topic stats), ``_text`` (the topic's ``verbatim`` keys as text),
    ``child`` (name, null for a topic without children), ``child_json`` (its text), ``_cs``
    (typed child), ``raw`` (the text a quarantine row keeps, null on a good row) and
    ``problem``. A bad envelope or bad topic stats is one row with its problem and no child.

    No row is filtered out here: a filter under these projections gets the parses inlined into
    its condition, where Spark evaluates each one again.
    """
    env = explode_envelopes(records, day, children, verbatim, duplicates)
    envelope_problem = F.col("problem")
    topics = env.withColumn("_tf", F.when(envelope_problem.isNull(), variant_fields(F.col("_stats"), topic_fields, members=(children,))))
    topics = topics.withColumn("_ts", typed_variant(F.col("_tf"), topic_fields))
    ts = F.col("_ts")
    topic_problems = [*member_problems(F.col("_stats")), *field_problems(variant_object(F.col("_stats"), F.col("_tf"), ts), topic_fields, day)]
    topics = _with_problem(topics, "_topic_problem", topic_problems, F.concat(F.col("topic"), F.lit(": ")), envelope_problem.isNull())
    good = envelope_problem.isNull() & F.col("_topic_problem").isNull()
    members = F.map_zip_with(
        ts[children],
        F.coalesce(F.col("_text")[children], F.create_map().cast("map<string,string>")),
        lambda _, child, text: F.struct(child.alias("v"), text.alias("text")),
    )
    rows = topics.select("*", F.explode_outer(F.when(good, members)).alias("child", "_child"))
    rows = rows.withColumn("_cf", F.when(F.col("child").isNotNull(), variant_fields(F.col("_child.v"), child_fields)))
    rows = rows.withColumn("_cs", typed_variant(F.col("_cf"), child_fields))
    cs = F.col("_cs")
    has_child = F.col("child").isNotNull()
    child_problems = [
        *member_problems(F.col("_child.v")),
        *field_problems(variant_object(F.col("_child.v"), F.col("_cf"), cs), child_fields, day),
        *extra_child_problems(cs),
    ]
    where = F.concat(F.col("topic"), F.lit(f" {label} "), F.col("child"), F.lit(": "))
    rows = _with_problem(rows, "_child_problem", child_problems, where, good & has_child)
    child_json = F.col("_child.text")
    return (
        rows.select(
            "*",
            F.coalesce(envelope_problem, "_topic_problem", "_child_problem").alias("_problem"),
            F.when(envelope_problem.isNotNull(), F.col("raw"))
            .when(F.col("_topic_problem").isNotNull(), _stats_text(F.col("_in_partitions"), F.col("topic")))
            .when(F.col("_child_problem").isNotNull(), F.coalesce(child_json, _stats_text(F.col("_in_partitions"), F.col("topic"))))
            .alias("_raw"),
            child_json.alias("child_json"),
        )
        .drop("problem", "raw", "_topic_problem", "_child_problem", "_child")
        .withColumnsRenamed({"_problem": "problem", "_raw": "raw"})
    )


def has_copies(parsed: DataFrame) -> bool:
    """Whether two envelopes of ``parsed`` (rows of :func:`explode_envelopes`, or carrying its
    ``ENVELOPE``) hold the same text: then its envelopes must be parsed again with
    ``duplicates``. Read from the parsed rows, this costs no pass over the files: judging the
    copies first split every file's envelopes twice, once for their hashes (a sixth of landing
    the large day's topic stats), for copies a day almost never has."""
    envelopes = parsed.select("source_file", ENVELOPE).where(F.col(ENVELOPE)["hash"].isNotNull()).distinct()
    return envelopes.groupBy(F.col(ENVELOPE)["hash"]).count().where("count > 1").limit(1).count() > 0


class StatsRead(NamedTuple):
    """What :func:`read_stats` gives."""

    rows: DataFrame  # the reader's rows, in explode_children's columns
    left: frozenset[str]  # the source_file of each file it left to the general parser
    scanned: DataFrame  # what both come from, persisted: unpersist it when done


def read_stats(
    records: DataFrame,
    day: date,
    topic_fields: tuple[Field, ...],
    children: str,
    child_fields: tuple[Field, ...],
    verbatim: tuple[str, ...] = (),
    child_checks: dict[str, ChildCheck] | None = None,
    child_json: bool = True,
    child_mean: ChildMean | None = None,
) -> StatsRead:
    """The records (whole files) read in one pass by brokerlens' stats reader
    (``StatsEnvelopeRows.scala``), its output persisted on disk (one Spark job, here): its rows,
    their containers counted (an ``array<string>`` field is its size), and the files it left to
    :func:`explode_children`, each holding something that parser judges.

    ``child_checks``: by child field, what the kind's ``extra_child_problems`` check besides the
    fields' own (the reader leaves a file where one fails); ``child_json``: whether the rows
    carry each child's text (``child_json`` is null otherwise, for a kind whose rows do not keep it);
    ``child_mean``: a mean over each child's array the rows carry (``child_mean``), computed in
    the same pass (the reader leaves a file where a value is no number).

    The reader takes only files in which :func:`explode_children` finds no problem, and gives
    its rows exactly; envelopes are not checked for copies (:func:`has_copies` tells). Through
    the VARIANT, the large day's topic stats took most of land's time: each envelope was parsed
    three times and every field looked up by a generated expression.
    """
    spec = {
        "children": children,
        "topic": [_field_spec(f) for f in topic_fields if f.key != children],
        "child": [_field_spec(f, (child_checks or {}).get(f.key)) for f in child_fields],
        "verbatim": list(verbatim),
        "child_json": child_json,
        "child_mean": child_mean._asdict() if child_mean else None,
    }
    start, end = day_bounds(day)
    read = F.call_function(STATS_ROWS_FUNCTION, F.col("raw"), F.lit(json.dumps(spec)), F.lit(start), F.lit(end))
    scanned = records.select("source_file", "ingested_at", F.explode(read).alias("_r")).persist(StorageLevel.DISK_ONLY)
    r = F.col("_r")
    try:
        left = frozenset(row[0] for row in scanned.where(r["left"]).select("source_file").collect())
    except BaseException:
        scanned.unpersist()
        raise
    rows = scanned.where(~r["left"]).select(
        "source_file",
        F.lit(None).cast("int").alias("line"),
        F.struct(r["record"].alias("record"), r["hash"].alias("hash")).alias(ENVELOPE),
        F.lit(None).cast("string").alias("raw"),
        "ingested_at",
        F.lit(None).cast("struct<reason:string,detail:string>").alias("problem"),
        *[r[c].alias(c) for c in ("collected_at", "cluster", "broker", "topic", "partitioned_topic", "child")],
        r["topic_stats"].alias("_ts"),
        r["texts"].alias("_text"),
        r["child_stats"].alias("_cs"),
        r["child_json"].alias("child_json"),
        r["child_mean"].alias("child_mean"),
    )
    return StatsRead(rows, left, scanned)


class ChildMean(NamedTuple):
    """The mean of a child's ``array`` of objects' ``field`` over the values at least ``min``."""

    array: str
    field: str
    min: float


class ChildCheck(NamedTuple):
    """A child field's check beyond its type: a Java regex its string must match (Spark's
    ``rlike``), and the topic-name prefix without which the field is required."""

    pattern: str | None = None
    required_unless_prefix: str | None = None


def _field_spec(f: Field, check: ChildCheck | None = None) -> dict:
    check = check or ChildCheck()
    return {"key": f.key, "type": f.type, "counter": f.counter, "enum": list(f.enum), **check._asdict()}
