"""What each broker's dispatch rate limiter is and what it charges: the limiter model (classic
``RateLimiter`` or ``AsyncTokenBucket``) and the counting rules of broker.conf, from the broker's
config, the settings and its Pulsar version; and both put on each row by its broker."""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerlens.gold.brokers import broker_config_at, version_choices

# classic: RateLimiter. token-bucket: AsyncTokenBucket refilled every 16 ms (PIP-322, Pulsar 3.2).
# token-bucket-periodic: AsyncTokenBucket refilled once per rate period
# (DispatchRateLimiterAsyncTokenBucketImpl sets addTokensResolutionNanos to the period, "to behave
# like the classic limiter"; the same change made the factory selectable).
CLASSIC, TOKEN_BUCKET, TOKEN_BUCKET_PERIODIC = "classic", "token-bucket", "token-bucket-periodic"
TOKEN_BUCKETS = (TOKEN_BUCKET, TOKEN_BUCKET_PERIODIC)
SCRAPE = "scrape"  # the grain of a counter row (a snapshot interval): dispatch_intervals.yaml
FACTORY_KEY = "dispatchRateLimiterFactoryClassName"


def judged_as_bucket() -> Column:
    """Rows judged as a bucket of capacity the limit, the recursion's x its capacity less its
    tokens: the token bucket refilled every 16 ms, and every snapshot interval (a counter row,
    ``grain`` scrape), which a limiter's periods do not align with (periods.py)."""
    return (F.col("limiter_model") == TOKEN_BUCKET) | (F.col("grain") == SCRAPE)


def broker_credit(edge: str, measure: str) -> Column:
    """The scan's credit before (``edge`` in) or after (out) the row: tokens the broker may hold
    beyond a snapshot interval's bucket (periods.py); 0 on a period record."""
    return F.when(F.col("grain") == SCRAPE, F.col(f"_credit_{edge}_{measure}")).otherwise(F.lit(0))


# The model by version, newest first: the periodic refill is in 4.0.4 and 3.3.5 (the first
# releases of their lines with DispatchRateLimiterFactoryClassic) and every later line.
VERSION_MODELS = (
    ((4, 0, 4), TOKEN_BUCKET_PERIODIC),
    ((4, 0, 0), TOKEN_BUCKET),
    ((3, 3, 5), TOKEN_BUCKET_PERIODIC),
    ((3, 2), TOKEN_BUCKET),
)


def config_by_end_of(brokers: DataFrame, policies: DataFrame, keys: list[str], day: date) -> DataFrame:
    """``brokers`` (cluster, broker) with each key's value in the broker's config by the end of
    ``day`` (null when never set, or removed)."""
    last_micro = F.to_timestamp(F.lit((day + timedelta(days=1)).isoformat())) - F.expr("INTERVAL 1 MICROSECOND")
    found = broker_config_at(brokers, policies, keys, ["cluster", "broker"], last_micro)
    return brokers.join(found, ["cluster", "broker"], "left")


def limiter_models(brokers: DataFrame, policies: DataFrame, metrics: DataFrame, day: date, override: str = "auto") -> DataFrame:
    """The dispatch rate limiter each broker runs on ``day``: (cluster, broker, limiter_model,
    limiter_model_source).

    ``override`` (settings ``dispatch.limiter_model``) > broker config
    ``dispatchRateLimiterFactoryClassName`` (``broker_config_at``; the key exists only where the
    bucket is refilled per period) > the broker's version (``pulsar_version_info{version}`` in
    bronze_metrics, latest sample by the end of the day: ``VERSION_MODELS``) > classic.
    ``brokers``: the (cluster, broker) pairs to resolve.
    """
    if override != "auto":
        return brokers.select("cluster", "broker", F.lit(override).alias("limiter_model"), F.lit("settings").alias("limiter_model_source"))
    versions = version_choices(metrics, day, VERSION_MODELS, CLASSIC)
    factory = F.col(FACTORY_KEY)
    # Pulsar's factories: DispatchRateLimiterFactoryClassic / ...AsyncTokenBucket.
    config = F.when(factory.endswith("Classic"), F.lit(CLASSIC)).when(factory.endswith("AsyncTokenBucket"), F.lit(TOKEN_BUCKET_PERIODIC))
    resolved = config_by_end_of(brokers, policies, [FACTORY_KEY], day).join(
        versions, (F.col("cluster") == F.col("v_cluster")) & (F.col("broker") == F.col("v_broker")), "left"
    )
    return resolved.select(
        "cluster",
        "broker",
        F.coalesce(config, F.col("v_choice"), F.lit(CLASSIC)).alias("limiter_model"),
        F.when(config.isNotNull(), F.lit(f"broker-config {FACTORY_KEY}"))
        .when(F.col("v_choice").isNotNull(), F.col("v_source"))
        .otherwise(F.lit("default"))
        .alias("limiter_model_source"),
    )


