"""The Delta Lake JARs that match the pinned ``delta-spark`` package, fetched once and cached.

The coordinates are the ones ``delta.configure_spark_with_delta_pip`` would use
(``io.delta:delta-spark_<spark major.minor>_2.13:<delta-spark version>`` and
``io.delta:delta-storage``), so the JVM side always matches the Python side. They are resolved
by Spark's own Ivy (``spark-submit --packages``, which honours ``spark.jars.ivySettings`` for a
company mirror) into ``<cache>/ivy/jars`` once; every session after that puts the two local
files on ``spark.jars`` with no resolution and no network. Delta's optional Kernel and Unity
Catalog clients (and their Hadoop, Parquet and Jackson copies, 80 MB that Spark already ships)
are excluded: Delta's Spark connector does not need them for path-based tables.

``python -m brokerlens.platform.jars`` fetches them (``infra/bootstrap.sh`` runs it) and prints the paths.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
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
_IVY_REASONS = ("unresolved dependency", "not found", "Connection refused", "UnknownHost",
                "timed out", "Server access error", "FAILED", "Exception")


class JarsError(RuntimeError):
    """The Delta JARs could not be had; the message says what to do."""


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
            "--packages", ",".join(coordinates()),
            "--conf", f"spark.jars.excludes={','.join(EXCLUDES)}",
            "--conf", f"spark.jars.ivy={folder / 'ivy'}",
            "--conf", "spark.ui.enabled=false",
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


def main() -> None:
    try:
        for path in delta_jars():
            print(path)
    except JarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
