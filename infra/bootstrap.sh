#!/usr/bin/env bash
# Creates .venv and installs the locked dependencies on first use; a no-op afterwards
# unless requirements/lock.txt, pyproject.toml or this script changed. Checks for a JDK 17 (Spark runs on it;
# its javac builds brokerlens' own JAR) and Maven (it fetches the live-broker tests' Pulsar JARs).
set -euo pipefail
cd "$(dirname "$0")/.."

java_major() {
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null 2>&1 || { echo 0; return; }
  "$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1
}

javac_found() { command -v "${JAVA_HOME:+$JAVA_HOME/bin/}javac" >/dev/null 2>&1; }

if [ "$(java_major)" -lt 17 ] 2>/dev/null || [ -z "$(java_major)" ] || ! javac_found; then
  if [ "${CI:-}" = "true" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "bootstrap: JDK 17 missing, installing openjdk-17-jdk-headless (CI)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
  else
    cat >&2 <<'MSG'
bootstrap: Spark needs Java 17 (or newer), and brokerlens compiles its own JAR with javac:
no JDK 17 was found.
  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jdk-headless
  macOS:          brew install openjdk@17
  or point JAVA_HOME at a Java 17 installation.
MSG
    exit 1
  fi
fi

# The live-broker tests fetch Apache Pulsar's JARs with Maven (infra/pulsar/fetch.py).
if ! command -v mvn >/dev/null 2>&1; then
  if [ "${CI:-}" = "true" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "bootstrap: Maven missing, installing maven (CI)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  else
    cat >&2 <<'MSG'
bootstrap: the live Pulsar broker tests fetch Pulsar's JARs with Maven: mvn was not found.
  Debian/Ubuntu:  sudo apt-get install -y maven
  macOS:          brew install maven
MSG
    exit 1
  fi
fi

PYTHON="${PYTHON:-$(command -v python3.11 || true)}"
if [ -z "$PYTHON" ]; then
  echo "bootstrap: Python 3.11 is required (python3.11 not found; set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

# The Delta Lake JARs matching the pinned delta-spark, fetched once into ~/.cache/brokerlens/jars
# by Spark's own Ivy, brokerlens' own JAR, compiled once per source (platform/jars.py), and the
# JVM's class archive beside them, recorded once (platform/spark.py: sessions start sooner); a
# no-op when they are there.
fetch_jars() {
  .venv/bin/python -m brokerlens.platform.jars >/dev/null || exit 1
  .venv/bin/python -m brokerlens.platform.spark >/dev/null
  build_interceptor
}

# brokerlens' Pulsar broker interceptor (docs/interceptor.md), built once per source and Pulsar
# version into ~/.cache/brokerlens/pulsar/interceptor by Maven (infra/pulsar/interceptor.py); the
# live-broker tests load it. A no-op when that NAR is there.
build_interceptor() {
  .venv/bin/python infra/pulsar/interceptor.py >/dev/null || exit 1
}

stamp=".venv/.installed-$(cat requirements/lock.txt pyproject.toml infra/bootstrap.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  fetch_jars
  exit 0
fi
echo "bootstrap: creating .venv and installing locked dependencies (first run takes a few minutes)" >&2
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check uv==0.13.9
# pyspark ships only as a source archive: uv builds its wheel and keeps it in its cache.
.venv/bin/uv pip install -q --python .venv/bin/python -r requirements/lock.txt
.venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
# Every module compiled once, here: uv installs no bytecode, and where PYTHONDONTWRITEBYTECODE is
# set no process writes any, so each one (an Airflow task, a test's subprocess) compiled all it
# imported again (Great Expectations alone: about 1,400 modules, 5 s on 2 cores).
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" spark dags
# Once uv's record of that archive's download has gone stale, an install makes a new revision of
# it (the archive, its unpacked source and the wheel: 1.4 GB) beside the old ones (4.6 GB
# after four installs here): keep only what is reachable. In CI also the unpacked sources and wheels
# the venv already holds (1 GB more; a CI machine's disk once filled up mid-suite).
if [ "${CI:-}" = "true" ]; then .venv/bin/uv cache prune -q --ci; else .venv/bin/uv cache prune -q; fi
rm -f .venv/.installed-*
touch "$stamp"
fetch_jars
echo "bootstrap: done" >&2