# Pulsar's counting rules (ServiceConfiguration; AbstractBaseDispatcher
# acquirePermitsForDeliveredMessages and filterEntriesForConsumer, PersistentTopic
# checkBackloggedCursors): broker.conf key -> (column, Spark type, Pulsar's default).
NON_BACKLOG_KEY = "dispatchThrottlingOnNonBacklogConsumerEnabled"
FILTERED_KEY = "dispatchThrottlingForFilteredEntriesEnabled"
BACKLOGGED_THRESHOLD_KEY = "managedLedgerCursorBackloggedThreshold"
COUNTING_RULES = {
    NON_BACKLOG_KEY: ("throttle_non_backlog", "boolean", True),
    FILTERED_KEY: ("throttle_filtered", "boolean", False),
    BACKLOGGED_THRESHOLD_KEY: ("cursor_backlogged_threshold", "bigint", 1000),
}


def counting_rules(brokers: DataFrame, policies: DataFrame, day: date, defaults: dict | None = None) -> DataFrame:
    """What each broker charges to its dispatch limiters on ``day``: (cluster, broker,
    throttle_non_backlog, throttle_filtered, cursor_backlogged_threshold, counting_rules_source).

    The broker's config (``broker_config_at``) > ``defaults`` ({broker.conf key: value}, from
    settings ``dispatch``) > Pulsar's defaults. A value that does not parse is ignored."""
    defaults = defaults or {}
    keys = list(COUNTING_RULES)
    config = config_by_end_of(brokers, policies, keys, day)
    columns, from_config = [], []
    for key, (name, kind, pulsar_default) in COUNTING_RULES.items():
        text = F.lower(F.trim(F.col(key)))
        parsed = (
            F.when(text == "true", F.lit(True)).when(text == "false", F.lit(False))
            if kind == "boolean"
            else F.when(text.rlike(r"^-?\d+$"), text.cast("bigint"))
        )
        columns.append(F.coalesce(parsed, F.lit(defaults.get(key, pulsar_default)).cast(kind)).alias(name))
        from_config.append(F.when(parsed.isNotNull(), F.lit(key)))
    listed = F.concat_ws(", ", *from_config)
    return config.select(
        "cluster",
        "broker",
        *columns,
        F.when(listed == "", F.lit("settings")).otherwise(F.concat(F.lit("broker-config "), listed)).alias("counting_rules_source"),
    )


def with_model(rows: DataFrame, models: DataFrame | None) -> DataFrame:
    """``limiter_model`` and the counting rules (``counting_rules``) per row from its broker:
    classic and Pulsar's defaults where ``models`` has none."""
    rules = {name: default for name, _, default in COUNTING_RULES.values()}
    if models is None:
        for c, default in rules.items():
            rows = rows.withColumn(c, F.lit(default))
        return rows.withColumn("limiter_model", F.lit(CLASSIC))
    carried = [c for c in rules if c in models.columns]
    m = models.select(
        F.col("cluster").alias("m_cluster"),
        F.col("broker").alias("m_broker"),
        F.col("limiter_model").alias("m_model"),
        *[F.col(c).alias(f"m_{c}") for c in carried],
    )
    cond = (rows["cluster"] == m["m_cluster"]) & rows["broker"].eqNullSafe(m["m_broker"])
    joined = rows.join(F.broadcast(m), cond, "left").withColumn("limiter_model", F.coalesce("m_model", F.lit(CLASSIC)))
    for c, default in rules.items():
        value = F.coalesce(F.col(f"m_{c}"), F.lit(default)) if c in carried else F.lit(default)
        joined = joined.withColumn(c, value)
    return joined.drop("m_cluster", "m_broker", "m_model", *[f"m_{c}" for c in carried])
