"""policies/*.jsonl: broker config and dispatch-rate policies, each with the time it took effect.

``policy`` is Pulsar's ``DispatchRate`` as the admin API returns it (``dispatchThrottlingRateInMsg``,
``dispatchThrottlingRateInByte``, ``ratePeriodInSecond``, ``relativeToPublishRate``), or for
``broker-config`` a map of broker.conf keys by their Pulsar names (values as numbers, booleans
or the strings the dynamic-config API returns; also the text ``pulsar-admin brokers`` prints, one
``name value`` or ``name:value`` per line, as a JSON string). ``"policy": null`` removes the policy.
Pulsar 1.x named the topic-level DispatchRate fields ``dispatchThrottlingRatePerTopicInMsg`` /
``...InByte``: read as ``dispatchThrottlingRateInMsg`` / ``...InByte``.
An ``effective_at`` before the landing day is fine (a policy in force since then); one after
the day is ``outside-day``.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .checks import (
    MISSING_FIELD,
    OUTSIDE_DAY,
    PRIORITY,
    WRONG_TYPE,
    Field,
    day_bounds,
    duplicate_problem,
    field_problems,
    first_problem,
    malformed_json,
    map_object,
    with_object,
)

KIND = "policies"
TABLE = "bronze_policies"
SUFFIXES = (".jsonl",)
WHOLE_FILE = False

BROKER_CONFIG = "broker-config"
NAMESPACE_KINDS = ("namespace-dispatch-rate", "namespace-subscription-dispatch-rate")
TOPIC_KINDS = ("topic-dispatch-rate", "topic-subscription-dispatch-rate")

FIELDS = (
    Field("effective_at", "timestamp", required=True),
    Field("cluster", required=True),
    Field("kind", required=True, enum=(BROKER_CONFIG, *NAMESPACE_KINDS, *TOPIC_KINDS)),
    Field("broker"),
    Field("namespace"),
    Field("topic"),
)
DISPATCH_RATE = (
    Field("dispatchThrottlingRateInMsg", "bigint"),
    Field("dispatchThrottlingRateInByte", "bigint"),
    Field("ratePeriodInSecond", "int"),
    Field("relativeToPublishRate", "boolean"),
    Field("dispatchThrottlingRatePerTopicInMsg", "bigint"),  # Pulsar 1.x names
    Field("dispatchThrottlingRatePerTopicInByte", "bigint"),
)
# One `name value`, `name:value` or `name=value` line of broker config printed as text.
CONFIG_LINE = r"^\s*([A-Za-z][A-Za-z0-9_.]*)\s*(?:[:=]\s*|\s+)(.*?)\s*$"
# broker.conf keys that the silver tables read, with the type their value must cast to.
BROKER_KEYS = {
    "dispatchThrottlingRateInMsg": "bigint",
    "dispatchThrottlingRateInByte": "bigint",
    "dispatchThrottlingRatePerTopicInMsg": "bigint",
    "dispatchThrottlingRatePerTopicInByte": "bigint",
    "dispatchThrottlingRatePerSubscriptionInMsg": "bigint",
    "dispatchThrottlingRatePerSubscriptionInByte": "bigint",
    "ratePeriodInSecond": "int",
    "dispatchThrottlingOnBatchMessageEnabled": "boolean",
    "preciseDispatcherFlowControl": "boolean",
    "dispatchThrottlingOnNonBacklogConsumerEnabled": "boolean",
    "managedLedgerMaxUnackedRangesToPersist": "int",
}


def namespace_of(topic: F.Column) -> F.Column:
    """tenant/namespace of persistent://tenant/namespace/topic."""
    return F.regexp_extract(topic, r"^[a-z-]+://([^/]+/[^/]+)/", 1)


