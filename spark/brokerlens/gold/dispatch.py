"""Dispatch throttling: ``dispatch_periods``, ``dispatch_daily`` and ``debt_state`` (DESIGN.md
"Dispatch throttling", seeds 000/002).

Pulsar's dispatch rate limiter lets a period overshoot and charges the excess to the following
periods. With quota q per period (``ratePeriodInSecond``)::

    allowed  = max(0, q - debt_in)
    over     = max(0, delivered - allowed)
    debt_out = max(0, debt_in + delivered - q)

That is the classic limiter (``RateLimiter``). Since 3.2 brokers run ``AsyncTokenBucket``
(capacity = the limit, starts full, tokens may go negative); the same recursion x gives its
read-outs: tokens = limit - x, allowed = max(0, limit + quota - debt_in x), debt = max(0, x - limit),
and every rate change restarts from a full bucket (a new segment, as an unlimited stretch does
for both). ``limiter_models`` picks the model per broker and day (README "Dispatch throttling").

This is Lindley's recursion. With S_t the running sum of (delivered - quota) and P_t the value
just before row t (after the empty periods since the previous row drained the debt),
``debt_out_t = S_t - min(0, min_k P_k, min_k S_k)``. Both are computed with window functions:

* Empty periods are never materialised. Quota is integrated over time from ``rate_limits``
  (``Q(t)``: the quota of all periods before t, per limit scope), so a gap of any length, with
  any quota changes inside it, drains ``Q(start) - Q(previous end)`` in one step. Because the
  drain within a gap is monotone, the running minimum taken at the rows is exact.
* An unlimited limit (Pulsar's value <= 0, null in ``rate_limits``) means no limiter: no over,
  no debt. Each unlimited stretch starts a new segment (``seg``: the number of unlimited limits
  started so far); the running minimum is taken over ``struct(-seg, value)`` so that it only
  sees rows of the newest segment: the debt restarts from 0 after a stretch without limit.
* The opening debt (previous day's ``debt_state``) enters as a zero-length row at midnight that
  "delivered" the debt, so no join with the big data is needed.
* One shuffle: partition by scope, sort by period, two stacked window operators with the same
  specification (running sum, then running minimum), no Python on the hot path.

A quota change takes effect at the next period start (``valid_from`` rounded up to the period
grid). For counter-derived rows (grain ``scrape``) the quota of an interval is the limit
prorated to its length (rounded to whole messages and bytes), using the limit in force at the
interval's start.

Starved: a row whose allowance (messages or bytes) is 0. Only rows with a record count: a record
shows the scope was being dispatched; empty periods show no demand and are never counted.

Re-building a day in the middle of a run of days: after writing the day, the closing debt is
compared with the one stored before; if it changed and the next day is built, that day is
re-built from the new debt, and so on while the debt keeps changing (``build_dispatch``).
"""

from __future__ import annotations

import logging
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerlens.platform.settings import Settings
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import merge_table, read_table, write_table

from .brokers import version_choice, version_metrics

log = logging.getLogger(__name__)

SCOPE = ["level", "cluster", "broker", "topic", "subscription"]
# Measures: (prefix used in column names, limit column in rate_limits, delivered amount column).
MEASURES = (("msgs", "msg"), ("bytes", "byte"))
_US = 1_000_000


# ------------------------------------------------------------------------- limits over time


def limit_timeline(limits: DataFrame) -> DataFrame:
    """rate_limits as a timeline per limit scope, with the quota integrated over time.

    One row per limit scope (``lk_level, lk_cluster, lk_key``: the broker at broker level, the
    topic partition at topic and subscription level) and effective start (``eff_from_us``,
    ``valid_from`` rounded up to the period grid; of two changes within one period the later
    one is in force at the period start). ``eff_to_us`` is the next start, null for the last row
    (which stays in force). ``{m}_cum``: quota of all periods before ``eff_from_us``;
    ``{m}_seg``: number of unlimited rows so far (inclusive).
    """
    p_us = F.col("period_seconds").cast("long") * F.lit(_US)
    key = ["lk_level", "lk_cluster", "lk_key"]
    staged = (
        limits.select(
            F.col("level").alias("lk_level"),
            F.col("cluster").alias("lk_cluster"),
            F.when(F.col("level") == "broker", F.col("broker"))
            .otherwise(F.col("topic"))
            .alias("lk_key"),
            F.unix_micros("valid_from").alias("from_us"),
            F.greatest(F.col("period_seconds"), F.lit(1)).alias("period_seconds"),
            "count_entries",
            F.when(F.col("msg_limit") > 0, F.col("msg_limit")).alias("msg_q"),
            F.when(F.col("byte_limit") > 0, F.col("byte_limit")).alias("byte_q"),
            "msg_source",
            "byte_source",
        )
        .withColumn("p_us", p_us)
        .withColumn("eff_from_us", F.expr("(from_us + p_us - 1) div p_us * p_us"))
    )
    latest = Window.partitionBy(*key, "eff_from_us").orderBy(F.col("from_us").desc())
    ordered = Window.partitionBy(*key).orderBy("eff_from_us")
    staged = (
        staged.withColumn("_rank", F.row_number().over(latest))
        .where("_rank = 1")
        .withColumn("eff_to_us", F.lead("eff_from_us").over(ordered))
        .withColumn("_rn", F.row_number().over(ordered))
    )
    before = ordered.rowsBetween(Window.unboundedPreceding, -1)
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    for _, m in MEASURES:
        span = F.when(
            F.col(f"{m}_q").isNotNull() & F.col("eff_to_us").isNotNull(),
            _prorate(F.col(f"{m}_q"), F.col("eff_to_us") - F.col("eff_from_us"), F.col("p_us")),
        ).otherwise(F.lit(0))
        staged = staged.withColumn(
            f"{m}_cum", F.coalesce(F.sum(span).over(before), F.lit(0)).cast("long")
        ).withColumn(
            f"{m}_seg",
            F.sum(F.col(f"{m}_q").isNull().cast("int")).over(upto).cast("long"),
        ).withColumn(
            # Token bucket: every rate change builds a new, full bucket. The scope's first row
            # (the limit in force at midnight) is carried over, not a change.
            f"{m}_seg_tb",
            F.sum((F.col(f"{m}_q").isNull() | (F.col("_rn") > 1)).cast("int"))
            .over(upto)
            .cast("long"),
        )
    return staged.drop("_rank", "_rn", "from_us")


def _round(value: Column) -> Column:
    """A non-negative double to the nearest whole number, half up (as Spark's ``round``, which
    goes through BigDecimal: slower than the rest of the row's arithmetic together)."""
    return F.floor(value + F.lit(0.5)).cast("long")


def _prorate(quota: Column, micros: Column, p_us: Column) -> Column:
    """quota × micros / p_us: exact in whole periods; a partial period (scrape grain) rounds
    half up to whole units."""
    rest = micros % p_us
    partial = F.when(rest != 0, _round(quota * rest / p_us)).otherwise(F.lit(0))
    whole = ((micros - rest) / p_us).cast("long")  # an exact multiple: the double quotient is exact
    return (quota * whole + partial).cast("long")


