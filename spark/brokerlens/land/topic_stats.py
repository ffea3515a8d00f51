"""topic-stats/*.json: ``pulsar-admin topics stats`` (TopicStats) or ``partitioned-stats
--per-partition`` in the envelope. One bronze row per topic partition x subscription."""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .checks import Field
from .envelope import ENVELOPE, ChildMean, StatsRead, explode_children, read_stats

KIND = "topic-stats"
TABLE = "bronze_topic_stats"
SUFFIXES = (".json",)
WHOLE_FILE = True
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
# A subscription with no dispatcher (no consumer since the topic was loaded, e.g. after an unload)
# reports its type as the string "None" (PersistentSubscription.getTypeString): no type, not a bad one.
NO_DISPATCHER = "None"

TOPIC = (
    Field("msgInCounter", "bigint", counter=True, column="topic_msg_in_counter"),
    Field("bytesInCounter", "bigint", counter=True, column="topic_bytes_in_counter"),
    Field("msgOutCounter", "bigint", counter=True, column="topic_msg_out_counter"),
    Field("bytesOutCounter", "bigint", counter=True, column="topic_bytes_out_counter"),
    Field("msgRateIn", "double", column="topic_msg_rate_in"),
    Field("msgRateOut", "double", column="topic_msg_rate_out"),
    Field("averageMsgSize", "double", column="topic_average_msg_size"),
    Field("storageSize", "bigint"),
    Field("backlogSize", "bigint"),
    Field("publishers", "array<string>"),
    Field("subscriptions", "map<string,string>"),
)
SUBSCRIPTION = (
    Field("type", enum=(*SUBSCRIPTION_TYPES, NO_DISPATCHER), column="subscription_type"),
    Field("msgOutCounter", "bigint", counter=True),
    Field("bytesOutCounter", "bigint", counter=True),
    Field("msgRateOut", "double"),
    Field("msgThroughputOut", "double"),
    Field("msgRateRedeliver", "double"),
    Field("msgBacklog", "bigint"),
    Field("unackedMessages", "bigint"),
    Field("msgDelayed", "bigint"),
    Field("nonContiguousDeletedMessagesRanges", "bigint", counter=True),
    Field("nonContiguousDeletedMessagesRangesSerializedSize", "bigint", counter=True),
    Field("blockedSubscriptionOnUnackedMsgs", "boolean"),
    Field("consumers", "array<string>"),
    # PIP-406 (Pulsar 4.0+, SubscriptionStatsImpl): times dispatch was throttled, per limit level.
    *(
        Field(f"dispatchThrottled{unit}EventsBy{level}Limit", "bigint", counter=True)
        for level in ("Subscription", "Topic", "Broker")
        for unit in ("Msg", "Bytes")
    ),
)


def count(array: F.Column) -> F.Column:
    # size(null) is -1 in Spark; an absent list is unknown, not negative.
    return F.when(array.isNotNull(), F.size(array))


def subscription_column(ss: F.Column, f: Field) -> F.Column:
    if f.key == "type":
        return F.when(ss[f.key] != NO_DISPATCHER, ss[f.key]).alias(f.name)
    return ss[f.key].alias(f.name)


# The mean of the consumers' avgMessagesPerEntry at least 1 (consumers_msgs_per_entry).
MSGS_PER_ENTRY = ChildMean("consumers", "avgMessagesPerEntry", 1.0)


def consumers_msgs_per_entry(subscription_json: Column) -> Column:
    """The mean of the subscription's consumers' ``avgMessagesPerEntry`` (null without one >= 1),
    from its text.

    Pulsar's Consumer keeps it as a moving average of the messages per entry it dispatched (a new
    consumer reports 0). The dispatchers size reads in entries from the message permits left
    (``messagesToRead``), so with batching the entries, not the messages, are what the limiter
    bounds: without them a batched overshoot cannot be told from any other. brokerlens' stats
    reader computes the same from the file's parse (:data:`MSGS_PER_ENTRY`)."""
    m = MSGS_PER_ENTRY
    consumers = F.from_json(subscription_json, f"struct<{m.array}: array<struct<{m.field}: double>>>")
    # One pass, one higher-order function: Spark evaluates those without generated code, and a
    # filtered array used three times (sum and two sizes) was filtered three times per row.
    return F.aggregate(
        consumers[m.array][m.field],
        F.struct(F.lit(0.0).alias("total"), F.lit(0).alias("known")),
        lambda acc, v: F.when(v >= m.min, F.struct((acc["total"] + v).alias("total"), (acc["known"] + 1).alias("known"))).otherwise(acc),
        lambda acc: F.when(acc["known"] > 0, acc["total"] / acc["known"]),
    )


def parse(records: DataFrame, day: date, duplicates: bool = True) -> DataFrame:
    rows = explode_children(records, day, TOPIC, "subscriptions", SUBSCRIPTION, "subscription", verbatim=("publishers",), duplicates=duplicates)
    return _bronze(rows, day, count, consumers_msgs_per_entry(F.col("child_json")))


def read(records: DataFrame, day: date) -> StatsRead:
    """The files brokerlens' stats reader takes, as :func:`parse` would give them (without the
    duplicate check), and those it leaves to :func:`parse`."""
    taken = read_stats(records, day, TOPIC, "subscriptions", SUBSCRIPTION, verbatim=("publishers",), child_mean=MSGS_PER_ENTRY)
    return taken._replace(rows=_bronze(taken.rows, day, lambda counted: counted, F.col("child_mean")))


def _bronze(rows: DataFrame, day: date, size, msgs_per_entry: Column) -> DataFrame:
    """The bronze columns of :func:`~.envelope.explode_children`'s rows; ``size``: a container
    field's count from its column in ``_ts``/``_cs``; ``msgs_per_entry``: the consumers' mean."""
    ts, ss = F.col("_ts"), F.col("_cs")
    return rows.select(
        F.lit(day).alias("day"),
        "collected_at",
        "cluster",
        "broker",
        "topic",
        "partitioned_topic",
        *[ts[f.key].alias(f.name) for f in TOPIC if f.key not in ("publishers", "subscriptions")],
        size(ts["publishers"]).alias("publishers"),
        F.col("_text")["publishers"].alias("publishers_json"),
        F.col("child").alias("subscription"),
        *[subscription_column(ss, f) for f in SUBSCRIPTION if f.key != "consumers"],
        size(ss["consumers"]).alias("consumers"),
        msgs_per_entry.alias("consumers_msgs_per_entry"),
        F.col("child_json").alias("subscription_json"),
        "source_file",
        "line",
        "ingested_at",
        "raw",
        "problem",
        ENVELOPE,
    )
