"""Gold ``hole_alerts``: per subscription and day the severity (critical over the cap or with
acknowledgements left out, warning over the threshold, forecast to reach the cap within the
horizon), the reason, a hint per kind of subscription, and the state against yesterday's alerts."""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerlens.gold.holes.settings import AlertSettings

from .persistence import KEY, with_alert_thresholds

SEVERITY_RANK = {"forecast": 1, "warning": 2, "critical": 3}
# Why holes pile up for this kind of subscription and what to do about it.
HINTS = {
    "delayed-messages": (
        "Delayed messages: later messages whose delay expires first are acknowledged before "
        "earlier ones. Put delayed and normal messages on separate topics; keep delay times "
        "ordered (ideally increasing, e.g. a random-delay topic for up to 1 day plus fixed-delay "
        "topics), or send messages due on the same day to the same topic; make consumers idempotent."
    ),
    "key-shared": (
        "Key_Shared: messages of a slow or hot key cannot be dispatched while later keys are "
        "acknowledged. Scale consumers out quickly to avoid backlog, use many keys with an even "
        "distribution (no skewed or slow keys); make consumers idempotent."
    ),
    "exclusive-failover": (
        "Exclusive/Failover: the broker does not bound unacked messages here, so every message "
        "left unacknowledged leaves a hole. Use cumulative acknowledgement (acknowledgeCumulative); "
        "with individual acks make consumers idempotent, balance partitions and scale consumption "
        "(for Failover, more partitions help)."
    ),
    "shared-unacked": (
        "Shared: holes come from messages acknowledged out of order and are bounded by the max "
        "unacked messages (maxUnackedMessagesPerSubscription / maxUnackedMessagesPerConsumer); "
        "keep that bound below the cap and look for slow or stuck consumers and redeliveries."
    ),
    "unknown": (
        "Find slow or stuck consumers and messages acknowledged out of order; make consumers "
        "idempotent, since acknowledgements beyond the cap are lost on a topic reload."
    ),
}


def _fmt(col: str) -> Column:
    return F.format_number(F.col(col), 0)


def _mode_text() -> Column:
    """E.g. "persisted as long-array, long-array mode from version 4.1.2"."""
    return F.concat(
        F.lit("persisted as "),
        F.coalesce(F.col("persisted_as"), F.lit("unknown")),
        F.lit(", "),
        F.coalesce(F.col("persist_mode"), F.lit("unknown")),
        F.lit(" mode from "),
        F.coalesce(F.col("persist_mode_source"), F.lit("unknown")),
    )


