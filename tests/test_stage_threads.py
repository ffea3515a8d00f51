"""A stage's threads and kept frames (``platform/spark.py``): land's kinds, silver's tables and
gold's steps are written at once, each on a thread of the stage's own Spark application
(``in_parallel``); what a stage persists is unpersisted however it ends (``persisted``)."""

from __future__ import annotations

import threading

import pytest
from pyspark import StorageLevel

from brokerlens.platform.spark import in_parallel, persisted


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


def test_a_frame_persisted_for_a_block_is_unpersisted_when_the_block_fails(spark):
    frame = spark.range(3)
    with pytest.raises(ZeroDivisionError):
        with persisted(frame, StorageLevel.DISK_ONLY) as kept:
            assert kept.storageLevel == StorageLevel.DISK_ONLY and kept.count() == 3
            1 / 0
    assert frame.storageLevel == StorageLevel.NONE
