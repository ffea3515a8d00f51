"""Silver tables of a day, from the bronze tables (the first step of `brokerlens build`).

* ``dispatch_intervals``: dispatch records at period grain (``source`` ``exporter`` from brokerlens'
  interceptor); for scopes that only have counter snapshots, the differences of successive ``msgOutCounter``/``bytesOutCounter`` (topic stats) or
  ``pulsar_out_messages_total``/``pulsar_out_bytes_total`` (broker /metrics) at scrape grain
  (a counter that went backwards was reset by a topic reload: the delta is the new value).
* ``cursor_snapshots``: each internal-stats cursor with the topic-stats subscription of the same
  collection (the nearest snapshot within ``STATS_PAIRING_SECONDS``), plus topic-stats
  subscriptions that have no cursor data, plus range counts from broker /metrics
  (``pulsar_ml_cursor_nonContiguousDeletedMessagesRange``) for subscriptions no stats cover.
* ``producer_snapshots``: producer stats with the configuration they ran with.
* ``rate_limits``: the effective dispatch limit per level and scope through the day, by Pulsar's
  precedence topic policy > namespace policy > broker config, per topic partition.
"""

from __future__ import annotations

from contextlib import ExitStack
from datetime import date
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.platform.settings import PlatformSettings
from brokerlens.platform.spark import in_parallel, persisted
from brokerlens.platform.stage import StageResult
from brokerlens.platform.tables import read_table, write_table

from .cursors import CURSOR_RANGES_METRICS, cursor_snapshots
from .intervals import OUT_COUNTERS, dispatch_intervals, with_msgs_per_entry
from .limits import rate_limits, scopes_seen
from .producers import producer_snapshots


def build_silver(spark: SparkSession, day: date, settings: PlatformSettings) -> StageResult:
    result = StageResult("silver", day)

    def bronze(name: str) -> DataFrame:
        return read_table(name, spark=spark, settings=settings).where(F.col("day") == F.lit(day))

    with ExitStack() as kept:  # persisted for the block, unpersisted however it ends
        topic_stats = kept.enter_context(persisted(with_msgs_per_entry(bronze("bronze_topic_stats"))))
        dispatch = kept.enter_context(persisted(bronze("bronze_dispatch")))
        internal = bronze("bronze_internal_stats")
        seen = kept.enter_context(persisted(scopes_seen(topic_stats, internal, dispatch)))
        metrics = bronze("bronze_metrics").where(F.col("metric").isin(*OUT_COUNTERS, *CURSOR_RANGES_METRICS))
        policies = read_table("bronze_policies", spark=spark, settings=settings).where(F.col("day") <= F.lit(day))
        tables = {
            "dispatch_intervals": dispatch_intervals(dispatch, topic_stats, metrics),
            "cursor_snapshots": cursor_snapshots(internal, topic_stats, metrics),
            "producer_snapshots": producer_snapshots(bronze("bronze_producer_stats")),
            "rate_limits": rate_limits(policies, seen, day),
        }
        # Scrape intervals and snapshots are dated by their own start; only the day's rows here.
        calls = [
            partial(write_table, frame.where(F.col("day") == F.lit(day)), name, mode="replace", partitions=[{"day": day}], settings=settings)
            for name, frame in tables.items()
        ]
        for name, write in zip(tables, in_parallel(spark, calls)):
            result.writes.append(write)
            result.metrics[f"{name}_rows"] = write.rows
    return result