def _with_limit(df: DataFrame, timeline: DataFrame, at_us: str, prefix: str) -> DataFrame:
    """Join the limit row in force at ``df[at_us]`` (columns renamed with ``prefix``).

    The limit table is small (limits × changes): broadcast, so the big side is not shuffled.
    No row in force (no rate_limits for the scope): the limit columns are null = unlimited.
    """
    t = timeline.select(*[F.col(c).alias(prefix + c) for c in timeline.columns])
    cond = (
        (df["level"] == t[prefix + "lk_level"])
        & (df["cluster"] == t[prefix + "lk_cluster"])
        & (F.when(df["level"] == "broker", df["broker"]).otherwise(df["topic"]) == t[prefix + "lk_key"])
        & (t[prefix + "eff_from_us"] <= df[at_us])
        & (t[prefix + "eff_to_us"].isNull() | (df[at_us] < t[prefix + "eff_to_us"]))
    )
    return df.join(F.broadcast(t), cond, "left")


def _quota_until(m: str, at_us: Column, prefix: str) -> Column:
    """Q(t): quota of all periods of the limit scope before ``at_us``, using the joined row."""
    q = F.col(f"{prefix}{m}_q")
    inside = F.when(
        q.isNotNull(), _prorate(q, at_us - F.col(f"{prefix}eff_from_us"), F.col(f"{prefix}p_us"))
    ).otherwise(F.lit(0))
    return F.col(f"{prefix}{m}_cum") + inside


# ------------------------------------------------------------------------- limiter model

CLASSIC, TOKEN_BUCKET = "classic", "token-bucket"
FACTORY_KEY = "dispatchRateLimiterFactoryClassName"
# Pulsar 3.2 (PIP-322) replaced the classic RateLimiter with AsyncTokenBucket.
TOKEN_BUCKET_SINCE = (3, 2)


def _broker_config(brokers: DataFrame, policies: DataFrame, keys: list[str], day: date) -> DataFrame:
    """(cluster, broker, one column per key): each key's value (text) in the broker's config by the
    end of ``day``: the latest bronze_policies broker-config record that sets or removes the key, a
    record for the broker over one without a broker (which holds for every broker of the
    cluster); null when never set, or removed."""
    end = F.to_timestamp(F.lit((day + timedelta(days=1)).isoformat()))
    latest = Window.partitionBy("cluster", "broker").orderBy(F.col("effective_at").desc())
    config = policies.where((F.col("kind") == "broker-config") & (F.col("effective_at") < end))
    out = brokers
    for i, key in enumerate(keys):
        found = (
            config.where(F.col("removed") | F.map_contains_key("broker_config", F.lit(key)))
            .withColumn("_n", F.row_number().over(latest))
            .where("_n = 1")
            .select(
                F.col("cluster").alias("f_cluster"),
                F.col("broker").alias("f_broker"),
                F.when(~F.col("removed"), F.col("broker_config")[key]).alias("f_value"),
            )
        )
        specific = found.where(F.col("f_broker").isNotNull()).select(
            F.col("f_cluster").alias(f"s{i}_cluster"), F.col("f_broker").alias(f"s{i}_broker"),
            F.col("f_value").alias(f"s{i}_value"),
        )  # fmt: skip
        wide = found.where(F.col("f_broker").isNull()).select(
            F.col("f_cluster").alias(f"w{i}_cluster"), F.col("f_value").alias(f"w{i}_value")
        )
        out = (
            out.join(
                specific,
                (F.col("cluster") == F.col(f"s{i}_cluster")) & (F.col("broker") == F.col(f"s{i}_broker")),
                "left",
            )
            .join(wide, F.col("cluster") == F.col(f"w{i}_cluster"), "left")
            .withColumn(key, F.coalesce(f"s{i}_value", f"w{i}_value"))
            .drop(f"s{i}_cluster", f"s{i}_broker", f"s{i}_value", f"w{i}_cluster", f"w{i}_value")
        )
    return out


def limiter_models(
    brokers: DataFrame, policies: DataFrame, metrics: DataFrame, day: date, override: str = "auto"
) -> DataFrame:
    """The dispatch rate limiter each broker runs on ``day``: (cluster, broker, limiter_model,
    limiter_model_source).

    ``override`` (settings ``dispatch.limiter_model``) > broker config
    ``dispatchRateLimiterFactoryClassName`` (``_broker_config``) > the broker's version
    (``pulsar_version_info{version}`` in bronze_metrics, latest sample by the end of the day:
    >= 3.2 token bucket) > classic. ``brokers``: the (cluster, broker) pairs to resolve.
    """
    if override != "auto":
        return brokers.select(
            "cluster", "broker", F.lit(override).alias("limiter_model"), F.lit("settings").alias("limiter_model_source")
        )
    versions = version_choice(metrics, day, TOKEN_BUCKET_SINCE, TOKEN_BUCKET, CLASSIC)
    factory = F.col(FACTORY_KEY)
    # Pulsar's factories: DispatchRateLimiterFactoryClassic / ...AsyncTokenBucket.
    config = (
        F.when(factory.endswith("Classic"), F.lit(CLASSIC))
        .when(factory.endswith("AsyncTokenBucket"), F.lit(TOKEN_BUCKET))
    )
    resolved = _broker_config(brokers, policies, [FACTORY_KEY], day).join(
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

    The broker's config (``_broker_config``) > ``defaults`` ({broker.conf key: value}, from
    settings ``dispatch``) > Pulsar's defaults. A value that does not parse is ignored."""
    defaults = defaults or {}
    keys = list(COUNTING_RULES)
    config = _broker_config(brokers, policies, keys, day)
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
        F.when(listed == "", F.lit("settings")).otherwise(F.concat(F.lit("broker-config "), listed)).alias(
            "counting_rules_source"
        ),
    )


def _with_model(rows: DataFrame, models: DataFrame | None) -> DataFrame:
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
    joined = rows.join(F.broadcast(m), cond, "left").withColumn(
        "limiter_model", F.coalesce("m_model", F.lit(CLASSIC))
    )
    for c, default in rules.items():
        value = F.coalesce(F.col(f"m_{c}"), F.lit(default)) if c in carried else F.lit(default)
        joined = joined.withColumn(c, value)
    return joined.drop("m_cluster", "m_broker", "m_model", *[f"m_{c}" for c in carried])


# ------------------------------------------------------------------------- dispatch_periods


