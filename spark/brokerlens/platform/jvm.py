"""The one module that reaches into Spark's JVM through py4j (``sparkContext``, ``_jvm``,
``_jsc``, ``_jdf``), as Delta's own Python API keeps py4j in one file.

Everything else in brokerlens speaks the DataFrame and SQL API only, which a Spark Connect
client also has; what is here is what only a classic session's driver has: its JVM's classes,
memory, log level and plans, for the session's own checks and the bench. (Gold dispatch's scan
is a SQL table function, registered by ``spark.sql.extensions``: see
``DispatchScanExtension.scala``.)
"""

from __future__ import annotations

from collections.abc import Callable

from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession


def has_class(spark: SparkSession, name: str) -> bool:
    """The class is on the driver's classpath: py4j resolves a name to a JavaClass when the
    class loads, else to a JavaPackage."""
    found = spark.sparkContext._jvm
    for part in name.split("."):
        found = getattr(found, part)
    return isinstance(found, JavaClass)


def set_log_level(spark: SparkSession, level: str) -> None:
    spark.sparkContext.setLogLevel(level)


def executed_plan(frame: DataFrame) -> str:
    """The frame's physical plan as Spark prints it, one operator a line."""
    return frame._jdf.queryExecution().executedPlan().treeString()


def default_parallelism(spark: SparkSession) -> int:
    return spark.sparkContext.defaultParallelism


def context_conf(spark: SparkSession) -> dict[str, str]:
    """The SparkContext's configuration (the session's SQL settings are ``spark.conf``)."""
    return dict(spark.sparkContext.getConf().getAll())


def heap_used(spark: SparkSession) -> Callable[[], int]:
    """A function giving the driver JVM's heap in use now, in bytes. (The sum of the pools' own
    peaks, eden, survivor and old, is no peak of the heap: each pool peaks at another time, and
    their sum ran past the 2 GB the driver's heap can hold.)"""
    memory = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    return lambda: memory.getHeapMemoryUsage().getUsed()


def heap_pools(spark: SparkSession) -> list:
    """The driver JVM's heap memory pools (MemoryPoolMXBean: eden, survivor, old)."""
    pools = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    return [p for p in pools if str(p.getType().toString()) == "Heap memory"]


def collect_garbage(spark: SparkSession) -> None:
    spark.sparkContext._jvm.java.lang.System.gc()
