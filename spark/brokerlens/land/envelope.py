"""The envelope around Pulsar's own stats JSON (topic-stats, internal-stats).

A file holds one envelope or a JSON array of envelopes::

    {"collected_at": ..., "cluster": ..., "broker": ..., "topic": ..., "stats": {...verbatim...}}

``stats`` is a topic's stats, or a partitioned topic's (``partitioned-stats --per-partition``,
``PartitionedTopicInternalStats``) whose ``partitions`` map holds each partition's stats: those
become one row per partition. Partitioned stats without per-partition detail stay one row for
the partitioned topic.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .checks import (
    MALFORMED_JSON,
    PRIORITY,
    Field,
    duplicate_problem,
    field_problems,
    first_problem,
    malformed_json,
    mark_duplicates,
    parse_object,
)

FIELDS = (
    Field("collected_at", "timestamp", required=True, in_day=True),
    Field("cluster", required=True),
    Field("broker"),
    Field("topic", required=True),
    Field("stats", "map<string,string>", required=True),
)
_PARTITION_SUFFIX = r"-partition-[0-9]+$"


def explode_envelopes(records: DataFrame, day: date) -> DataFrame:
    """Rows: source_file, line (null), record, raw, ingested_at, problem, collected_at, cluster,
    broker, topic (per partition), partitioned_topic, stats (that partition's stats text).
    A bad envelope is one row with its problem and no stats."""
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
    whole = mark_duplicates(whole).withColumnRenamed("line", "record").withColumn("line", F.lit(None).cast("int"))
    keys, typed = parse_object(F.col("raw"), FIELDS)
    env = whole.withColumns({"_k": keys, "_t": typed})
    k, t = F.col("_k"), F.col("_t")
    where = F.when(F.col("record") > 1, F.concat(F.lit("record "), F.col("record").cast("string"), F.lit(": "))).otherwise(F.lit(""))
    problems = [
        (PRIORITY.index(MALFORMED_JSON), F.col("_bad_array").isNotNull(), MALFORMED_JSON, F.lit("not valid JSON (an envelope or an array of envelopes)")),
        *malformed_json(F.col("raw"), k),
        *field_problems(k, t, FIELDS, day),
        duplicate_problem(),
    ]
    problem = first_problem(problems)
    env = env.withColumn(
        "problem",
        F.when(problem.isNotNull(), F.struct(problem["reason"].alias("reason"), F.concat(where, problem["detail"]).alias("detail"))),
    ).withColumn("raw", F.coalesce("raw", "_file_text"))
    stats_text = k["stats"]
    partitions = F.from_json(stats_text, "struct<partitions:map<string,string>>")["partitions"]
    good = F.col("problem").isNull()
    # A bad envelope stays one row (its topic may be missing: a placeholder key, nulled below).
    per_partition = (
        F.when(good & (F.size(partitions) > 0), partitions)
        .when(good, F.create_map(t["topic"], stats_text))
        .otherwise(F.create_map(F.lit(""), F.lit(None).cast("string")))
    )
    topic = t["topic"]
    exploded = env.select(
        "source_file",
        "line",
        "record",
        "raw",
        "ingested_at",
        "problem",
        t["collected_at"].alias("collected_at"),
        t["cluster"].alias("cluster"),
        t["broker"].alias("broker"),
        F.when(F.size(partitions) > 0, topic).alias("_partitioned"),
        F.explode(per_partition).alias("topic", "stats"),
    )
    exploded = exploded.withColumn("topic", F.when(F.col("problem").isNull(), F.col("topic")))
    return exploded.withColumn(
        "partitioned_topic",
        F.coalesce(
            "_partitioned",
            F.when(F.col("topic").rlike(_PARTITION_SUFFIX), F.regexp_replace("topic", _PARTITION_SUFFIX, "")),
        ),
    ).drop("_partitioned")


def explode_children(
    records: DataFrame,
    day: date,
    topic_fields: tuple[Field, ...],
    children: str,
    child_fields: tuple[Field, ...],
    label: str,
    extra_child_problems=lambda child: [],
) -> DataFrame:
    """Envelopes → one row per topic partition x child (``subscriptions``, ``cursors``).

    Rows carry ``_ts`` (typed topic stats), ``_tk`` (its raw keys), ``child`` (name, null for a
    topic without children), ``child_json``, ``_cs`` (typed child), ``raw`` and ``problem``. A
    bad envelope or bad topic stats is one row with its problem and no child.

    No row is filtered out here: a filter under these projections gets the JSON parses inlined
    into its condition, where Spark evaluates each one again (up to ~150 parses per row).
    """
    env = explode_envelopes(records, day)
    good = F.col("problem").isNull()
    topic_keys, topic = parse_object(F.col("stats"), topic_fields)
    topics = env.withColumns({"_tk": F.when(good, topic_keys), "_ts": F.when(good, topic)})
    topic_problem = first_problem([*malformed_json(F.col("stats"), F.col("_tk")), *field_problems(F.col("_tk"), F.col("_ts"), topic_fields, day)])
    topics = topics.withColumns(
        {
            "raw": F.when(good, F.col("stats")).otherwise(F.col("raw")),
            "problem": F.when(
                good,
                F.when(
                    topic_problem.isNotNull(),
                    F.struct(
                        topic_problem["reason"].alias("reason"),
                        F.concat(F.col("topic"), F.lit(": "), topic_problem["detail"]).alias("detail"),
                    ),
                ),
            ).otherwise(F.col("problem")),
        }
    )
    rows = topics.select("*", F.explode_outer(F.when(good, F.col("_ts")[children])).alias("child", "child_json"))
    child_keys, child = parse_object(F.col("child_json"), child_fields)
    rows = rows.withColumns({"_ck": child_keys, "_cs": child})
    has_child = F.col("child").isNotNull()
    child_problem = first_problem(
        [
            (p, has_child & cond, reason, detail)
            for p, cond, reason, detail in [
                *malformed_json(F.col("child_json"), F.col("_ck")),
                *field_problems(F.col("_ck"), F.col("_cs"), child_fields, day),
                *extra_child_problems(F.col("_cs")),
            ]
        ]
    )
    return rows.withColumns(
        {
            "problem": F.when(
                good & child_problem.isNotNull(),
                F.struct(
                    child_problem["reason"].alias("reason"),
                    F.concat(F.col("topic"), F.lit(f" {label} "), F.col("child"), F.lit(": "), child_problem["detail"]).alias("detail"),
                ),
            ).otherwise(F.col("problem")),
            "raw": F.coalesce("child_json", "raw"),
        }
    )