def dispatch_periods(
    intervals: DataFrame,
    limits: DataFrame,
    opening_debt: DataFrame | None = None,
    models: DataFrame | None = None,
    backlog: DataFrame | None = None,
    cursors: DataFrame | None = None,
) -> DataFrame:
    """Gold ``dispatch_periods`` rows from silver ``dispatch_intervals`` and ``rate_limits``.

    ``intervals`` and ``limits`` are the rows of one day (schemas/tables/dispatch_intervals.yaml,
    rate_limits.yaml); ``opening_debt`` is the previous day's ``debt_state`` partition (its
    ``day`` is the day before; its debt enters at the next midnight); ``models`` the
    ``limiter_models`` of the day (none: classic everywhere); ``backlog`` the
    ``backlog_intervals`` (none: empty periods are never counted as starved); ``cursors`` the
    ``cursor_states`` (none: with dispatchThrottlingOnNonBacklogConsumerEnabled off, whether a
    delivery was charged is unknown and it is charged). Returns exactly the columns of
    schemas/tables/dispatch_periods.yaml, one row per input interval.

    Counting rules (``counting_rules`` via ``models``): with the non-backlog rule off, a row whose
    cursors were caught up at the latest snapshot at or before its start is not charged
    (``charge_rule``); cursor snapshots enter the one sort as zero-length marker rows, like the
    opening debt, and each row takes the latest state before it.
    """
    timeline = limit_timeline(limits)
    records = intervals.select(
        *SCOPE,
        "day",
        F.col("interval_start").alias("period_start"),
        "interval_seconds",
        "grain",
        "msgs",
        "bytes",
        "entries",
        "redelivered_msgs",
        "source",
        F.unix_micros("interval_start").alias("t0_us"),
        (F.unix_micros("interval_start") + _round(F.col("interval_seconds") * _US)).alias("t1_us"),
        F.lit(True).alias("is_record"),
        F.lit(None).cast("string").alias("_cursor_state"),
    )
    rows = records
    if opening_debt is not None:
        midnight = F.unix_micros(F.to_timestamp(F.date_add("day", 1)))
        markers = opening_debt.select(
            *SCOPE,
            F.date_add("day", 1).alias("day"),
            F.to_timestamp(F.date_add("day", 1)).alias("period_start"),
            F.lit(0.0).alias("interval_seconds"),
            F.lit("period").alias("grain"),
            F.col("debt_msgs").alias("msgs"),
            F.col("debt_bytes").alias("bytes"),
            F.lit(None).cast("long").alias("entries"),
            F.lit(None).cast("long").alias("redelivered_msgs"),
            F.lit("debt_state").alias("source"),
            midnight.alias("t0_us"),
            midnight.alias("t1_us"),
            F.lit(False).alias("is_record"),
            F.lit(None).cast("string").alias("_cursor_state"),
        ).where("debt_msgs > 0 OR debt_bytes > 0")
        rows = rows.unionByName(markers)
    if cursors is not None:
        rows = rows.unionByName(
            cursors.select(
                *SCOPE,
                F.to_date(F.timestamp_micros("at_us")).alias("day"),
                F.timestamp_micros("at_us").alias("period_start"),
                F.lit(0.0).alias("interval_seconds"),
                F.lit("period").alias("grain"),
                F.lit(0).cast("long").alias("msgs"),
                F.lit(0).cast("long").alias("bytes"),
                F.lit(None).cast("long").alias("entries"),
                F.lit(None).cast("long").alias("redelivered_msgs"),
                F.lit(CURSOR_SOURCE).alias("source"),
                F.col("at_us").alias("t0_us"),
                F.col("at_us").alias("t1_us"),
                F.lit(False).alias("is_record"),
                F.col("cursor_state").alias("_cursor_state"),
            )
        )

    rows = _with_model(_with_limit(rows, timeline, "t0_us", "l_"), models)
    token_bucket = F.col("limiter_model") == TOKEN_BUCKET
    count_unit = (
        F.when(F.col("l_count_entries") & F.col("entries").isNotNull(), F.lit("entries"))
        .when(F.col("l_count_entries"), F.lit("msgs-no-entries"))
        .otherwise(F.lit("msgs"))
    )
    rows = rows.withColumn("count_unit", count_unit).withColumn(
        "_unit_msgs",
        F.when(F.col("is_record") & (F.col("count_unit") == "entries"), F.col("entries")).otherwise(
            F.col("msgs")
        ),
    )
    delivered = {"msgs": "counted_msgs", "bytes": "counted_bytes"}
    # Every operator from here on copies the rows it passes on (shuffle, sort, two windows):
    # only what the recursion and the output need goes on, the quota integrated up to the row's
    # start and end (``_q0``, ``_q1``) instead of the limit row it came from.
    rows = rows.select(
        *SCOPE, "day", "period_start", "interval_seconds", "grain", "msgs", "bytes", "entries",
        "redelivered_msgs", "source", "t0_us", "is_record", "count_unit", "_unit_msgs", "limiter_model",
        "_cursor_state", "throttle_non_backlog", F.col("throttle_filtered").alias("filtered_entries_charged"),
        F.col("l_period_seconds").alias("rate_period_seconds"),
        F.col("l_msg_q").alias("msg_limit"),
        F.col("l_byte_q").alias("byte_limit"),
        F.col("l_msg_source").alias("msg_source"),
        F.col("l_byte_source").alias("byte_source"),
        *[
            column
            for name, m in MEASURES
            for column in (
                _quota_until(m, F.col("t0_us"), "l_").alias(f"_q0_{name}"),
                _quota_until(m, F.col("t1_us"), "l_").alias(f"_q1_{name}"),
                F.when(token_bucket, F.col(f"l_{m}_seg_tb")).otherwise(F.col(f"l_{m}_seg")).alias(f"_seg_{name}"),
            )
        ],
    )  # fmt: skip

    # The one shuffle: all rows of a scope together, in time order (opening debt first).
    scope = Window.partitionBy(*SCOPE).orderBy("t0_us", "is_record")
    running = scope.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = scope.rowsBetween(Window.unboundedPreceding, -1)

    # AbstractBaseDispatcher charges a delivery only if dispatchThrottlingOnNonBacklogConsumerEnabled
    # or the subscription's cursor is inactive (backlogged).
    state = F.last("_cursor_state", ignorenulls=True).over(running)
    rows = rows.withColumn(
        "charge_rule",
        F.when(F.col("throttle_non_backlog"), F.lit(CHARGED))
        .when(state.isNull(), F.lit(CHARGED_BACKLOG_UNKNOWN))
        .when(state == CAUGHT_UP, F.lit(NOT_CHARGED))
        .when(state == MIXED, F.lit(CHARGED_PARTLY))
        .otherwise(F.lit(CHARGED)),
    )
    # The opening debt is the limiter's state, not a delivery: always carried.
    exempt = F.col("is_record") & (F.col("charge_rule") == NOT_CHARGED)
    rows = rows.withColumn("counted_msgs", F.when(exempt, F.lit(0)).otherwise(F.col("_unit_msgs"))).withColumn(
        "counted_bytes", F.when(exempt, F.lit(0)).otherwise(F.col("bytes"))
    )
    for name, m in MEASURES:
        rows = rows.withColumn(f"_c_{name}", F.sum(delivered[name]).over(running))
    for name, m in MEASURES:
        d = F.col(delivered[name])
        q_start, q_end = F.col(f"_q0_{name}"), F.col(f"_q1_{name}")
        limited = F.col(f"{m}_limit").isNotNull()
        rows = (
            rows.withColumn(f"quota_{name}", F.when(limited, q_end - q_start))
            # P: running value just before the row (after the gap drained); S: just after it.
            .withColumn(f"_p_{name}", F.col(f"_c_{name}") - d - q_start)
            .withColumn(f"_s_{name}", F.col(f"_c_{name}") - q_end)
            .withColumn(
                f"_v_{name}",
                F.when(
                    limited,
                    F.struct(
                        (-F.col(f"_seg_{name}")).alias("neg_seg"),
                        F.least(F.col(f"_p_{name}"), F.col(f"_s_{name}")).alias("v"),
                    ),
                ),
            )
        )
    for name, m in MEASURES:
        rows = rows.withColumn(f"_prev_{name}", F.min(f"_v_{name}").over(before))
    for name, m in MEASURES:
        d = F.col(delivered[name])
        seg = F.col(f"_seg_{name}")
        prev = F.col(f"_prev_{name}")
        p, s = F.col(f"_p_{name}"), F.col(f"_s_{name}")
        floor = F.least(
            F.when(prev["neg_seg"] == -seg, prev["v"]),
            p,
            F.when(seg == 0, F.lit(0)),  # day start, before any stretch without limit
        )
        limited = F.col(f"{m}_limit").isNotNull()
        # x: the recursion's state before and after the row. Classic: the debt itself. Token
        # bucket (capacity = the limit, refilled by the quota, starts full): capacity - tokens,
        # so tokens may go negative by x - capacity (the debt), and the allowance is the tokens
        # at the start plus the refill during the row.
        x_in, x_out = p - floor, s - F.least(floor, s)
        cap, quota = F.col(f"{m}_limit"), F.col(f"quota_{name}")
        debt_in = F.when(token_bucket, F.greatest(F.lit(0), x_in - cap)).otherwise(x_in)
        allowed = F.greatest(F.lit(0), F.when(token_bucket, cap + quota - x_in).otherwise(quota - x_in))
        debt_out = F.when(token_bucket, F.greatest(F.lit(0), x_out - cap)).otherwise(x_out)
        rows = (
            rows.withColumn(f"debt_in_{name}", F.when(limited, debt_in).otherwise(F.lit(0)))
            .withColumn(f"allowed_{name}", F.when(limited, allowed))
            .withColumn(
                f"over_{name}",
                F.when(limited, F.greatest(F.lit(0), d - F.col(f"allowed_{name}"))).otherwise(F.lit(0)),
            )
            .withColumn(f"debt_out_{name}", F.when(limited, debt_out).otherwise(F.lit(0)))
            .withColumn(f"tokens_out_{name}", F.when(limited & token_bucket, cap - x_out))
            .withColumn(f"_x_out_{name}", F.when(limited, x_out))
        )
    rows = rows.where(F.col("source") != CURSOR_SOURCE)
    out = rows.transform(lambda r: _with_starved_empty(r, backlog)).where("is_record").transform(_over_causes).select(
        "day",
        *SCOPE,
        "period_start",
        "interval_seconds",
        "grain",
        "rate_period_seconds",
        "count_unit",
        "msgs",
        "bytes",
        "entries",
        "redelivered_msgs",
        "counted_msgs",
        "msg_limit",
        "byte_limit",
        "quota_msgs",
        "quota_bytes",
        *[
            f"{c}_{name}"
            for name, _ in MEASURES
            for c in ("debt_in", "allowed", "over", "debt_out")
        ],
        (
            (F.col("charge_rule") != NOT_CHARGED)
            & (
                F.coalesce(F.col("allowed_msgs") == 0, F.lit(False))
                | F.coalesce(F.col("allowed_bytes") == 0, F.lit(False))
            )
        ).alias("starved"),
        "starved_empty_periods",
        "over_batch_msgs",
        "over_redelivery_msgs",
        "over_redelivery_bytes",
        "over_approx_bytes",
        "msg_source",
        "byte_source",
        "source",
        "limiter_model",
        "tokens_out_msgs",
        "tokens_out_bytes",
        "counted_bytes",
        "charge_rule",
        "filtered_entries_charged",
    )
    return out