def daily_alerts(ranges: DataFrame, alerts: AlertSettings) -> DataFrame:
    """One row per subscription of the day with its severity (null: no alert) and numbers."""
    df = with_alert_thresholds(ranges, alerts)
    peak = F.struct(F.col("ranges"), F.col("snapshot_at"))
    last = F.col("snapshot_at")
    at_peak = [
        "snapshot_at",
        "cap",
        "cap_source",
        "over_cap",
        "exposure_entries",
        "serialized_bytes",
        "persist_mode",
        "persist_mode_source",
        "persisted_as",
    ]
    at_last = [
        "namespace",
        "subscription_type",
        "growth_per_hour",
        "hours_to_cap",
        "forecast_cap_at",
        "unacked_messages",
        "msg_backlog",
        "warning_threshold",
        "horizon_hours",
    ]
    agg = df.groupBy(*KEY).agg(
        F.max("ranges").alias("ranges"),
        F.max_by("ranges", last).alias("ranges_last"),
        F.max("snapshot_at").alias("last_snapshot_at"),
        F.max("msg_delayed").alias("msg_delayed"),
        *(F.max_by(c, peak).alias("ranges_at" if c == "snapshot_at" else c) for c in at_peak),
        *(F.max_by(c, last).alias(c) for c in at_last),
    )
    forecast_hit = (F.col("hours_to_cap") > 0) & (F.col("hours_to_cap") <= F.col("horizon_hours"))
    # In long-array mode acknowledgements can be left out well under the cap in ranges.
    severity = (
        F.when((F.col("ranges") >= F.col("cap")) | (F.col("exposure_entries") > 0), F.lit("critical"))
        .when(F.col("ranges") >= F.col("warning_threshold"), F.lit("warning"))
        .when(forecast_hit, F.lit("forecast"))
    )
    at = F.date_format("ranges_at", "yyyy-MM-dd HH:mm 'UTC'")
    trend = F.when(
        forecast_hit,
        F.concat(
            F.lit("; growing "),
            F.format_number("growth_per_hour", 0),
            F.lit(" ranges/h, cap reached in "),
            F.format_number("hours_to_cap", 1),
            F.lit(" h (at "),
            F.date_format("forecast_cap_at", "yyyy-MM-dd HH:mm 'UTC'"),
            F.lit(")"),
        ),
    ).otherwise(F.lit(""))
    reason = (
        F.when(
            F.col("severity") == "critical",
            F.concat(
                _fmt("ranges"),
                F.lit(" ranges at "),
                at,
                F.when(F.col("ranges") >= F.col("cap"), F.lit(" >= cap ")).otherwise(F.lit(" < cap ")),
                _fmt("cap"),
                F.lit(" ("),
                F.col("cap_source"),
                F.lit("): "),
                _fmt("over_cap"),
                F.lit(" ranges over the cap, "),
                F.coalesce(_fmt("exposure_entries"), F.lit("an unknown number of")),
                F.lit(" acknowledged entries redelivered on a topic reload ("),
                _mode_text(),
                F.lit("); serialized "),
                _fmt("serialized_bytes"),
                F.lit(" bytes"),
                trend,
            ),
        )
        .when(
            F.col("severity") == "warning",
            F.concat(
                _fmt("ranges"),
                F.lit(" ranges at "),
                at,
                F.lit(" >= warning threshold "),
                _fmt("warning_threshold"),
                F.lit(" (cap "),
                _fmt("cap"),
                F.lit(")"),
                trend,
            ),
        )
        .when(
            F.col("severity") == "forecast",
            F.concat(
                _fmt("ranges_last"),
                F.lit(" ranges (cap "),
                _fmt("cap"),
                F.lit(")"),
                trend,
                F.lit(", within the "),
                F.format_number("horizon_hours", 0),
                F.lit(" h horizon"),
            ),
        )
    )
    scenario = (
        F.when(F.col("msg_delayed") > 0, F.lit("delayed-messages"))
        .when(F.col("subscription_type") == "Key_Shared", F.lit("key-shared"))
        .when(F.col("subscription_type").isin("Exclusive", "Failover"), F.lit("exclusive-failover"))
        .when(F.col("subscription_type") == "Shared", F.lit("shared-unacked"))
        .otherwise(F.lit("unknown"))
    )
    hint = F.create_map(*(F.lit(x) for kv in HINTS.items() for x in kv))[F.col("hint_scenario")]
    return agg.withColumn("severity", severity).withColumn("reason", reason).withColumn("hint_scenario", scenario).withColumn("hint", hint)


