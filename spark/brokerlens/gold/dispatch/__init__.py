"""Dispatch throttling: ``dispatch_periods``, ``dispatch_daily`` and ``debt_state`` (Pulsar's
dispatch rate limiters: per broker, topic partition and subscription).

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
interval's start; there, a limit that follows a stretch without limit is in force from
``valid_from`` itself (``limit_timeline``), since collect saw the broker's new limiter by then.
Counter rows also get the refill the model's cap dropped at earlier snapshots, which the broker
adds only at its own refill (``credit_in``, at most one quota; DispatchScan.java).

Starved: a row whose allowance (messages or bytes) is 0. Only rows with a record count: a record
shows the scope was being dispatched; empty periods show no demand and are never counted.

Re-building a day in the middle of a run of days: after writing the day, the closing debt is
compared with the one stored before; if it changed and the next day is built, that day is
re-built from the new debt, and so on while the debt keeps changing (``build_dispatch``).
"""