def backlog_intervals(snapshots: DataFrame) -> DataFrame:
    """Stretches with backlog per dispatch scope, from silver ``cursor_snapshots``: (level,
    cluster, _bk, from_us, to_us), each snapshot with msgBacklog > 0 until the next snapshot of
    the scope (open-ended for the last). A subscription's own backlog; a topic partition's or a
    broker's: the sum over its subscriptions at the same collection."""
    levels = {
        "subscription": ["topic", "subscription"],
        "topic": ["topic"],
        "broker": ["broker"],
    }
    frames = []
    for level, keys in levels.items():
        summed = snapshots.groupBy("cluster", *keys, "snapshot_at").agg(F.sum("msg_backlog").alias("backlog"))
        series = Window.partitionBy("cluster", *keys).orderBy("snapshot_at")
        frames.append(
            summed.select(
                F.lit(level).alias("level"),
                "cluster",
                F.concat_ws("\u0000", *keys).alias("_bk"),
                F.unix_micros("snapshot_at").alias("from_us"),
                F.unix_micros(F.lead("snapshot_at").over(series)).alias("to_us"),
                "backlog",
            ).where("backlog > 0")
        )
    return frames[0].unionByName(frames[1]).unionByName(frames[2]).drop("backlog")


CURSOR_SOURCE = "cursor_snapshots"
CAUGHT_UP, BACKLOGGED, MIXED = "caught-up", "backlogged", "mixed"
CHARGED, NOT_CHARGED = "charged", "not-charged-caught-up"
CHARGED_PARTLY, CHARGED_BACKLOG_UNKNOWN = "charged-partly-caught-up", "charged-backlog-unknown"


