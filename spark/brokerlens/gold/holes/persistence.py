"""The persistence settings in force per cursor snapshot: broker.conf at the snapshot, the cap
``managedLedgerMaxUnackedRangesToPersist`` and the ack-state persistence mode
(``managedLedgerPersistIndividualAckAsLongArray``, else the broker's version), and the alert
thresholds, each from the most specific settings override."""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerlens.gold.brokers import broker_config_at, version_choice
from brokerlens.gold.holes.settings import AlertOverride, AlertSettings

CAP_KEY = "managedLedgerMaxUnackedRangesToPersist"
METADATA_STORE_CAP_KEY = "managedLedgerMaxUnackedRangesToPersistInMetadataStore"
LONG_ARRAY_KEY = "managedLedgerPersistIndividualAckAsLongArray"
# ServiceConfiguration: a cursor closing with at most this many ranges is written to the metadata store.
DEFAULT_METADATA_STORE_CAP = 1000
# PR #23888: managedLedgerPersistIndividualAckAsLongArray defaults to true from 4.1 (false before).
LONG_ARRAY_SINCE = (4, 1)
RANGES, LONG_ARRAY, METADATA_STORE = "ranges", "long-array", "metadata-store"
KEY = ["cluster", "topic", "subscription"]
SNAPSHOT_KEY = [*KEY, "snapshot_at"]


def _override_chain(overrides: list[AlertOverride], field: str, fallback: Column, fallback_source: Column) -> tuple[Column, Column]:
    """(value, source) of an alert setting per row: the most specific matching override wins."""
    specific = [o for o in overrides if getattr(o, field) is not None]
    # cluster+namespace before namespace before cluster; the first matching `when` wins.
    specific.sort(key=lambda o: (o.namespace is None, o.cluster is None))
    value, source = fallback, fallback_source
    for o in reversed(specific):
        cond = F.lit(True)
        if o.cluster is not None:
            cond = cond & (F.col("cluster") == o.cluster)
        if o.namespace is not None:
            cond = cond & (F.col("namespace") == o.namespace)
        label = "settings-namespace" if o.namespace is not None else "settings-cluster"
        value = F.when(cond, F.lit(getattr(o, field))).otherwise(value)
        source = F.when(cond, F.lit(label)).otherwise(source)
    return value, source


def with_persistence(snapshots: DataFrame, policies: DataFrame, metrics: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    """The persistence settings in force per snapshot: ``cap``/``cap_source`` (settings override >
    broker config > ``alerts.default_cap``), ``metadata_store_cap`` (broker config > 1,000) and
    ``persist_mode``/``persist_mode_source`` (settings ``alerts.persist_mode`` > broker config
    ``managedLedgerPersistIndividualAckAsLongArray`` > the broker's version, >= 4.1 long-array >
    ranges), chosen like the dispatch limiter model. ``policies``: bronze_policies up to ``day``
    (earlier days' records hold on); ``metrics``: bronze_metrics of the days a broker's version is
    searched in (:func:`~brokerlens.gold.brokers.version_metrics`)."""
    keys = [CAP_KEY, METADATA_STORE_CAP_KEY, LONG_ARRAY_KEY]
    # Looked up per broker and instant, not per cursor: a broker's cursors share their snapshots'
    # instants, so the lookups are a few per broker and minute instead of one per snapshot.
    lookup = ["cluster", "broker", "snapshot_at"]
    config = broker_config_at(snapshots, policies, keys, lookup, F.col("snapshot_at")).withColumnsRenamed({k: f"_config_{k}" for k in lookup})
    # A snapshot without a broker takes its cluster's config: matched null-safe.
    same_lookup = (
        (F.col("cluster") == F.col("_config_cluster"))
        & F.col("broker").eqNullSafe(F.col("_config_broker"))
        & (F.col("snapshot_at") == F.col("_config_snapshot_at"))
    )
    positive = lambda key: F.when(F.col(key).try_cast("bigint") > 0, F.col(key).try_cast("bigint"))  # noqa: E731
    flag = F.lower(F.trim(F.col(LONG_ARRAY_KEY)))
    versions = version_choice(metrics, day, LONG_ARRAY_SINCE, LONG_ARRAY, RANGES)
    df = (
        snapshots.join(config, same_lookup, "left")
        .drop(*(f"_config_{k}" for k in lookup))
        .join(
            F.broadcast(versions),
            (F.col("cluster") == F.col("v_cluster")) & (F.col("broker") == F.col("v_broker")),
            "left",
        )
        .withColumn("policy_cap", positive(CAP_KEY))
        .withColumn("c_mode", F.when(flag == "true", F.lit(LONG_ARRAY)).when(flag == "false", F.lit(RANGES)))
    )
    fallback = F.coalesce(F.col("policy_cap"), F.lit(alerts.default_cap))
    fallback_source = F.when(F.col("policy_cap").isNotNull(), F.lit("broker-config")).otherwise(F.lit("default"))
    cap, source = _override_chain(alerts.overrides, "cap", fallback, fallback_source)
    if alerts.persist_mode != "auto":
        mode, mode_source = F.lit(alerts.persist_mode), F.lit("settings")
    else:
        mode = F.coalesce("c_mode", "v_choice", F.lit(RANGES))
        mode_source = (
            F.when(F.col("c_mode").isNotNull(), F.lit(f"broker-config {LONG_ARRAY_KEY}"))
            .when(F.col("v_choice").isNotNull(), F.col("v_source"))
            .otherwise(F.lit("default"))
        )
    return (
        df.withColumn("cap", cap.cast("bigint"))
        .withColumn("cap_source", source)
        .withColumn(
            "metadata_store_cap",
            F.coalesce(
                F.when(F.col(METADATA_STORE_CAP_KEY).try_cast("bigint") >= 0, F.col(METADATA_STORE_CAP_KEY).try_cast("bigint")),
                F.lit(DEFAULT_METADATA_STORE_CAP),
            ).cast("bigint"),
        )
        .withColumn("persist_mode", mode)
        .withColumn("persist_mode_source", mode_source)
        .drop(CAP_KEY, METADATA_STORE_CAP_KEY, LONG_ARRAY_KEY, "policy_cap", "c_mode", "v_cluster", "v_broker", "v_source", "v_choice")
    )


def with_alert_thresholds(df: DataFrame, alerts: AlertSettings) -> DataFrame:
    warning, _ = _override_chain(alerts.overrides, "warning_ranges", F.lit(alerts.warning_ranges), F.lit(""))
    horizon, _ = _override_chain(alerts.overrides, "horizon_hours", F.lit(alerts.horizon_hours), F.lit(""))
    return df.withColumn("warning_threshold", warning.cast("bigint")).withColumn("horizon_hours", horizon.cast("double"))