def with_state(today: DataFrame, previous: DataFrame, notified: DataFrame, day: date) -> DataFrame:
    """Alert state against the previous day's open alerts: new, ongoing, escalated, resolved, or
    stale: an open alert whose subscription has no snapshot today is not resolved (nothing says
    the holes are gone); it keeps its severity, and ``stale_since`` (the first day without data,
    carried while it lasts) lets the mail say "no data since …" once."""
    rank = F.create_map(*(F.lit(x) for kv in SEVERITY_RANK.items() for x in kv))
    prev = previous.filter(F.col("state") != "resolved").select(
        *KEY,
        F.col("severity").alias("p_severity"),
        F.col("first_seen").alias("p_first_seen"),
        F.col("namespace").alias("p_namespace"),
        F.col("subscription_type").alias("p_subscription_type"),
        F.col("warning_threshold").alias("p_warning_threshold"),
        F.col("horizon_hours").alias("p_horizon_hours"),
        F.col("hint_scenario").alias("p_hint_scenario"),
        F.col("hint").alias("p_hint"),
        F.col("last_snapshot_at").alias("p_last_snapshot_at"),
        F.col("stale_since").alias("p_stale_since"),
        F.lit(True).alias("was_open"),
    )
    both = today.join(prev, KEY, "full").filter(F.col("severity").isNotNull() | F.col("was_open"))
    is_open = F.col("severity").isNotNull()
    no_data = F.col("last_snapshot_at").isNull()  # open yesterday, no snapshot today
    state = (
        F.when(is_open & F.col("was_open").isNull(), F.lit("new"))
        .when(is_open & (rank[F.col("severity")] > rank[F.col("p_severity")]), F.lit("escalated"))
        .when(is_open, F.lit("ongoing"))
        .when(no_data, F.lit("stale"))
        .otherwise(F.lit("resolved"))
    )
    last_seen = F.coalesce(F.col("last_snapshot_at"), F.col("p_last_snapshot_at"))
    resolved_reason = F.when(
        no_data,
        F.concat(
            F.lit("no data since "),
            F.coalesce(F.date_format(last_seen, "yyyy-MM-dd HH:mm 'UTC'"), F.lit("an unknown time")),
            F.lit(": no cursor snapshots for this subscription; the alert stays open until a snapshot shows it"),
        ),
    ).otherwise(
        F.concat(
            F.lit("resolved: peak "),
            _fmt("ranges"),
            F.lit(" ranges < warning threshold "),
            _fmt("warning_threshold"),
            F.lit(", cap "),
            _fmt("cap"),
            F.lit(" not reached within "),
            F.format_number("horizon_hours", 0),
            F.lit(" h at the current trend"),
        )
    )
    sent = notified.filter(F.col("day") == F.lit(day)).select(*KEY).distinct().withColumn("sent", F.lit(True))
    return (
        both.withColumn("state", state)
        .withColumn("severity", F.when(F.col("state") == "stale", F.col("p_severity")).otherwise(F.col("severity")))
        .withColumn(
            "stale_since",
            F.when(F.col("state") == "stale", F.coalesce(F.col("p_stale_since"), F.lit(day)).cast("date")),
        )
        .withColumn("day", F.lit(day))
        .withColumn("previous_severity", F.col("p_severity"))
        .withColumn("first_seen", F.when(F.col("was_open"), F.col("p_first_seen")).otherwise(F.lit(day)))
        .withColumn("reason", F.coalesce(F.col("reason"), resolved_reason))
        .withColumn("last_snapshot_at", last_seen)
        .withColumn("namespace", F.coalesce("namespace", "p_namespace"))
        .withColumn("subscription_type", F.coalesce("subscription_type", "p_subscription_type"))
        .withColumn("warning_threshold", F.coalesce("warning_threshold", "p_warning_threshold"))
        .withColumn("horizon_hours", F.coalesce("horizon_hours", "p_horizon_hours"))
        .withColumn("hint_scenario", F.coalesce("hint_scenario", "p_hint_scenario"))
        .withColumn("hint", F.coalesce("hint", "p_hint"))
        .join(sent, KEY, "left")
        .withColumn("notified", F.coalesce("sent", F.lit(False)))
    )


def hole_alerts_frame(ranges: DataFrame, previous_alerts: DataFrame, notified: DataFrame, day: date, alerts: AlertSettings) -> DataFrame:
    from brokerlens.platform.schemas import table_schema

    frame = with_state(daily_alerts(ranges, alerts), previous_alerts, notified, day)
    return frame.select(*table_schema("hole_alerts").column_names)