def cursor_states(snapshots: DataFrame, models: DataFrame) -> DataFrame:
    """Whether each dispatch scope's cursors were caught up, per snapshot of silver
    ``cursor_snapshots``, on the brokers whose ``counting_rules`` do not throttle non-backlog
    consumers: (SCOPE, at_us, cursor_state).

    Pulsar charges a delivery only if the subscription's cursor is inactive (when the rule is
    off); a cursor is active while the subscription has consumers and fewer than
    managedLedgerCursorBackloggedThreshold entries of backlog (PersistentTopic
    checkBackloggedCursors). Snapshots carry msgBacklog in messages, never fewer than the
    entries: below the threshold in messages is below it in entries, and a batched backlog
    above it in messages only is taken as backlogged (charged: an upper bound). A subscription
    is caught-up or backlogged; a topic partition or broker (its subscriptions with consumers,
    at the same collection) caught-up when all are, backlogged when none is, else mixed."""
    off = models.where(~F.col("throttle_non_backlog")).select(
        F.col("cluster").alias("m_cluster"), F.col("broker").alias("m_broker"), "cursor_backlogged_threshold"
    )
    snaps = snapshots.join(
        F.broadcast(off), (F.col("cluster") == F.col("m_cluster")) & (F.col("broker") == F.col("m_broker"))
    ).select(
        "cluster", "broker", "topic", "subscription", "snapshot_at",
        F.when(
            F.col("consumers") > 0,
            F.coalesce(F.col("msg_backlog") < F.col("cursor_backlogged_threshold"), F.lit(False)).cast("int"),
        ).alias("_up"),
    )  # fmt: skip
    frames = []
    for level, keys in (("subscription", ["topic", "subscription"]), ("topic", ["topic"]), ("broker", [])):
        agg = snaps.groupBy("cluster", "broker", *keys, "snapshot_at").agg(
            F.min("_up").alias("_all"), F.max("_up").alias("_any")
        )
        frames.append(
            agg.select(
                F.lit(level).alias("level"),
                "cluster",
                "broker",
                *[F.col(k) if k in keys else F.lit(None).cast("string").alias(k) for k in ("topic", "subscription")],
                F.unix_micros("snapshot_at").alias("at_us"),
                F.when(F.col("_all") == 1, F.lit(CAUGHT_UP))
                .when(F.coalesce(F.col("_any"), F.lit(0)) == 0, F.lit(BACKLOGGED))
                .otherwise(F.lit(MIXED))
                .alias("cursor_state"),
            )
        )
    return frames[0].unionByName(frames[1]).unionByName(frames[2])


def _backlog_key() -> Column:
    return (
        F.when(F.col("level") == "subscription", F.concat_ws("\u0000", "topic", "subscription"))
        .when(F.col("level") == "topic", F.col("topic"))
        .otherwise(F.col("broker"))
    )


def _with_starved_empty(rows: DataFrame, backlog: DataFrame | None) -> DataFrame:
    """``starved_empty_periods``: periods without a record whose allowance is 0 because of debt
    while the scope has backlog (the latest cursor snapshot at or before the period start shows
    msgBacklog > 0), in the gap after each row up to the next row or midnight. The gap after the
    opening debt (before the day's first row) is counted on that first row.

    After a row the state x drains by the limit each period: the allowance stays 0 for
    floor(x / limit) periods (classic) or floor(x / limit) - 1 (token bucket, which also has the
    refill); messages or bytes, whichever lasts longer. The limit of the row is used for the
    whole gap. Periods before the first snapshot known are not counted (no backlog known)."""
    if backlog is None:
        return rows.withColumn("starved_empty_periods", F.lit(0).cast("long"))
    scope = Window.partitionBy(*SCOPE).orderBy("t0_us", "is_record")
    p_us = F.col("rate_period_seconds").cast("long") * F.lit(_US)
    t1 = F.col("t0_us") + _round(F.col("interval_seconds") * _US)
    zero = F.greatest(
        *[
            F.coalesce(
                F.when(
                    F.col("limiter_model") == TOKEN_BUCKET,
                    F.greatest(F.lit(0), F.floor(F.col(f"_x_out_{name}") / F.col(f"{m}_limit")) - 1),
                ).otherwise(F.floor(F.col(f"_x_out_{name}") / F.col(f"{m}_limit"))),
                F.lit(0),
            )
            for name, m in MEASURES
        ]
    )
    next_t0 = F.lead("t0_us").over(scope)
    end = F.coalesce(next_t0, F.unix_micros(F.to_timestamp(F.date_add("day", 1))))
    gaps = (
        rows.withColumn("_g_from", t1)
        .withColumn("_g_p", p_us)
        .withColumn("_g_n", F.least(F.floor((end - F.col("_g_from")) / F.col("_g_p")), zero).cast("long"))
        # The opening debt's gap belongs to the day's first row.
        .withColumn("_g_owner", F.when(F.col("is_record"), F.col("t0_us")).otherwise(next_t0))
        .where("_g_n > 0 AND _g_owner IS NOT NULL")
        .select(*SCOPE, "_g_owner", "_g_from", "_g_p", "_g_n", _backlog_key().alias("_bk"))
    )
    b = backlog.select(
        F.col("level").alias("b_level"), F.col("cluster").alias("b_cluster"), F.col("_bk").alias("b_bk"),
        "from_us", "to_us",
    )
    g_to = F.col("_g_from") + F.col("_g_n") * F.col("_g_p")
    joined = gaps.join(
        b,
        (F.col("level") == F.col("b_level"))
        & (F.col("cluster") == F.col("b_cluster"))
        & (F.col("_bk") == F.col("b_bk"))
        & (F.col("from_us") < g_to)
        & (F.col("to_us").isNull() | (F.col("to_us") > F.col("_g_from"))),
    )
    lo = F.greatest(F.col("from_us"), F.col("_g_from")) - F.col("_g_from")
    hi = F.least(F.coalesce(F.col("to_us"), g_to), g_to) - F.col("_g_from")
    # Period starts _g_from + k * p (k >= 0) inside [lo, hi): ceil(hi / p) - ceil(lo / p).
    def ceil_div(x: Column) -> Column:
        return F.floor((x + F.col("_g_p") - 1) / F.col("_g_p"))

    counted = joined.groupBy(*SCOPE, "_g_owner").agg(F.sum(ceil_div(hi) - ceil_div(lo)).alias("_starved_empty"))
    c = counted.select(*[F.col(k).alias(f"c_{k}") for k in SCOPE], "_g_owner", "_starved_empty")
    cond = F.col("t0_us") == F.col("_g_owner")
    for k in SCOPE:
        cond = cond & F.col(k).eqNullSafe(F.col(f"c_{k}"))
    return (
        rows.join(c, cond & F.col("is_record"), "left")
        .withColumn("starved_empty_periods", F.coalesce(F.col("_starved_empty"), F.lit(0)).cast("long"))
        .drop(*[f"c_{k}" for k in SCOPE], "_g_owner", "_starved_empty")
    )


def _over_causes(rows: DataFrame) -> DataFrame:
    """Split each row's over-delivery into the causes the telemetry can show (seed 002,
    "Limitations"): redelivery/seek/replay first (counted again by the broker), then batch
    entries counted as one message when sizing reads (at most msgs - entries); the rest of the
    messages is unexplained (concurrent replay and normal dispatch, read size). Bytes: what
    redelivery does not explain is the byte approximation: Pulsar sizes a read from the byte
    allowance by an estimated (average) entry size and only counts the real bytes after
    dispatching them, so any byte over-delivery comes from that estimate."""
    redelivered = F.coalesce(F.col("redelivered_msgs"), F.lit(0))
    per_msg = lambda total: F.when(  # noqa: E731 - one-line helper for a ratio
        F.col("msgs") > 0, _round(redelivered * total / F.col("msgs"))
    ).otherwise(F.lit(0))
    red_units = F.when(F.col("count_unit") == "entries", per_msg(F.col("entries"))).otherwise(redelivered)
    batch_room = F.when(
        (F.col("count_unit") == "msgs") & F.col("entries").isNotNull(),
        F.greatest(F.lit(0), F.col("msgs") - F.col("entries")),
    ).otherwise(F.lit(0))
    return (
        rows.withColumn("over_redelivery_msgs", F.least(F.col("over_msgs"), red_units))
        .withColumn(
            "over_batch_msgs",
            F.least(F.col("over_msgs") - F.col("over_redelivery_msgs"), batch_room),
        )
        .withColumn("over_redelivery_bytes", F.least(F.col("over_bytes"), per_msg(F.col("bytes"))))
        .withColumn("over_approx_bytes", F.col("over_bytes") - F.col("over_redelivery_bytes"))
    )


