"""Gold ``producer_lint``: the relations between producer settings (batch size, pending queue, memory limit, partitions) as rules, each a column
expression over one configuration's row; every rule a configuration breaks is one row. A limit
that is not reported is unknown and the rules on it are not evaluated."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .config import MIB, partitions_at_least_one

DEFAULT_SWITCH_FREQUENCY = 10  # ProducerConfigurationData.batchingPartitionSwitchFrequencyByPublishDelay


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    setting: str
    when: Column  # true: the configuration breaks the rule (null: not evaluable)
    configured: Column
    bound: Column | None
    suggested: Column
    message: Column


def _fmt(c: Column) -> Column:
    return F.format_number(c, 0)


def lint_rules() -> list[Rule]:
    """The relations between producer settings, each a column expression over one configuration's row."""
    c = F.col
    parts = partitions_at_least_one()
    eff = c("effective_max_pending_messages")
    bmm = c("batching_max_messages")
    batching = F.coalesce(c("batching_enabled"), F.lit(True))
    half_eff = F.floor(eff / 2)
    needed_memory = eff * parts * c("avg_msg_bytes")
    memory_bound = F.when(c("memory_limit_bytes") > 0, c("memory_limit_bytes"))
    bytes_bound = F.least(F.coalesce(F.floor(memory_bound / parts / 2), F.lit(MIB)), F.lit(MIB))
    switch = F.coalesce(c("batching_partition_switch_frequency"), F.lit(DEFAULT_SWITCH_FREQUENCY))
    across_per_partition = F.floor(c("max_pending_messages_across_partitions") / c("partitions"))
    fails_fast = ~F.coalesce(c("block_if_queue_full"), F.lit(False))
    return [
        Rule(
            "batch-never-fills-by-count",
            "error",
            "batchingMaxMessages",
            batching & (bmm > eff),
            bmm.cast("string"),
            eff,
            half_eff.cast("string"),
            F.format_string(
                "batchingMaxMessages %s is above the %s pending messages a partition may hold: "
                "a batch can never fill by count and waits for batchingMaxPublishDelayMicros or "
                "batchingMaxBytes; the template keeps it at half the pending limit",
                _fmt(bmm),
                _fmt(eff),
            ),
        ),
        Rule(
            "batch-above-half-pending",
            "warning",
            "batchingMaxMessages",
            batching & (bmm <= eff) & (bmm > eff / 2),
            bmm.cast("string"),
            eff / 2,
            half_eff.cast("string"),
            F.format_string(
                "batchingMaxMessages %s is above half of the %s pending messages per partition: while one batch waits for its ack the next cannot fill",
                _fmt(bmm),
                _fmt(eff),
            ),
        ),
        Rule(
            "pending-capped-across-partitions",
            "warning",
            "maxPendingMessagesAcrossPartitions",
            (c("partitions") > 0) & (across_per_partition > 0) & (across_per_partition < c("max_pending_messages")),
            c("max_pending_messages_across_partitions").cast("string"),
            across_per_partition,
            (c("max_pending_messages") * c("partitions")).cast("string"),
            F.format_string(
                "maxPendingMessagesAcrossPartitions %s / %d partitions = %s caps maxPendingMessages "
                "%s per partition; set it to maxPendingMessages x partitions so maxPendingMessages holds",
                _fmt(c("max_pending_messages_across_partitions")),
                c("partitions"),
                _fmt(across_per_partition),
                _fmt(c("max_pending_messages")),
            ),
        ),
        Rule(
            "memory-limit-below-pending",
            "warning",
            "memoryLimitBytes",
            (memory_bound < needed_memory),
            c("memory_limit_bytes").cast("string"),
            needed_memory,
            F.ceil(needed_memory).cast("string"),
            F.format_string(
                "memoryLimitBytes %s is below %s pending messages x %d partitions x %s bytes per "
                "message = %s: the client blocks or fails on memory before the pending queue fills",
                _fmt(memory_bound),
                _fmt(eff),
                parts,
                _fmt(c("avg_msg_bytes")),
                _fmt(needed_memory),
            ),
        ),
        Rule(
            "batch-bytes-above-bound",
            "warning",
            "batchingMaxBytes",
            batching & (c("batching_max_bytes") > bytes_bound),
            c("batching_max_bytes").cast("string"),
            bytes_bound,
            bytes_bound.cast("string"),
            F.format_string(
                "batchingMaxBytes %s is above min(memoryLimit / partitions / 2, 1 MiB) = %s: a batch "
                "should not take more than half of a partition's share of the memory limit",
                _fmt(c("batching_max_bytes")),
                _fmt(bytes_bound),
            ),
        ),
        Rule(
            "partition-switch-frequency",
            "warning",
            "batchingPartitionSwitchFrequencyByPublishDelay",
            batching & (c("message_routing_mode") == "RoundRobinPartition") & (c("partitions") > 1) & (switch != 1),
            switch.cast("string"),
            F.lit(1),
            F.lit("1"),
            F.format_string(
                "RoundRobinPartition switches partition every %d x batchingMaxPublishDelay: a "
                "partition's pending queue can run out before the switch and batches wait for the "
                "delay; switch after every batch (1)",
                switch,
            ),
        ),
        Rule(
            "queue-full-fails-fast",
            "error",
            "blockIfQueueFull",
            fails_fast & (c("send_failed") > 0),
            F.lit("false"),
            None,
            F.lit("true"),
            F.format_string(
                "blockIfQueueFull=false and %s sends failed (%s ProducerQueueIsFullError, %s "
                "MemoryBufferIsFullError, %s timeouts): unless the send callback handles them "
                "these messages are lost on the producer",
                _fmt(c("send_failed")),
                _fmt(F.coalesce(c("send_failed_queue_full"), F.lit(0))),
                _fmt(F.coalesce(c("send_failed_memory_full"), F.lit(0))),
                _fmt(F.coalesce(c("send_failed_timeout"), F.lit(0))),
            ),
        ),
    ]


def lint(configs: DataFrame) -> DataFrame:
    """Every rule a configuration breaks, one row each, in one pass over the configurations."""
    findings = F.array(
        *[
            F.when(
                rule.when,
                F.struct(
                    F.lit(rule.id).alias("rule"),
                    F.lit(rule.severity).alias("severity"),
                    F.lit(rule.setting).alias("setting"),
                    rule.configured.alias("configured"),
                    (rule.bound if rule.bound is not None else F.lit(None)).cast("double").alias("bound"),
                    rule.suggested.alias("suggested"),
                    rule.message.alias("message"),
                ),
            )
            for rule in lint_rules()
        ]
    )
    return configs.withColumn("finding", F.explode(F.filter(findings, lambda f: f.isNotNull()))).select("*", "finding.*").drop("finding")
