"""Gold ``cursor_ranges`` and ``hole_alerts``: a cursor's unacknowledged ranges (holes, from
``individuallyDeletedMessages``) against ``managedLedgerMaxUnackedRangesToPersist``, by ack-state
persistence mode, and the daily alerts on them."""