# ------------------------------------------------------------------------------ debt_state


def closing_debt(
    periods: DataFrame,
    limits: DataFrame,
    opening_debt: DataFrame | None,
    day: date,
) -> DataFrame:
    """``debt_state`` rows for ``day``: each scope's debt at midnight after ``day``.

    From the scope's last row of the day, the debt drains through the empty periods up to
    midnight (to 0 if a stretch without limit comes in between). Scopes that only carried
    opening debt drain through the whole day. Scopes of the day are all written (debt 0
    included), so a built day always has its partition.
    """
    timeline = limit_timeline(limits)
    last_row = Window.partitionBy(*SCOPE).orderBy(F.col("period_start").desc())
    last = (
        periods.withColumn("_n", F.row_number().over(last_row))
        .where("_n = 1")
        .select(
            *SCOPE,
            (F.unix_micros("period_start") + _round(F.col("interval_seconds") * _US)).alias(
                "at_us"
            ),
            *[
                F.coalesce(F.col(f"{m}_limit") - F.col(f"tokens_out_{name}"), F.col(f"debt_out_{name}")).alias(
                    f"debt_{name}"
                )
                for name, m in MEASURES
            ],
            F.col("period_start").alias("last_period_start"),
            "limiter_model",
        )
    )
    midnight_start = F.unix_micros(F.to_timestamp(F.lit(day.isoformat())))
    if opening_debt is not None:
        carried = _scope_join(opening_debt, last.select(*SCOPE), "left_anti")
        last = last.unionByName(
            carried.select(
                *SCOPE,
                midnight_start.alias("at_us"),
                "debt_msgs",
                "debt_bytes",
                F.lit(None).cast("timestamp").alias("last_period_start"),
                F.coalesce("limiter_model", F.lit(CLASSIC)).alias("limiter_model"),
            )
        )
    end_us = (day + timedelta(days=1) - date(1970, 1, 1)).days * 86_400 * _US
    joined = _with_limit(last, timeline, "at_us", "a_").withColumn("_end_us", F.lit(end_us))
    joined = _with_limit(joined, timeline, "_end_us", "e_")
    out = joined
    for name, m in MEASURES:
        tb = F.col("limiter_model") == TOKEN_BUCKET
        reset = (
            F.col(f"a_{m}_q").isNull()
            | F.col(f"e_{m}_q").isNull()
            | F.when(tb, F.col(f"e_{m}_seg_tb") != F.col(f"a_{m}_seg_tb")).otherwise(
                F.col(f"e_{m}_seg") != F.col(f"a_{m}_seg")
            )
        )
        drain = _quota_until(m, F.col("_end_us"), "e_") - _quota_until(m, F.col("at_us"), "a_")
        out = out.withColumn(
            f"debt_{name}",
            F.when(reset, F.lit(0)).otherwise(
                F.greatest(F.lit(0), F.col(f"debt_{name}") - F.greatest(F.lit(0), drain))
            ),
        )
    return out.select(
        F.lit(day).cast("date").alias("day"), *SCOPE, "debt_msgs", "debt_bytes", "last_period_start", "limiter_model"
    )


