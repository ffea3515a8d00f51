"""Gold ``dispatch_periods``: Lindley's recursion over each dispatch scope's rows in one sort and
one pass (``DispatchScan.java``), the debt, allowance and over-delivery per period under the
broker's limiter model and counting rules, and the over-delivery split by cause."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from brokerlens.platform.jars import DISPATCH_SCAN_FUNCTION

from .cursors import (
    BACKLOG_SOURCE,
    CAUGHT_UP,
    CHARGED,
    CHARGED_BACKLOG_UNKNOWN,
    CHARGED_PARTLY,
    CURSOR_SOURCE,
    MIXED,
    NOT_CHARGED,
    backlog_markers,
)
from .limits import MEASURES, US, limit_timeline, quota_until, round_half_up, with_limit
from .models import SCRAPE, TOKEN_BUCKET, TOKEN_BUCKETS, broker_credit, judged_as_bucket, with_model
from .scopes import SCOPE


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
    opening debt, and each row takes the latest state before it. The backlog enters the same
    way, for the starved empty periods the scan counts.
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
        (F.unix_micros("interval_start") + round_half_up(F.col("interval_seconds") * US)).alias("t1_us"),
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

    rows = with_model(with_limit(rows, timeline, "t0_us", "l_", scrape=F.col("grain") == SCRAPE), models)
    # Both token buckets are built anew, full, on every rate change; only the one refilled every
    # 16 ms lets a full bucket plus the period's refill through in one period.
    rebuilt = F.col("limiter_model").isin(*TOKEN_BUCKETS)
    # A snapshot interval is not aligned with the limiter's periods (the classic RateLimiter
    # renews on its own fixed schedule, the token bucket on the first read a period after its last
    # refill): it can hold the reads of one period more than its share of the quota. Judged like
    # that bucket, one period's quota of slack, so a limiter that held is never found over.
    token_bucket = judged_as_bucket()
    count_unit = (
        F.when(F.col("l_count_entries") & F.col("entries").isNotNull(), F.lit("entries"))
        .when(F.col("l_count_entries"), F.lit("msgs-no-entries"))
        .otherwise(F.lit("msgs"))
    )
    rows = rows.withColumn("count_unit", count_unit).withColumn(
        "_unit_msgs",
        F.when(F.col("is_record") & (F.col("count_unit") == "entries"), F.col("entries")).otherwise(F.col("msgs")),
    )
    # Every operator from here on copies the rows it passes on (shuffle, sort, the scan):
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
                quota_until(m, F.col("t0_us"), "l_").alias(f"_q0_{name}"),
                quota_until(m, F.col("t1_us"), "l_").alias(f"_q1_{name}"),
                F.when(rebuilt, F.col(f"l_{m}_seg_tb")).otherwise(F.col(f"l_{m}_seg")).alias(f"_seg_{name}"),
            )
        ],
    )  # fmt: skip
    if backlog is not None:
        # The recursion skips them: they need no limit, no model, nothing but their state.
        rows = rows.unionByName(backlog_markers(intervals, backlog), allowMissingColumns=True)

    # The one shuffle: all rows of a scope together, in time order (opening debt first), and
    # one pass over them (DispatchScan.java): the cursor state, what is counted, the
    # recursion's state before and after each row, and the starved empty periods after it.
    rows = scan(rows)

    # AbstractBaseDispatcher charges a delivery only if dispatchThrottlingOnNonBacklogConsumerEnabled
    # or the subscription's cursor is inactive (backlogged).
    state = F.col("_cursor_last")
    rows = rows.withColumn(
        "charge_rule",
        F.when(F.col("throttle_non_backlog"), F.lit(CHARGED))
        .when(state.isNull(), F.lit(CHARGED_BACKLOG_UNKNOWN))
        .when(state == CAUGHT_UP, F.lit(NOT_CHARGED))
        .when(state == MIXED, F.lit(CHARGED_PARTLY))
        .otherwise(F.lit(CHARGED)),
    )
    for name, m in MEASURES:
        d = F.col(f"counted_{name}")
        limited = F.col(f"{m}_limit").isNotNull()
        # x: the recursion's state before and after the row. Classic, and the token bucket
        # refilled once per period: the debt itself (the tokens at a period start are q - x).
        # Token bucket refilled every 16 ms (capacity = the limit, starts full): capacity -
        # tokens, so tokens may go negative by x - capacity (the debt), and the allowance is the
        # tokens at the start plus the refill during the row.
        x_in, x_out = F.col(f"_x_in_{name}"), F.col(f"_x_out_{name}")
        cap = F.col(f"{m}_limit")
        # A snapshot interval's bucket refills evenly and is capped at its ends; the broker's
        # bucket adds what accrued since its last refill (RateLimiter's renewal, AsyncTokenBucket's
        # once a period) only then, so it may hold what that cap dropped (the scan's credit):
        # without it, a short interval at steady throttle left the model a debt the broker
        # never had, found over in every interval after it.
        credit_in, credit_out = broker_credit("in", name), broker_credit("out", name)
        quota = F.when(limited, F.col(f"_q1_{name}") - F.col(f"_q0_{name}"))
        debt_in = F.when(token_bucket, F.greatest(F.lit(0), x_in - cap - credit_in)).otherwise(x_in)
        # The allowance before its floor at 0: negative when the debt is more than the row's quota.
        unfloored = F.when(token_bucket, cap + quota - x_in).otherwise(quota - x_in)
        debt_out = F.when(token_bucket, F.greatest(F.lit(0), x_out - cap - credit_out)).otherwise(x_out)
        rows = (
            rows.withColumn(f"debt_in_{name}", F.when(limited, debt_in).otherwise(F.lit(0)))
            .withColumn(f"allowed_{name}", F.when(limited, F.greatest(F.lit(0), unfloored)))
            .withColumn(f"credit_in_{name}", F.when(limited, credit_in).otherwise(F.lit(0)))
            # The allowance with the credit: the debt is net of it already, so once that debt
            # is more than the quota the credit allows nothing more.
            .withColumn(f"_allowed_with_credit_{name}", F.when(limited, F.greatest(F.lit(0), unfloored + credit_in)))
            .withColumn(
                f"over_{name}",
                F.when(limited, F.greatest(F.lit(0), d - F.col(f"_allowed_with_credit_{name}"))).otherwise(F.lit(0)),
            )
            .withColumn(f"debt_out_{name}", F.when(limited, debt_out).otherwise(F.lit(0)))
            .withColumn(f"quota_{name}", quota)
            .withColumn(f"tokens_out_{name}", F.when(limited & rebuilt, cap - x_out + credit_out))
        )
    out = (
        rows.where("is_record")
        .transform(_over_causes)
        .select(
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
            *[f"{c}_{name}" for name, _ in MEASURES for c in ("debt_in", "allowed", "credit_in", "over", "debt_out")],
            (
                (F.col("charge_rule") != NOT_CHARGED)
                & (F.coalesce(F.col("_allowed_with_credit_msgs") == 0, F.lit(False)) | F.coalesce(F.col("_allowed_with_credit_bytes") == 0, F.lit(False)))
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
    )
    return out


def scan(rows: DataFrame) -> DataFrame:
    """``rows`` through DispatchScan.java (see there for its columns): each scope's rows in
    ``(t0_us, is_record)`` order, in one pass. Spark SQL needs three window operators for this
    (the cursor state, then the running counted sums, then the running minimum of the
    recursion's floor), each holding a scope's day; the scan keeps a few numbers per scope. It is
    a table function of brokerlens' SQL extension (DispatchScanExtension.scala), so a Spark
    Connect session reaches it too; the planner brings each scope's rows together, sorted."""
    constants = (",".join(SCOPE), CAUGHT_UP, CURSOR_SOURCE, BACKLOG_SOURCE, SCRAPE, TOKEN_BUCKET)
    arguments = ", ".join(f"'{value}'" for value in constants)
    return rows.sparkSession.sql(f"SELECT * FROM {DISPATCH_SCAN_FUNCTION}(TABLE({{rows}}), {arguments})", rows=rows)


def _over_causes(rows: DataFrame) -> DataFrame:
    """Split each row's over-delivery into the causes the telemetry can show (
    "Limitations"): redelivery/seek/replay first (counted again by the broker), then batch
    entries counted as one message when sizing reads (at most msgs - entries); the rest of the
    messages is unexplained (concurrent replay and normal dispatch, read size). Bytes: what
    redelivery does not explain is the byte approximation: Pulsar sizes a read from the byte
    allowance by an estimated (average) entry size and only counts the real bytes after
    dispatching them, so any byte over-delivery comes from that estimate."""
    redelivered = F.coalesce(F.col("redelivered_msgs"), F.lit(0))
    per_msg = lambda total: F.when(  # noqa: E731 - one-line helper for a ratio
        F.col("msgs") > 0, round_half_up(redelivered * total / F.col("msgs"))
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
