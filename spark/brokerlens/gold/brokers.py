"""What a broker runs: its Pulsar version from the ``pulsar_version_info`` metric, and its
broker.conf values from the ``broker-config`` policy records.

Several models depend on both (the dispatch rate limiter and counting rules in ``dispatch``, the
ack-state persistence in ``holes``); they resolve them here, the same way.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from brokerlens.land.metrics import VERSION_METRIC
from brokerlens.platform.settings import PlatformSettings
from brokerlens.platform.tables import read_table

_VERSION = r"^(\d+)\.(\d+)(?:\.(\d+))?"
# Days of bronze_metrics searched back for the broker's pulsar_version_info.
VERSION_LOOKBACK_DAYS = 7


def broker_config_at(rows: DataFrame, policies: DataFrame, keys: list[str], row_key: list[str], at: Column) -> DataFrame:
    """(``row_key``, one text column per broker.conf key in ``keys``): the value in force at ``at``
    for each of ``rows`` (which have ``cluster`` and ``broker``), from ``policies``
    (bronze_policies rows).

    A broker-config record holds for its scope, one broker or (``broker`` null) every broker of
    the cluster, from its ``effective_at`` until the next record of that scope that sets the key
    or removes the scope's config (schemas/landing/README.md). The broker's own value wins over
    the cluster's; once the broker's is removed, the cluster's holds again. Null: never set.
    """
    config = policies.where(F.col("kind") == "broker-config").select(
        F.col("cluster").alias("p_cluster"),
        F.col("broker").alias("p_broker"),
        "effective_at",
        "removed",
        "broker_config",
    )
    # Each distinct lookup once: many rows share one (e.g. every cursor of a broker snapshotted at
    # the same instant), and the lookups' aggregate (max_by over text) is a sort-based one.
    lookups = rows.select(*dict.fromkeys([*row_key, "cluster", "broker"]), at.alias("_at")).distinct()
    matched = lookups.join(
        F.broadcast(config),
        (F.col("p_cluster") == F.col("cluster"))
        & (F.col("p_broker").isNull() | (F.col("p_broker") == F.col("broker")))
        & (F.col("effective_at") <= F.col("_at")),
    )

    def latest(key: str, of_broker: bool) -> Column:
        # max_by skips rows whose ordering is null: records of the other scope, or that do not
        # mention the key; a removal's value is null.
        scope = F.col("p_broker").isNotNull() if of_broker else F.col("p_broker").isNull()
        sets = F.col("removed") | F.map_contains_key("broker_config", F.lit(key))
        value = F.when(~F.col("removed"), F.col("broker_config")[key])
        return F.max_by(value, F.when(scope & sets, F.col("effective_at")))

    return matched.groupBy(*row_key).agg(*(F.coalesce(latest(k, True), latest(k, False)).alias(k) for k in keys))


def version_metrics(spark: SparkSession, day: date, settings: PlatformSettings) -> DataFrame:
    """The bronze_metrics days searched for a broker's version: ``day`` and the
    ``VERSION_LOOKBACK_DAYS`` before it."""
    return read_table("bronze_metrics", spark=spark, settings=settings).where(
        (F.col("day") <= F.lit(day)) & (F.col("day") >= F.lit(day - timedelta(days=VERSION_LOOKBACK_DAYS)))
    )


def broker_versions(metrics: DataFrame, day: date) -> DataFrame:
    """(cluster, broker, version, version_major, version_minor): each broker's latest
    ``pulsar_version_info{version}`` sample in ``metrics`` (bronze_metrics rows) before the end of
    ``day``; samples whose version does not start with ``major.minor`` are ignored."""
    end = F.to_timestamp(F.lit((day + timedelta(days=1)).isoformat()))
    version = F.col("labels")["version"]
    major = F.regexp_extract(version, _VERSION, 1).cast("int")
    latest = Window.partitionBy("cluster", "broker").orderBy(F.col("collected_at").desc())
    return (
        metrics.where((F.col("metric") == VERSION_METRIC) & (F.col("collected_at") < end) & major.isNotNull())
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .select(
            "cluster",
            "broker",
            version.alias("version"),
            major.alias("version_major"),
            F.regexp_extract(version, _VERSION, 2).cast("int").alias("version_minor"),
            F.coalesce(F.regexp_extract(version, _VERSION, 3).try_cast("int"), F.lit(0)).alias("version_patch"),
        )
    )


def version_at_least(since: tuple[int, ...]) -> Column:
    """On ``broker_versions`` rows: the broker runs ``since`` (major, minor[, patch]) or later."""
    parts = [F.col("version_major"), F.col("version_minor"), F.col("version_patch")][: len(since)]
    later = F.lit(True)  # equal on every part
    for part, bound in reversed(list(zip(parts, since))):
        later = (part > bound) | ((part == bound) & later)
    return later


def version_choice(metrics: DataFrame, day: date, since: tuple[int, ...], newer: str, older: str) -> DataFrame:
    """``version_choices`` with one threshold: ``newer`` from ``since`` on, else ``older``."""
    return version_choices(metrics, day, [(since, newer)], older)


def version_choices(metrics: DataFrame, day: date, choices, older: str) -> DataFrame:
    """(v_cluster, v_broker, v_source, v_choice) for the brokers whose version ``metrics`` tell:
    the choice of the first ``(since, choice)`` of ``choices`` (newest first) whose ``since`` the
    broker runs or is later than, else ``older``; ``v_source`` says "version x.y.z"."""
    chosen = F.lit(older)
    for since, choice in reversed(list(choices)):
        chosen = F.when(version_at_least(since), F.lit(choice)).otherwise(chosen)
    return broker_versions(metrics, day).select(
        F.col("cluster").alias("v_cluster"),
        F.col("broker").alias("v_broker"),
        F.concat(F.lit("version "), F.col("version")).alias("v_source"),
        chosen.alias("v_choice"),
    )