def _scope_join(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
    """Join on the scope (null-safe: topic and subscription are null above their level).

    The right side's columns come back prefixed ``r_`` (fresh columns: both sides often derive
    from the same periods, which a plain self-join would find ambiguous)."""
    r = right.select(*[F.col(c).alias(f"r_{c}") for c in right.columns])
    cond = F.lit(True)
    for c in SCOPE:
        cond = cond & F.col(c).eqNullSafe(F.col(f"r_{c}"))
    return left.join(r, cond, how)


# ------------------------------------------------------------------- Pulsar's throttle counters

THROTTLE_LEVELS = ("subscription", "topic", "broker")


def throttle_events(topic_stats: DataFrame) -> DataFrame:
    """PIP-406 counters of the day per dispatch scope: (SCOPE, pulsar_throttled_msg_events,
    pulsar_throttled_bytes_events).

    Each subscription's ``dispatchThrottled{Msg,Bytes}EventsBy{Subscription,Topic,Broker}Limit``
    counts since its dispatcher started: the day's events are the increases between successive
    snapshots of the day (a lower value after a topic reload counts from 0). The subscription
    limit's events are the subscription scope's; the topic limit's, summed over the topic
    partition's subscriptions, the topic scope's; the broker limit's, summed over the broker,
    the broker scope's. Null where Pulsar (< 4.0) does not report them.
    """
    series = Window.partitionBy("cluster", "broker", "topic", "subscription").orderBy("collected_at")
    subs = topic_stats.where(F.col("subscription").isNotNull())
    columns = []
    for level in THROTTLE_LEVELS:
        for unit in ("msg", "bytes"):
            c = F.col(f"dispatch_throttled_{unit}_events_by_{level}_limit")
            before = F.lag(c).over(series)
            # First snapshot of the day: no increase seen yet (0); reset: counted from 0.
            columns.append(
                F.when(c.isNull(), F.lit(None))
                .when(before.isNull(), F.lit(0))
                .when(c >= before, c - before)
                .otherwise(c)
                .alias(f"{level}_{unit}")
            )
    deltas = subs.select("cluster", "broker", "topic", "subscription", *columns)

    def per(level: str, keys: list[str]) -> DataFrame:
        agg = deltas.groupBy(*keys).agg(
            F.sum(f"{level}_msg").alias("pulsar_throttled_msg_events"),
            F.sum(f"{level}_bytes").alias("pulsar_throttled_bytes_events"),
        )
        return agg.select(
            F.lit(level).alias("level"),
            *[F.col(k) if k in keys else F.lit(None).cast("string").alias(k) for k in SCOPE[1:]],
            "pulsar_throttled_msg_events",
            "pulsar_throttled_bytes_events",
        )

    return (
        per("subscription", ["cluster", "broker", "topic", "subscription"])
        .unionByName(per("topic", ["cluster", "broker", "topic"]))
        .unionByName(per("broker", ["cluster", "broker"]))
    )


# ---------------------------------------------------------------------------- dispatch_daily


def dispatch_daily(
    periods: DataFrame,
    opening_debt: DataFrame | None,
    closing: DataFrame,
    day: date,
    events: DataFrame | None = None,
    models: DataFrame | None = None,
) -> DataFrame:
    """Gold ``dispatch_daily``: one row per scope of the day (with rows or with carried debt).

    ``events``: ``throttle_events`` of the day, put next to ``periods_exhausted`` (where the
    model says the allowance was used up); null when Pulsar did not report them. ``models``:
    the day's ``limiter_models``, for ``limiter_model_source`` (null without)."""
    agg = periods.groupBy(*SCOPE).agg(
        F.when(F.countDistinct("grain") > 1, F.lit("mixed")).otherwise(F.first("grain")).alias("grain"),
        F.count(F.lit(1)).alias("periods"),
        F.sum("msgs").alias("msgs"),
        F.sum("bytes").alias("bytes"),
        F.sum(((F.col("over_msgs") > 0) | (F.col("over_bytes") > 0)).cast("int")).alias("periods_over"),
        F.sum((F.col("over_msgs") > 0).cast("int")).alias("periods_over_msgs"),
        F.sum((F.col("over_bytes") > 0).cast("int")).alias("periods_over_bytes"),
        F.sum("over_msgs").alias("excess_msgs"),
        F.sum("over_bytes").alias("excess_bytes"),
        F.max("debt_out_msgs").alias("max_debt_msgs"),
        F.max("debt_out_bytes").alias("max_debt_bytes"),
        (F.sum(F.col("starved").cast("int")) + F.sum("starved_empty_periods")).alias("periods_starved"),
        F.sum(
            (
                (F.col("charge_rule") != NOT_CHARGED)
                & (
                    F.coalesce(F.col("counted_msgs") >= F.col("allowed_msgs"), F.lit(False))
                    | F.coalesce(F.col("counted_bytes") >= F.col("allowed_bytes"), F.lit(False))
                )
            ).cast("int")
        ).alias("periods_exhausted"),
        F.sum((F.col("charge_rule") == NOT_CHARGED).cast("int")).alias("periods_not_charged"),
        F.sum("over_batch_msgs").alias("_batch_msgs"),
        F.sum("over_redelivery_msgs").alias("_redelivery_msgs"),
        F.sum("over_redelivery_bytes").alias("_redelivery_bytes"),
        F.sum("over_approx_bytes").alias("_approx_bytes"),
        F.max("limiter_model").alias("_model"),  # one per scope: the model of its broker that day
    )
    out = _scope_join(agg, closing.select(*SCOPE, "debt_msgs", "debt_bytes", "limiter_model"), "full_outer").select(
        *[F.coalesce(F.col(k), F.col(f"r_{k}")).alias(k) for k in SCOPE],
        *[k for k in agg.columns if k not in SCOPE and k != "_model"],
        F.coalesce(F.col("_model"), F.col("r_limiter_model"), F.lit(CLASSIC)).alias("limiter_model"),
        F.coalesce(F.col("r_debt_msgs"), F.lit(0)).alias("closing_debt_msgs"),
        F.coalesce(F.col("r_debt_bytes"), F.lit(0)).alias("closing_debt_bytes"),
    )
    if opening_debt is not None:
        columns = out.columns
        out = _scope_join(out, opening_debt.select(*SCOPE, "debt_msgs", "debt_bytes"), "left").select(
            *columns,
            F.coalesce(F.col("r_debt_msgs"), F.lit(0)).alias("opening_debt_msgs"),
            F.coalesce(F.col("r_debt_bytes"), F.lit(0)).alias("opening_debt_bytes"),
        )
    else:
        out = out.withColumn("opening_debt_msgs", F.lit(0)).withColumn("opening_debt_bytes", F.lit(0))
    counts = [
        "periods", "msgs", "bytes", "periods_over", "periods_over_msgs", "periods_over_bytes",
        "excess_msgs", "excess_bytes", "max_debt_msgs", "max_debt_bytes", "periods_starved", "periods_exhausted",
        "periods_not_charged", "_batch_msgs", "_redelivery_msgs", "_redelivery_bytes", "_approx_bytes",
    ]  # fmt: skip
    out = out.fillna(0, subset=counts).fillna("period", subset=["grain"])
    if events is not None:
        columns = out.columns
        out = _scope_join(out, events, "left").select(
            *columns,
            F.col("r_pulsar_throttled_msg_events").alias("pulsar_throttled_msg_events"),
            F.col("r_pulsar_throttled_bytes_events").alias("pulsar_throttled_bytes_events"),
        )
    else:
        out = out.withColumn("pulsar_throttled_msg_events", F.lit(None).cast("long")).withColumn(
            "pulsar_throttled_bytes_events", F.lit(None).cast("long")
        )

    if models is not None:
        m = models.select(
            F.col("cluster").alias("m_cluster"), F.col("broker").alias("m_broker"), "limiter_model_source"
        )
        cond = (F.col("cluster") == F.col("m_cluster")) & F.col("broker").eqNullSafe(F.col("m_broker"))
        out = out.join(F.broadcast(m), cond, "left").drop("m_cluster", "m_broker")
    else:
        out = out.withColumn("limiter_model_source", F.lit(None).cast("string"))

    def share(part: str | Column, total: str) -> Column:
        part = F.col(part) if isinstance(part, str) else part
        return F.when(F.col(total) > 0, part / F.col(total))

    out = (
        out.withColumn("day", F.lit(day).cast("date"))
        .withColumn("share_batch_msgs", share("_batch_msgs", "excess_msgs"))
        .withColumn("share_redelivery_msgs", share("_redelivery_msgs", "excess_msgs"))
        .withColumn(
            "share_other_msgs",
            share(F.col("excess_msgs") - F.col("_batch_msgs") - F.col("_redelivery_msgs"), "excess_msgs"),
        )
        .withColumn("share_redelivery_bytes", share("_redelivery_bytes", "excess_bytes"))
        .withColumn("share_approx_bytes", share("_approx_bytes", "excess_bytes"))
    )
    causes = [
        ("batch", F.col("share_batch_msgs")),
        ("redelivery", F.greatest("share_redelivery_msgs", "share_redelivery_bytes")),
        ("byte-approximation", F.col("share_approx_bytes")),
        ("other", F.col("share_other_msgs")),
    ]
    best = F.greatest(*[F.coalesce(v, F.lit(-1.0)) for _, v in causes])
    main = F.lit(None).cast("string")
    for label, value in reversed(causes):  # first listed wins a tie
        main = F.when(F.coalesce(value, F.lit(-1.0)) == best, F.lit(label)).otherwise(main)
    out = out.withColumn(
        "main_cause", F.when((F.col("excess_msgs") > 0) | (F.col("excess_bytes") > 0), main)
    )
    return out.drop("_batch_msgs", "_redelivery_msgs", "_redelivery_bytes", "_approx_bytes")


def worst_scopes(daily: DataFrame, limit: int = 10) -> DataFrame:
    """The worst scopes of a day: most periods over quota, then most excess, then most debt.

    For ``brokerlens build`` output, the report and alerts (``read_table("dispatch_daily")``
    filtered to a day, then this)."""
    return (
        daily.where(
            "periods_over > 0 OR periods_starved > 0 OR closing_debt_msgs > 0 OR closing_debt_bytes > 0"
        )
        .orderBy(
            F.col("periods_over").desc(),
            F.col("excess_msgs").desc(),
            F.col("excess_bytes").desc(),
            F.col("periods_starved").desc(),
            F.col("max_debt_msgs").desc(),
            *SCOPE,
        )
        .limit(limit)
    )


def _scope_label(row) -> str:
    parts = [row["level"], row["cluster"], row["broker"] if row["level"] == "broker" else row["topic"]]
    if row["subscription"] is not None:
        parts.append(row["subscription"])
    return " ".join(str(p) for p in parts)


def worst_scope_lines(daily: DataFrame, limit: int = 10) -> list[str]:
    rows = worst_scopes(daily, limit).collect()  # at most `limit` rows
    if not rows:
        return ["dispatch: no scope over quota or starved"]
    lines = ["dispatch, worst scopes (periods over / excess msgs, bytes / max debt msgs, bytes / starved / main cause):"]
    for r in rows:
        lines.append(
            f"  {_scope_label(r)}: {r['periods_over']}/{r['periods']} over, "
            f"excess {r['excess_msgs']} msgs {r['excess_bytes']} B, "
            f"max debt {r['max_debt_msgs']} msgs {r['max_debt_bytes']} B, "
            f"{r['periods_starved']} starved, cause {r['main_cause'] or '-'}"
        )
    return lines


# ------------------------------------------------------------------------------ build step


def build_dispatch(day: date, settings: Settings) -> StageResult:
    """Build step: ``dispatch_periods``, ``debt_state`` and ``dispatch_daily`` for ``day``.

    Starts from the closing debt of ``day - 1`` in ``debt_state`` (zero debt if that day was
    not built). If ``day``'s closing debt changes and ``day + 1`` is already built, ``day + 1``
    is re-built from it, and so on: later days never keep a debt computed from an outdated
    day. The cascade stops at the first day whose closing debt does not change.
    """
    result = StageResult("build dispatch", day)
    built = _built_days(settings)
    current, first = day, True
    while True:
        changed = _build_one(current, settings, result, summary=first)
        following = current + timedelta(days=1)
        if not changed or following not in built:
            break
        result.lines.append(
            f"dispatch: closing debt of {current} changed; re-building {following} from it"
        )
        log.info("closing debt of %s changed: re-building %s", current, following)
        current, first = following, False
    if current != day:
        result.metrics["dispatch_days_rebuilt"] = (current - day).days
    return result


def _built_days(settings: Settings) -> set[date]:
    state = read_table("debt_state", settings=settings)
    return {r["day"] for r in state.select("day").distinct().collect()}  # one row per built day


def _build_one(day: date, settings: Settings, result: StageResult, summary: bool) -> bool:
    """Build one day; True when its closing debt differs from the one stored before."""
    intervals = read_table("dispatch_intervals", settings=settings).where(F.col("day") == F.lit(day))
    limits = read_table("rate_limits", settings=settings).where(F.col("day") == F.lit(day))
    state = read_table("debt_state", settings=settings)
    opening = state.where(F.col("day") == F.lit(day - timedelta(days=1))).cache()
    previous = state.where(F.col("day") == F.lit(day)).cache()
    previous.count()  # pin the stored closing debt before it is replaced

    models = _day_models(day, settings, intervals, opening).cache()
    # The day before too: the latest snapshot at or before the day's first periods.
    snapshots = read_table("cursor_snapshots", settings=settings).where(
        F.col("day").between(F.lit(day - timedelta(days=1)), F.lit(day))
    )
    partition = [{"day": day}]
    result.writes.append(
        write_table(
            dispatch_periods(
                intervals, limits, opening, models, backlog_intervals(snapshots), cursor_states(snapshots, models)
            ),
            "dispatch_periods",
            "replace",
            partition,
            settings=settings,
        )
    )
    periods = read_table("dispatch_periods", settings=settings).where(F.col("day") == F.lit(day))
    closing = closing_debt(periods, limits, opening, day).cache()
    old = previous.select(*SCOPE, "debt_msgs", "debt_bytes")
    new = closing.select(*SCOPE, "debt_msgs", "debt_bytes")
    changed = bool(old.exceptAll(new).limit(1).count() or new.exceptAll(old).limit(1).count())
    result.writes.append(merge_table(closing, "debt_state", partition, settings=settings))
    topic_stats = read_table("bronze_topic_stats", settings=settings).where(F.col("day") == F.lit(day))
    daily = dispatch_daily(periods, opening, closing, day, throttle_events(topic_stats), models)
    result.writes.append(write_table(daily, "dispatch_daily", "replace", partition, settings=settings))
    if summary:
        stored = read_table("dispatch_daily", settings=settings).where(F.col("day") == F.lit(day))
        totals = stored.agg(
            F.count(F.lit(1)).alias("scopes"),
            F.sum((F.col("periods_over") > 0).cast("int")).alias("scopes_over"),
            F.sum(F.col("periods_starved")).alias("periods_starved"),
        ).first()
        result.metrics.update(
            dispatch_scopes=totals["scopes"],
            dispatch_scopes_over=totals["scopes_over"] or 0,
            dispatch_periods_starved=totals["periods_starved"] or 0,
        )
        result.lines.extend(worst_scope_lines(stored))
        result.lines.extend(
            f"dispatch: {r['cluster']} {r['broker']}: {r['limiter_model']} limiter ({r['limiter_model_source']}); "
            f"non-backlog consumers {'charged' if r['throttle_non_backlog'] else 'not charged'}, filtered entries "
            f"{'charged' if r['throttle_filtered'] else 'not charged'} ({r['counting_rules_source']})"
            for r in models.orderBy("cluster", "broker").collect()  # one row per broker
        )
        if opening.limit(1).count() == 0:
            result.lines.append(
                f"dispatch: no debt_state rows for {day - timedelta(days=1)}: started from zero debt"
            )
    opening.unpersist()
    previous.unpersist()
    closing.unpersist()
    models.unpersist()
    return changed




def _day_models(day: date, settings: Settings, intervals: DataFrame, opening: DataFrame) -> DataFrame:
    """``limiter_models`` and ``counting_rules`` for the brokers with dispatch rows or carried debt
    on ``day``."""
    brokers = intervals.select("cluster", "broker").unionByName(opening.select("cluster", "broker")).distinct()
    policies = read_table("bronze_policies", settings=settings).where(F.col("day") <= F.lit(day))
    metrics = version_metrics(day, settings)
    cfg = settings.dispatch
    defaults = {
        NON_BACKLOG_KEY: cfg.dispatch_throttling_on_non_backlog_consumer_enabled,
        FILTERED_KEY: cfg.dispatch_throttling_for_filtered_entries_enabled,
        BACKLOGGED_THRESHOLD_KEY: cfg.managed_ledger_cursor_backlogged_threshold,
    }
    rules = counting_rules(brokers, policies, day, defaults)
    return limiter_models(brokers, policies, metrics, day, cfg.limiter_model).join(
        rules, ["cluster", "broker"], "left"
    )