def parse(records: DataFrame, day: date) -> DataFrame:
    parsed = with_object(records, F.col("raw"), FIELDS, "_keys", "_t")
    k, t = F.col("_keys"), F.col("_t")
    policy_text = k["policy"]
    parsed = with_object(parsed, policy_text, DISPATCH_RATE, "_rate_keys", "_rate")
    lines = F.filter(F.split(policy_text, r"\r?\n"), lambda line: F.trim(line) != "")
    names = F.transform(lines, lambda line: F.regexp_extract(line, CONFIG_LINE, 1))
    text_lines = ~F.ltrim(policy_text).startswith("{") & (F.size(lines) > 0)
    bad_line = F.filter(lines, lambda line: ~line.rlike(CONFIG_LINE))[0]
    repeated = F.size(F.array_distinct(names)) != F.size(names)
    config = F.when(
        text_lines & bad_line.isNull() & ~repeated,
        F.map_from_arrays(names, F.transform(lines, lambda line: F.regexp_extract(line, CONFIG_LINE, 2))),
    ).otherwise(F.from_json(policy_text, "map<string,string>"))
    parsed = parsed.withColumn("_config", config)
    kind = t["kind"]
    is_broker = kind == BROKER_CONFIG
    _, end = day_bounds(day)
    has_policy = policy_text.isNotNull()
    problems = [
        *malformed_json(F.col("raw"), k),
        *field_problems(map_object(k, t), FIELDS, day),
        (PRIORITY.index(MISSING_FIELD), ~F.map_contains_key(k, "policy"), MISSING_FIELD, F.lit("policy is missing (null removes a policy)")),
        (PRIORITY.index(MISSING_FIELD), kind.isin(*NAMESPACE_KINDS) & t["namespace"].isNull(), MISSING_FIELD, F.lit("namespace is missing")),
        (PRIORITY.index(MISSING_FIELD), kind.isin(*TOPIC_KINDS) & t["topic"].isNull(), MISSING_FIELD, F.lit("topic is missing")),
        (
            PRIORITY.index(WRONG_TYPE),
            has_policy & is_broker & text_lines & bad_line.isNotNull(),
            WRONG_TYPE,
            F.concat(F.lit("policy line is not 'name value' or 'name:value': "), F.substring(bad_line, 1, 200)),
        ),
        (PRIORITY.index(WRONG_TYPE), has_policy & is_broker & text_lines & repeated, WRONG_TYPE, F.lit("policy names a broker config key twice")),
        (
            PRIORITY.index(WRONG_TYPE),
            has_policy & F.col("_config").isNull(),
            WRONG_TYPE,
            F.concat(F.lit("policy should be an object, got "), F.substring(policy_text, 1, 200)),
        ),
        *[
            (p, has_policy & ~is_broker & cond, reason, detail)
            for p, cond, reason, detail in field_problems(map_object(F.col("_rate_keys"), F.col("_rate")), DISPATCH_RATE, day, "policy.")
        ],
        *[
            (
                PRIORITY.index(WRONG_TYPE),
                has_policy & is_broker & F.col("_config")[key].isNotNull() & F.col("_config")[key].try_cast(type_).isNull(),
                WRONG_TYPE,
                F.concat(F.lit(f"policy.{key} should be {type_}, got "), F.substring(F.col("_config")[key], 1, 200)),
            )
            for key, type_ in BROKER_KEYS.items()
        ],
        (
            PRIORITY.index(OUTSIDE_DAY),
            t["effective_at"] >= F.lit(end),
            OUTSIDE_DAY,
            F.concat(F.lit("effective_at "), F.date_format(t["effective_at"], "yyyy-MM-dd'T'HH:mm:ss'Z'"), F.lit(f" is after {day.isoformat()}")),
        ),
        duplicate_problem(),
    ]
    rate_col = F.col("_rate")
    dispatch = has_policy & ~is_broker
    return parsed.select(
        F.lit(day).alias("day"),
        t["effective_at"].alias("effective_at"),
        t["cluster"].alias("cluster"),
        kind.alias("kind"),
        t["broker"].alias("broker"),
        F.coalesce(t["namespace"], namespace_of(t["topic"])).alias("namespace"),
        t["topic"].alias("topic"),
        (~has_policy).alias("removed"),
        F.when(dispatch, F.coalesce(rate_col["dispatchThrottlingRateInMsg"], rate_col["dispatchThrottlingRatePerTopicInMsg"])).alias(
            "dispatch_throttling_rate_in_msg"
        ),
        F.when(dispatch, F.coalesce(rate_col["dispatchThrottlingRateInByte"], rate_col["dispatchThrottlingRatePerTopicInByte"])).alias(
            "dispatch_throttling_rate_in_byte"
        ),
        F.when(dispatch, rate_col["ratePeriodInSecond"]).alias("rate_period_in_second"),
        F.when(dispatch, rate_col["relativeToPublishRate"]).alias("relative_to_publish_rate"),
        F.when(has_policy & is_broker, F.col("_config")).alias("broker_config"),
        policy_text.alias("policy_json"),
        "source_file",
        "line",
        "raw",
        "ingested_at",
        first_problem(problems).alias("problem"),
    )
