"""producer-stats/*.jsonl: client ProducerStats snapshots with the producer's configuration
(schemas/landing/README.md "producer-stats"). Keys a client does not report are absent."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .checks import Field, duplicate_problem, field_problems, first_problem, malformed_json, map_object, with_object

KIND = "producer-stats"
TABLE = "bronze_producer_stats"
SUFFIXES = (".jsonl",)
WHOLE_FILE = False

COMPRESSION_TYPES = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
ROUTING_MODES = ("RoundRobinPartition", "SinglePartition", "CustomPartition")

FIELDS = (
    Field("collected_at", "timestamp", required=True, in_day=True),
    Field("cluster", required=True),
    Field("topic", required=True),
    Field("producer_name", required=True),
    Field("partitions", "int", counter=True),
    Field("config", "map<string,string>"),
    Field("client", "map<string,string>"),
    Field("stats", "map<string,string>", required=True),
    Field("extra", "map<string,string>"),
)
STATS = (
    Field("numMsgsSent", "bigint", counter=True),
    Field("numBytesSent", "bigint", counter=True),
    Field("numSendFailed", "bigint", counter=True),
    Field("numAcksReceived", "bigint", counter=True),
    Field("sendMsgsRate", "double"),
    Field("sendBytesRate", "double"),
    Field("sendLatencyMillis50pct", "double", column="send_latency_ms_p50"),
    Field("sendLatencyMillis75pct", "double", column="send_latency_ms_p75"),
    Field("sendLatencyMillis95pct", "double", column="send_latency_ms_p95"),
    Field("sendLatencyMillis99pct", "double", column="send_latency_ms_p99"),
    Field("sendLatencyMillis999pct", "double", column="send_latency_ms_p999"),
    Field("sendLatencyMillisMax", "double", column="send_latency_ms_max"),
    Field("pendingQueueSize", "int", counter=True),
    Field("totalMsgsSent", "bigint", counter=True),
    Field("totalBytesSent", "bigint", counter=True),
    Field("totalSendFailed", "bigint", counter=True),
    Field("totalAcksReceived", "bigint", counter=True),
    Field("partitionStats", "map<string,string>"),
)
# ProducerConfigurationData / ClientConfigurationData keys the silver tables read.
CONFIG = (
    Field("batchingEnabled", "boolean"),
    Field("batchingMaxMessages", "int", counter=True),
    Field("batchingMaxBytes", "bigint", counter=True),
    Field("batchingMaxPublishDelayMicros", "bigint", counter=True),
    Field("batchingPartitionSwitchFrequencyByPublishDelay", "int", counter=True),
    Field("maxPendingMessages", "int", counter=True),
    Field("maxPendingMessagesAcrossPartitions", "int", counter=True),
    Field("blockIfQueueFull", "boolean"),
    Field("sendTimeoutMs", "bigint", counter=True),
    Field("compressionType", enum=COMPRESSION_TYPES),
    Field("messageRoutingMode", enum=ROUTING_MODES),
)
CLIENT = (Field("memoryLimitBytes", "bigint", counter=True),)


def parse(records: DataFrame, day: date) -> DataFrame:
    parsed = with_object(records, F.col("raw"), FIELDS, "_keys", "_t")
    k, t = F.col("_keys"), F.col("_t")
    parsed = with_object(parsed, k["stats"], STATS, "_sk", "_s")
    parsed = with_object(parsed, k["config"], CONFIG, "_ck", "_c")
    parsed = with_object(parsed, k["client"], CLIENT, "_lk", "_l")
    s = F.col("_s")
    problems = [
        *malformed_json(F.col("raw"), k),
        *field_problems(map_object(k, t), FIELDS, day),
        *field_problems(map_object(F.col("_sk"), s), STATS, day, "stats."),
        *field_problems(map_object(F.col("_ck"), F.col("_c")), CONFIG, day, "config."),
        *field_problems(map_object(F.col("_lk"), F.col("_l")), CLIENT, day, "client."),
        duplicate_problem(),
    ]
    partition_rates = F.transform_values(s["partitionStats"], lambda _, v: F.from_json(v, "struct<sendMsgsRate:double>")["sendMsgsRate"])
    return parsed.select(
        F.lit(day).alias("day"),
        *[t[f.key].alias(f.name) for f in FIELDS if f.key not in ("stats",)],
        *[s[f.key].alias(f.name) for f in STATS if f.key != "partitionStats"],
        partition_rates.alias("partition_send_msgs_rate"),
        "source_file",
        "line",
        "raw",
        "ingested_at",
        first_problem(problems).alias("problem"),
    )
