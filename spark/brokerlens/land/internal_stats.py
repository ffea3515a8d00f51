"""internal-stats/*.json: ``pulsar-admin topics stats-internal`` (PersistentTopicInternalStats,
ManagedLedgerInternalStats.CursorStats) in the envelope. One bronze row per topic partition x
cursor: through brokerlens' one-pass stats reader where it takes the file (:func:`read`), else the
general parser (:func:`parse`)."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .checks import MISSING_FIELD, PRIORITY, WRONG_TYPE, Field
from .envelope import ENVELOPE, ChildCheck, StatsRead, explode_children, read_stats

KIND = "internal-stats"
TABLE = "bronze_internal_stats"
SUFFIXES = (".json",)
WHOLE_FILE = True
POSITION = r"^-?[0-9]+:-?[0-9]+$"  # ledgerId:entryId
NON_PERSISTENT = "non-persistent://"

TOPIC = (
    Field("entriesAddedCounter", "bigint", counter=True),
    Field("numberOfEntries", "bigint", counter=True),
    Field("totalSize", "bigint", counter=True),
    Field("currentLedgerEntries", "bigint", counter=True),
    Field("currentLedgerSize", "bigint", counter=True),
    Field("lastConfirmedEntry"),
    Field("state"),
    Field("ledgers", "array<struct<ledgerId:bigint,entries:bigint,size:bigint>>"),
    Field("cursors", "map<string,string>"),
)
CURSOR = (
    # Required of persistent topics only: a non-persistent topic's cursors have no positions.
    Field("markDeletePosition"),
    Field("readPosition"),
    Field("individuallyDeletedMessages"),
    Field("totalNonContiguousDeletedMessagesRange", "bigint", counter=True),
    # Pulsar reports messagesConsumedCounter < 0 after a cursor reset: not a bad record.
    Field("messagesConsumedCounter", "bigint"),
    Field("numberOfEntriesSinceFirstNotAckedMessage", "bigint"),
    Field("cursorLedger", "bigint"),
    Field("state", column="cursor_state"),
    Field("active", "boolean", column="cursor_active"),
)
# A cursor's positions are ledgerId:entryId; a persistent topic's cursor has its mark-delete
# position (a non-persistent topic's cursors have none). :func:`_position_problems` checks them,
# and the reader leaves a file where one fails.
CURSOR_CHECKS = {
    "markDeletePosition": ChildCheck(POSITION, required_unless_prefix=NON_PERSISTENT),
    "readPosition": ChildCheck(POSITION),
}


def _position_problems(cursor: F.Column) -> list:
    return [
        (
            PRIORITY.index(MISSING_FIELD),
            ~F.col("topic").startswith(check.required_unless_prefix) & cursor[key].isNull(),
            MISSING_FIELD,
            F.lit(f"{key} is missing"),
        )
        for key, check in CURSOR_CHECKS.items()
        if check.required_unless_prefix
    ] + [
        (
            PRIORITY.index(WRONG_TYPE),
            cursor[key].isNotNull() & ~cursor[key].rlike(check.pattern),
            WRONG_TYPE,
            F.concat(F.lit(f"{key} should be ledgerId:entryId, got "), F.substring(cursor[key], 1, 100)),
        )
        for key, check in CURSOR_CHECKS.items()
        if check.pattern
    ]


def parse(records: DataFrame, day: date, duplicates: bool = True) -> DataFrame:
    return _bronze(explode_children(records, day, TOPIC, "cursors", CURSOR, "cursor", _position_problems, duplicates=duplicates), day)


def read(records: DataFrame, day: date) -> StatsRead:
    """The files brokerlens' stats reader takes, as :func:`parse` would give them (without the
    duplicate check), and those it leaves to :func:`parse`."""
    taken = read_stats(records, day, TOPIC, "cursors", CURSOR, child_checks=CURSOR_CHECKS, child_json=False)
    return taken._replace(rows=_bronze(taken.rows, day))


def _bronze(rows: DataFrame, day: date) -> DataFrame:
    """The bronze columns of the rows of :func:`~.envelope.explode_children` or the reader."""
    ts, cs = F.col("_ts"), F.col("_cs")
    ledgers = F.filter(ts["ledgers"], lambda ledger: ledger["ledgerId"].isNotNull())
    return rows.select(
        F.lit(day).alias("day"),
        "collected_at",
        "cluster",
        "broker",
        "topic",
        *[ts[f.key].alias(f.name) for f in TOPIC if f.key not in ("ledgers", "cursors")],
        F.map_from_arrays(
            F.transform(ledgers, lambda ledger: ledger["ledgerId"]),
            F.transform(ledgers, lambda ledger: ledger["entries"]),
        ).alias("ledger_entries"),
        # Pulsar lists ledgers oldest first; the last one is being written.
        F.element_at(ledgers, -1)["ledgerId"].alias("current_ledger_id"),
        F.col("child").alias("cursor"),
        *[cs[f.key].alias(f.name) for f in CURSOR],
        "source_file",
        "line",
        "ingested_at",
        "raw",
        "problem",
        ENVELOPE,
    )
