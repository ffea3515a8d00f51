"""The JARs a brokerlens session needs: Delta Lake's, matching the pinned ``delta-spark`` package
(fetched once and cached), and brokerlens' own JVM classes (compiled once and cached).

The coordinates are the ones ``delta.configure_spark_with_delta_pip`` would use
(``io.delta:delta-spark_<spark major.minor>_2.13:<delta-spark version>`` and
``io.delta:delta-storage``), so the JVM side always matches the Python side. They are resolved
by Spark's own Ivy (``spark-submit --packages``, which honours ``spark.jars.ivySettings`` for a
company mirror) into ``<cache>/ivy/jars`` once; every session after that puts the two local
files on ``spark.jars`` with no resolution and no network. Delta's optional Kernel and Unity
Catalog clients (and their Hadoop, Parquet and Jackson copies, 80 MB that Spark already ships)
are excluded: Delta's Spark connector does not need them for path-based tables.

brokerlens' own classes (``JVM_SOURCES``: gold dispatch's one-pass scan and the Spark SQL extension
that makes it a table function, land's one-pass reader of stats files and its SQL function, the
Connect server's main, the local file system without processes) are compiled by ``javac`` and by
the Scala compiler pyspark ships, against this pyspark's JARs, into
``<cache>/brokerlens-jvm-<hash>.jar``, the hash naming the sources and the Spark version, so a
changed source or Spark builds a new JAR and never uses a stale one.

``python -m brokerlens.platform.jars`` fetches and builds them (``infra/bootstrap.sh`` runs it) and
prints the paths.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.resources import files
from pathlib import Path

import pyspark

SCALA = "2.13"
# Delta's Kernel / Unity Catalog clients: not needed by the Spark connector for our tables.
EXCLUDES = (
    "io.delta:delta-kernel-api",
    "io.delta:delta-kernel-defaults",
    "io.delta:delta-kernel-unitycatalog",
    "io.unitycatalog:unitycatalog-client",
    "io.unitycatalog:unitycatalog-hadoop",
)
# Ivy lines worth showing when resolution fails (the rest is Ivy's chatter).
_IVY_REASONS = ("unresolved dependency", "not found", "Connection refused", "UnknownHost", "timed out", "Server access error", "FAILED", "Exception")


# brokerlens' own JVM classes: (package holding the source, file), each kept beside the Python
# code that calls it.
JVM_SOURCES = (
    ("brokerlens.gold.dispatch", "DispatchScan.java"),
    ("brokerlens.gold.dispatch", "DispatchScanExtension.scala"),
    ("brokerlens.land", "StatsEnvelopeRows.scala"),
    ("brokerlens.land", "MetricsPageRows.scala"),
    ("brokerlens.gold.holes", "RangeStats.scala"),
    ("brokerlens.gold.holes", "GrowthSlopes.scala"),
    ("brokerlens.platform", "ConnectServer.scala"),
    ("brokerlens.platform", "LocalFileSystem.java"),
)
# The Spark SQL extensions in them (``spark.sql.extensions``): gold dispatch's scan as a table
# function, land's stats and /metrics readers and gold holes' range stats and growth slopes as
# functions.
SQL_EXTENSIONS = (
    "brokerlens.jvm.DispatchScanExtension",
    "brokerlens.jvm.StatsEnvelopeRowsExtension",
    "brokerlens.jvm.MetricsPageRowsExtension",
    "brokerlens.jvm.RangeStatsExtension",
    "brokerlens.jvm.GrowthSlopesExtension",
)
DISPATCH_SCAN_FUNCTION = "brokerlens_dispatch_scan"
STATS_ROWS_FUNCTION = "brokerlens_stats_rows"
METRICS_ROWS_FUNCTION = "brokerlens_metrics_rows"
RANGE_STATS_FUNCTION = "brokerlens_range_stats"
GROWTH_SLOPES_FUNCTION = "brokerlens_growth_slopes"
JAVA_RELEASE = "17"


class JarsError(RuntimeError):
    """The JARs could not be had; the message says what to do."""


def delta_version() -> str:
    return importlib.metadata.version("delta-spark")


def coordinates() -> list[str]:
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    version = delta_version()
    return [f"io.delta:delta-spark_{spark_minor}_{SCALA}:{version}", f"io.delta:delta-storage:{version}"]


def cache_dir() -> Path:
    explicit = os.environ.get("BROKERLENS_JARS_DIR")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "brokerlens" / "jars"


def _jar_name(coordinate: str) -> str:
    group, artifact, version = coordinate.split(":")
    return f"{group}_{artifact}-{version}.jar"  # Ivy's retrieve pattern in spark-submit


def cached_jars(folder: Path | None = None) -> list[Path] | None:
    """The local JAR files if all are cached, else None."""
    jars = (folder or cache_dir()) / "ivy" / "jars"
    paths = [jars / _jar_name(c) for c in coordinates()]
    return paths if all(p.is_file() and p.stat().st_size > 0 for p in paths) else None


def delta_jars(folder: Path | None = None) -> list[Path]:
    """The Delta JARs on this machine, fetched through Spark's Ivy on first use."""
    folder = folder or cache_dir()
    cached = cached_jars(folder)
    if cached is not None:
        return cached
    _resolve(folder)
    cached = cached_jars(folder)
    if cached is None:
        raise JarsError(f"Spark's Ivy reported success but {folder / 'ivy' / 'jars'} lacks {coordinates()}")
    return cached


