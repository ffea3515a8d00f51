"""Test inputs for the hole tests: silver cursor_snapshots rows and an independent range counter."""

from __future__ import annotations

from datetime import date, datetime, timezone

from brokerlens.platform.tables import table_schema, write_table
from brokerlens.platform.frames import rows_frame

TOPIC = "persistent://t/ns/orders-partition-0"


def at(day: date, hour: int, minute: int = 0) -> datetime:
    # Spark hands back naive UTC datetimes (session time zone UTC); compare like with like.
    return datetime(day.year, day.month, day.day, hour, minute)


def snap(
    when: datetime,
    idm: str | None,
    *,
    sub="s1",
    topic=TOPIC,
    namespace="t/ns",
    cluster="c1",
    reported=None,
    ledger_entries=None,
    sub_type="Shared",
    delayed=0,
    unacked=0,
    backlog=0,
    source="internal-stats",
    size=None,
    mdp="1:2",
    broker="broker-1:8080",
) -> dict:
    return dict(
        day=when.date(),
        snapshot_at=when,
        cluster=cluster,
        broker=broker,
        namespace=namespace,
        topic=topic,
        subscription=sub,
        subscription_type=sub_type,
        mark_delete_position=mdp,
        read_position=None,
        individually_deleted_messages=idm,
        ledger_entries=ledger_entries,
        ranges_reported=reported,
        ranges_source=source,
        serialized_size_reported=size,
        msg_backlog=backlog,
        unacked_messages=unacked,
        msg_delayed=delayed,
        msg_rate_out=0.0,
        msg_rate_redeliver=0.0,
        consumers=1,
        source_file=f"{when.date()}/internal-stats/{sub}.json",
    )


def write_snapshots(spark, rows: list[dict], day: date, settings) -> None:
    schema = table_schema("cursor_snapshots")
    df = rows_frame(spark, [tuple(r[c] for c in schema.column_names) for r in rows], schema.struct)
    write_table(df, "cursor_snapshots", mode="replace", partitions=[{"day": day}], settings=settings)


def range_string(ranges: list[tuple[int, int, int, int]]) -> str:
    return "[" + ", ".join(f"({a}:{b}..{c}:{d}]" for a, b, c, d in ranges) + "]"


def entries_in(rng: tuple[int, int, int, int], ledger_entries: dict[int, int]) -> int:
    """Count the positions p with lower < p <= upper by enumerating every position of every ledger
    (independent of the arithmetic in gold/holes/ranges.py)."""
    lower, upper = (rng[0], rng[1]), (rng[2], rng[3])
    return sum(1 for ledger in sorted(ledger_entries) for entry in range(ledger_entries[ledger]) if lower < (ledger, entry) <= upper)
