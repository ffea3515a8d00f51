"""Gold ``publish_rate_conformance``: producer send series against the configured publish-rate
limits (``[[producers.publish_rate_limits]]``, EMQX notation), through EMQX's token bucket
(``brokerlens.gold.token_bucket``) held per topic partition."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.gold.producers.settings import ProducerSettings
from brokerlens.gold.token_bucket import conformance, parse_limit
from brokerlens.platform.frames import rows_frame

from .config import PRODUCER, partitions_at_least_one


def publish_limits(config: ProducerSettings) -> list[tuple[str, str, str, float, float]]:
    """(scope, dimension, text, rate, burst) per configured limit; a bad limit is an error."""
    limits = []
    for entry in config.publish_rate_limits:
        for dimension, text in (("msgs", entry.msgs), ("bytes", entry.bytes)):
            if text is None:
                continue
            bucket = parse_limit(text)
            if bucket.bytes != (dimension == "bytes"):
                raise ValueError(
                    f"producers.publish_rate_limits[{entry.scope}].{dimension} = {text!r}: "
                    + ("a byte limit needs a size unit (B, KB, MB, GB)" if dimension == "bytes" else "a message limit has no size unit")
                )
            limits.append((entry.scope, dimension, bucket.text, bucket.rate, bucket.burst))
    return limits


def publish_conformance(snapshots: DataFrame, config: ProducerSettings) -> DataFrame | None:
    """Producer send series against the configured publish-rate limits (None: no limits).

    A Pulsar publish rate holds per topic partition, so a producer on N partitions is held to
    N times the limit (assuming it spreads evenly and is the topic's only publisher). Each
    snapshot counts the client's last stats interval (statsIntervalSeconds); the bucket is full
    at the start of the day.
    """
    limits = publish_limits(config)
    if not limits:
        return None
    spark = snapshots.sparkSession
    limit_df = rows_frame(spark, limits, "scope string, dimension string, limit_text string, per_partition_rate double, per_partition_burst double")
    namespace = F.regexp_extract("topic", r"^[a-z-]+://([^/]+/[^/]+)/", 1)
    seconds = config.stats_interval_seconds
    series = snapshots.select(
        "day",
        *PRODUCER,
        "partitions",
        "snapshot_at",
        F.col("num_msgs_sent").cast("double").alias("msgs"),
        F.col("num_bytes_sent").cast("double").alias("bytes"),
        namespace.alias("namespace"),
    )
    matched = series.join(limit_df, (limit_df.scope == series.topic) | (limit_df.scope == series.namespace))
    # A topic entry wins over its namespace's.
    most_specific = matched.withColumn(
        "_rank", F.dense_rank().over(Window.partitionBy(*PRODUCER, "dimension").orderBy(F.when(F.col("scope") == F.col("topic"), 0).otherwise(1)))
    ).where("_rank = 1")
    parts = partitions_at_least_one()
    prepared = most_specific.select(
        "day",
        *PRODUCER,
        "dimension",
        "limit_text",
        F.lit("settings").alias("limit_source"),
        (F.col("per_partition_rate") * parts).alias("rate"),
        (F.col("per_partition_burst") * parts).alias("burst"),
        (F.col("snapshot_at") - F.expr(f"make_dt_interval(0, 0, 0, {seconds})")).alias("interval_start"),
        F.lit(seconds).alias("interval_seconds"),
        F.when(F.col("dimension") == "msgs", F.col("msgs")).otherwise(F.col("bytes")).alias("observed"),
    ).where(F.col("observed").isNotNull())
    return (
        prepared.transform(lambda df: conformance(df, [*PRODUCER, "dimension"]))
        .withColumn("peak_allowed", F.col("burst") + F.col("rate"))
        .withColumn("observed_rate", F.col("observed") / F.col("interval_seconds"))
    )