def _resolve(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    spark_home = Path(pyspark.__file__).parent
    with tempfile.TemporaryDirectory() as tmp:
        noop = Path(tmp) / "noop.py"  # spark-submit resolves --packages, then runs this empty app
        noop.write_text("")
        command = [
            str(spark_home / "bin" / "spark-submit"),
            "--packages",
            ",".join(coordinates()),
            "--conf",
            f"spark.jars.excludes={','.join(EXCLUDES)}",
            "--conf",
            f"spark.jars.ivy={folder / 'ivy'}",
            "--conf",
            "spark.ui.enabled=false",
            str(noop),
        ]
        env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable}
        print(f"brokerlens: fetching the Delta Lake JARs {', '.join(coordinates())} (once)", file=sys.stderr)
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        except FileNotFoundError as exc:
            raise JarsError(f"cannot run spark-submit ({exc}): is Java 17 installed and pyspark complete?") from exc
        except subprocess.TimeoutExpired as exc:
            raise JarsError("fetching the Delta Lake JARs took over 10 minutes: check access to Maven Central") from exc
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).splitlines()
        if any("JAVA_HOME" in line or "java: not found" in line for line in output):
            reason = "Java was not found (Spark needs Java 17: apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
        else:
            hits = [line.strip().strip(":").strip() for line in output if any(r in line for r in _IVY_REASONS)]
            reason = hits[0] if hits else (output[-1] if output else f"exit code {proc.returncode}")
        raise JarsError(
            f"could not fetch the Delta Lake JARs {', '.join(coordinates())}: {reason}. "
            "Check access to Maven Central (or a mirror set with spark.jars.ivySettings), "
            f"or put the two JARs in {folder / 'ivy' / 'jars'} (BROKERLENS_JARS_DIR moves it)."
        )


def session_jars() -> list[Path]:
    """Every JAR a session puts on ``spark.jars``: Delta's and brokerlens' own."""
    return [*delta_jars(), jvm_jar()]


def jvm_jar(folder: Path | None = None) -> Path:
    """brokerlens' own classes as one JAR, compiled on first use of these sources with this Spark."""
    sources = {name: files(package).joinpath(name).read_bytes() for package, name in JVM_SOURCES}
    digest = hashlib.sha256(pyspark.__version__.encode())
    for name, text in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + text)
    path = (folder or cache_dir()) / f"brokerlens-jvm-{digest.hexdigest()[:16]}.jar"
    if path.is_file():
        return path
    javac, java = _jdk_tool("javac"), _jdk_tool("java")
    if javac is None or java is None:
        raise JarsError(
            "javac was not found: brokerlens compiles its JVM classes (the dispatch scan, the Connect server's main, "
            "the local file system) "
            "against Spark's JARs once and "
            "needs a JDK 17 for it (apt-get install openjdk-17-jdk-headless, or set JAVA_HOME)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, classes = Path(tmp) / "src", Path(tmp) / "classes"
        src.mkdir()
        for name, text in sources.items():
            (src / name).write_bytes(text)
        spark_jars = str(Path(pyspark.__file__).parent / "jars" / "*")
        java_files = [str(src / name) for name in sources if name.endswith(".java")]
        scala_files = [str(src / name) for name in sources if name.endswith(".scala")]
        # The Java first: the Scala classes use them. scalac is the one in pyspark's JARs.
        _compile([javac, "--release", JAVA_RELEASE, "-nowarn", "-cp", spark_jars, "-d", str(classes), *java_files], sources)
        scalac = [java, "-cp", spark_jars, "scala.tools.nsc.Main", "-usejavacp", "-release", JAVA_RELEASE, "-nowarn"]
        _compile([*scalac, "-classpath", str(classes), "-d", str(classes), *scala_files], sources)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        os.replace(partial, path)  # whole or not at all: the JAR appears only when complete
    print(f"brokerlens: compiled {', '.join(sources)} into {path}", file=sys.stderr)
    return path


def _jdk_tool(name: str) -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    return shutil.which(name, path=f"{java_home}/bin" if java_home else None) or shutil.which(name)


def _compile(command: list[str], sources: dict[str, bytes]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise JarsError(f"could not compile {', '.join(sources)}: {(proc.stdout + proc.stderr).strip()}")


def main() -> None:
    try:
        for path in session_jars():
            print(path)
    except JarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
