"""`brokerlens report`: one self-contained HTML file for a day, readable offline.

``<reports>/<day>/brokerlens-<day>.html`` holds the headline numbers, the worst dispatch scopes
with their over-delivery and debt over the day, the subscriptions closest to the unacked-range
cap with their trend towards it, hole-risk alerts and their state, producer lint findings,
quarantine counts and data-quality results. Charts are matplotlib SVGs inlined as data URIs.

Everything is aggregated in Spark; only bounded results reach the driver: the top N scopes and
subscriptions (settings ``report``), their series downsampled to per-minute (dispatch) or
per-10-minute (cursors) maxima, and tables cut at ``report.max_rows`` rows.
"""
