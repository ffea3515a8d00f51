"""The one SparkSession factory.

Under ``spark-submit`` the master, resources and the JARs (``--jars``: Delta's and brokerlens' own)
come from the submit command (a cluster is a connection change); locally the settings supply
them and the JARs come from ``brokerlens.platform.jars``. Either way the session gets the same
SQL settings and Delta Lake's extension and catalog, because the table layer relies on them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import TypeVar

import pyspark
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.util import inheritable_thread_target

from . import jvm
from .jars import SQL_EXTENSIONS, cache_dir, session_jars
from .settings import PlatformSettings

# A day is a UTC day, and Spark turns timestamps to text (date_format, casts, day boundaries
# parsed from a date) in the session's zone: every session brokerlens uses is in UTC, whatever a
# setting, spark-submit's --conf, the JVM's zone or the caller's own session says.
SESSION_ZONE = "spark.sql.session.timeZone"
# Threads of one stage that run independent writes at once (land's kinds, silver's tables,
# gold's steps): on a small day most of a write's time is the driver's (plans, Delta's log and
# commit), which then overlaps with the other writes' Spark jobs.
STAGE_THREADS = 3
_T = TypeVar("_T")

# What the table layer depends on, whatever the deployment, in two parts. The application's
# settings are fixed when its driver starts (a local session's builder, spark-submit's --conf, a
# Spark Connect server's command line); a session's are set on each session, a Connect client's
# included.
APPLICATION_CONF = {
    # Delta Lake's SQL, and brokerlens' own: gold dispatch's scan as a table function, land's stats reader.
    "spark.sql.extensions": ",".join(("io.delta.sql.DeltaSparkSessionExtension", *SQL_EXTENSIONS)),
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Spark keeps this many compiled classes of generated code (default 100). A daily run
    # compiles about 1,650 distinct ones (land to gold), so with 100 each stage recompiled what
    # the last one evicted: 2,300 compilations a run (a small day's next run: 87-94 s, 73-80 s
    # with 4,096). Enough for one run's plans and those that change with the day (a date literal
    # is part of the generated code).
    "spark.sql.codegen.cache.maxEntries": "4096",
    # PySpark records the Python call site of every DataFrame API call in the driver, for error
    # messages: four more py4j round trips per call. Building dispatch_periods' plan took 5,842
    # round trips with it and 1,752 without; brokerlens' own errors name the stage and table.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Progress bars would interleave with command output; long steps report progress themselves.
    "spark.ui.showConsoleProgress": "false",
}
SESSION_CONF = {
    # Delta readers (delta-rs, DuckDB) expect INT64 microsecond timestamps, not Spark's INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "zstd",
    # No dictionary pages: zstd over plain pages keeps our repeated scope strings as small, and
    # building dictionaries (then dropping those of the counters, which outgrow them) is CPU in
    # Parquet's row-at-a-time writer. dispatch_periods at 10.8 M records (45 columns): 57.3 s
    # and 151 MB without, 65.4 s and 158 MB with (medians of 3, alternated, 2026-12-03).
    "parquet.enable.dictionary": "false",
    "spark.sql.adaptive.enabled": "true",
    # Delta keeps a table's state (one row per data file) in this many partitions (default 50),
    # and every query over a table runs a job over it to find the files to read: a build of gold
    # runs about 90. Our tables' states are small (a year of a daily table: thousands of files),
    # and one task per job is cheapest: a small day's gold, built again, took 28-30 s with 1
    # against 33-35 s with 4 (2026-11-26, 2 cores).
    "spark.databricks.delta.snapshotPartitions": "1",
    # Delta keeps min/max statistics of a table's first N columns in the log for data skipping;
    # its default 32 covers the raw Pulsar JSON of the bronze tables, costly to compute and of
    # no use for skipping. Ours lead with the scope columns (day, cluster, broker, topic, ...).
    "spark.databricks.delta.properties.defaults.dataSkippingNumIndexedCols": "8",
    # VACUUM lists a table's folders with this parallelism (Spark's default: 10,000 tasks).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    "spark.sql.ansi.enabled": "false",
    # Local paths (file:) through brokerlens' LocalFileSystem.java: Hadoop's own starts a chmod or
    # readlink process for each file it creates or renames, 13 per Delta commit, and writes a .crc
    # side file beside each: 40 replacing writes of a small table, 35.5 s of CPU against 38.8 s
    # (2026-12-05, docs/benchmarks.md).
    # Set on the session, which its reads and writes take their Hadoop settings from, because
    # spark-submit reads files before brokerlens' JAR is loaded; not cached, because the file
    # system spark-submit used is (a new one for each use is a few objects).
    "fs.file.impl": "brokerlens.jvm.LocalFileSystem",
    "fs.file.impl.disable.cache": "true",
    "fs.AbstractFileSystem.file.impl": "brokerlens.jvm.LocalFileSystem$Fs",
}
SQL_CONF = {**APPLICATION_CONF, **SESSION_CONF}


def under_spark_submit() -> bool:
    return "SPARK_SUBMIT" in os.environ or os.environ.get("SPARK_ENV_LOADED") == "1"


def get_spark(settings: PlatformSettings) -> SparkSession:
    """Return the process's SparkSession, creating it on first use with ``settings``' Spark
    section: a Spark Connect client of ``spark.remote`` when it is set, else a classic session."""
    active = SparkSession.getActiveSession()
    if active is not None:
        active.conf.set(SESSION_ZONE, "UTC")
        return active
    if settings.spark.remote:
        return connect(settings.spark.remote, settings)
    java_opts = java_options()
    builder = SparkSession.builder.appName(settings.spark.app_name)
    local = not under_spark_submit()
    jars = session_jars() if local else []
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Spark's Python workers run this interpreter, not the first `python3` on the PATH (another
        # Python's packages, or a pyenv shim that fails once the folder the JVM started in is gone).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.master(settings.spark.master)
            .config("spark.driver.memory", settings.spark.driver_memory)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", f"{java_opts} {class_archive_options(jars)} {settings.spark.driver_java_options}".strip())
            .config("spark.executor.extraJavaOptions", java_opts)
        )
    app_conf, session_only = split_application_conf(application_conf(settings))
    for key, value in app_conf.items():
        builder = builder.config(key, value)
    if local:
        builder = builder.config("spark.jars", ",".join(str(p) for p in jars))
    spark = builder.getOrCreate()
    for key, value in session_only.items():
        spark.conf.set(key, value)
    jvm.set_log_level(spark, "WARN")
    _check_jars(spark)
    return spark


def application_conf(settings: PlatformSettings) -> dict[str, str]:
    """The Spark settings of an application brokerlens starts (a local session's, a Connect
    server's): ours, then the settings' Spark section over them, in UTC whatever it says."""
    shuffle, ui = str(settings.spark.shuffle_partitions), str(settings.spark.ui).lower()
    return {"spark.sql.shuffle.partitions": shuffle, "spark.ui.enabled": ui, **SQL_CONF, **settings.spark.conf, SESSION_ZONE: "UTC"}


def split_application_conf(conf: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` as Spark's own keys, which make the application, and the rest (a Parquet writer
    setting), which each session sets itself: spark-submit drops a key not under ``spark.`` with
    a warning."""
    spark_keys = {k: v for k, v in conf.items() if k.startswith("spark.")}
    return spark_keys, {k: v for k, v in conf.items() if k not in spark_keys}


def connect(url: str, settings: PlatformSettings) -> SparkSession:
    """A session on the Spark Connect server at ``url`` (``sc://host:port``), with brokerlens'
    session settings from ``settings``; the server's application must have ours (``brokerlens
    connect-server`` starts one)."""
    spark = SparkSession.builder.remote(url).getOrCreate()
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    missing = [e for e in APPLICATION_CONF["spark.sql.extensions"].split(",") if e not in extensions]
    if missing:
        raise JarsMissing(
            f"the Spark Connect server at {url} runs without {', '.join(missing)} "
            "in spark.sql.extensions: start it with `brokerlens connect-server`, or with "
            "--jars $(python -m brokerlens.platform.jars | paste -sd,) and brokerlens' APPLICATION_CONF"
        )
    # A session sets SQL settings (Spark's and Delta's); the rest of spark.conf is the server's.
    sql_conf = {k: v for k, v in settings.spark.conf.items() if k.startswith(("spark.sql.", "spark.databricks."))}
    shuffle = {"spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions)}
    for key, value in {**SESSION_CONF, **shuffle, **sql_conf, SESSION_ZONE: "UTC"}.items():
        spark.conf.set(key, value)
    return spark


def java_options() -> str:
    """The JVM options of a local session's driver and executors."""
    log4j = files("brokerlens.platform").joinpath("log4j2.properties")
    # Spark generates one Java method per pipeline of operators; HotSpot leaves methods over
    # 8,000 bytecodes to the interpreter, which made dispatch_periods 2x slower. Compiling them
    # fills code: with the quick compiler only (-XX:TieredStopAtLevel=1, a driver_java_options
    # choice) HotSpot reserves 48 MB, which a land, silver and gold run in one JVM filled, and
    # then it stops compiling; 240 MB is its tiered default.
    # The parallel collector, not G1 (the JVM's default): Spark's stages make short-lived garbage
    # fast, and G1's write barriers and concurrent work take CPU from the tasks on a machine of
    # few cores (docs/benchmarks.md: the large day's 2 hours landed and built 12 % faster).
    # HotSpot's optimising compiler (C2) takes a method once it ran 5,000 times or looped 40,000
    # times: every query's generated classes reach that, and compiling them took a core of two
    # for most of a new JVM's first land, silver and gold (its compiler threads' time 140 s of
    # 280 s of CPU on the large day's 2 hours). Ten times those thresholds leave the code that is
    # only warm to the quick compiler (docs/benchmarks.md).
    tier4 = "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
    return f"-Dlog4j2.configurationFile=file:{log4j} -Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:ReservedCodeCacheSize=240m -XX:+UseParallelGC {tier4}"


def class_archive(jars: Sequence[Path]) -> Path:
    """Where the class archive of this Java, this pyspark and the session's ``jars`` is
    (:func:`record_class_archive`). The JVM takes an archive only on the class path it was
    recorded with, so another venv's pyspark gets its own."""
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=f"{java_home}/bin" if java_home else None)
    digest = hashlib.sha256(f"{os.path.realpath(java) if java else ''}\0{Path(pyspark.__file__).parent}\0{pyspark.__version__}".encode())
    for jar in jars:
        digest.update(b"\0" + jar.name.encode())
    return cache_dir() / f"spark-classes-{digest.hexdigest()[:16]}.jsa"


def class_archive_options(jars: Sequence[Path]) -> str:
    """The local driver's options to map the class archive of a session with ``jars``, when
    there is one (what it saves: docs/benchmarks.md). The JVM checks the archive against its own
    build and class path and ignores one that does not match; its CDS log is off, as its warnings
    would go to the command's stdout."""
    archive = class_archive(jars)
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off" if archive.is_file() else ""


class ClassArchiveError(RuntimeError):
    """The class archive could not be recorded."""


def record_class_archive() -> Path:
    """Record the class archive once (``python -m brokerlens.platform.spark``, which
    ``infra/bootstrap.sh`` runs): a short local session whose driver JVM writes the classes it
    loaded to a file at its exit (a dynamic CDS archive, ``-XX:ArchiveClassesAtExit``). Later
    sessions map those classes instead of loading and verifying them from the JARs again."""
    archive = class_archive(session_jars())
    if archive.is_file():
        return archive
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    print("brokerlens: recording the JVM's class archive (once, about 30 s)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as home:
        code = f"from brokerlens.platform.spark import _class_archive_session; _class_archive_session({str(partial)!r}, {home!r})"
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as exc:
            raise ClassArchiveError("the session that records the class archive ran over 10 minutes") from exc
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        raise ClassArchiveError(f"the session that records the class archive failed: {lines[-1] if lines else f'exit code {proc.returncode}'}")
    os.replace(partial, archive)  # whole or not at all: a session maps it only when complete
    return archive


def _class_archive_session(archive: str, home: str) -> None:
    """What the archive's session runs: a window, JSON into VARIANT, and a Delta table written,
    merged into and read, so that most classes a stage loads are in it."""
    from .settings import PlatformSettings, SparkSettings

    conf = {"spark.driver.extraJavaOptions": f"{java_options()} -XX:ArchiveClassesAtExit={archive}"}
    spark = get_spark(PlatformSettings(home=Path(home), spark=SparkSettings(conf=conf)))
    table = f"{home}/table"
    rows = spark.range(100).selectExpr("id", "sum(id) OVER (ORDER BY id) AS running", "parse_json(to_json(named_struct('id', id))) AS v")
    rows.selectExpr("variant_get(v, '$.id', 'bigint') AS id").agg({"id": "max"}).collect()
    rows.drop("v").write.format("delta").save(table)
    spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT 1L AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE")
    spark.read.format("delta").load(table).groupBy().count().collect()
    spark.stop()


def in_parallel(spark: SparkSession, calls: Sequence[Callable[[], _T]], threads: int = STAGE_THREADS) -> Iterator[_T]:
    """The results of ``calls``, in their order, each run in one of ``threads`` threads of this
    Spark application. The threads take the caller's local properties, or on Spark Connect its
    tags (by which an Airflow task interrupts its stage's jobs). The first failure is raised once the calls
    already started have ended."""
    with ThreadPoolExecutor(threads) as pool:
        # A wrapper per call: PySpark copies the caller's local properties once per wrapper and
        # makes that copy the running thread's own, so calls sharing one would share it, each
        # overwriting the others' job description and SQL execution id (Delta's descriptions
        # piled up across the threads as "Delta: Delta: ...").
        futures = [pool.submit(inheritable_thread_target(spark)(call)) for call in calls]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


@contextmanager
def persisted(frame: DataFrame, level: StorageLevel = StorageLevel.MEMORY_AND_DISK_DESER) -> Iterator[DataFrame]:
    """``frame`` persisted at ``level`` (``DataFrame.cache``'s by default) for the block, and
    unpersisted when it ends, by an error too: a stage that fails leaves nothing in the storage of
    a session that goes on (a Spark Connect server's serves every stage)."""
    kept = frame.persist(level)
    try:
        yield kept
    finally:
        kept.unpersist()


class JarsMissing(RuntimeError):
    """Spark runs without the Delta Lake JARs or without brokerlens' own."""


def _check_jars(spark: SparkSession) -> None:
    if not jvm.has_class(spark, "io.delta.tables.DeltaTable"):
        raise JarsMissing(
            "Spark has no Delta Lake JARs on its classpath: pass them to spark-submit with "
            "--jars $(python -m brokerlens.platform.jars | paste -sd,) (or --packages "
            "io.delta:delta-spark_<spark>_2.13:<version>, see README 'Tables and storage')"
        )
    if not all(jvm.has_class(spark, extension) for extension in SQL_EXTENSIONS):
        raise JarsMissing(
            "Spark has no brokerlens JAR on its classpath (gold dispatch's scan, land's stats reader): pass it to "
            "spark-submit with the others, --jars $(python -m brokerlens.platform.jars | paste -sd,)"
        )


def main() -> None:
    """Record the class archive if there is none; a failure only means slower starts."""
    try:
        print(record_class_archive())
    except ClassArchiveError as exc:
        print(f"warning: {exc}; sessions start without it", file=sys.stderr)


if __name__ == "__main__":
    main()
