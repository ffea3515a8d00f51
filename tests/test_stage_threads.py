"""A stage's threads (``platform/spark.py``, ``in_parallel``): land's kinds, silver's tables and
gold's steps are written at once, each on a thread of the stage's own Spark application."""

from __future__ import annotations

import threading

from brokerlens.platform.spark import in_parallel


def test_a_stages_parallel_writes_each_keep_their_own_job_properties(spark):
    """The stage threads (in_parallel) start from the caller's local properties (the stage
    server's job group), but what one sets (Delta's job description, Spark's SQL execution id)
    is its own: PySpark hands every call of one wrapper the same properties object."""
    context, both_set = spark.sparkContext, threading.Barrier(2, timeout=60)

    def sets(value):
        def call():
            context.setLocalProperty("brokerlens.test.set", value)
            both_set.wait()
            return context.getLocalProperty("brokerlens.test.caller"), context.getLocalProperty("brokerlens.test.set")

        return call

    context.setLocalProperty("brokerlens.test.caller", "stage")
    try:
        assert list(in_parallel(spark, [sets("a"), sets("b")], threads=2)) == [("stage", "a"), ("stage", "b")]
    finally:
        context.setLocalProperty("brokerlens.test.caller", None)
