"""Apache Pulsar's broker JARs from Maven Central, fetched once per version into
``~/.cache/brokerlens/pulsar/<version>/lib`` (``BROKERLENS_PULSAR_DIR`` moves the cache) for the
live-broker tests, which start ``org.apache.pulsar.PulsarStandaloneStarter`` from them.

``python infra/pulsar/fetch.py [version ...]`` fetches the given versions (default: all pinned);
a version already in the cache is not fetched again. Maven writes into a partial folder that is
renamed into place only when ``copy-dependencies`` succeeded, so an interrupted fetch is never
taken as done. Standard library only: the tests import it, and it runs before any virtualenv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The versions the live tests run, pinned here and nowhere else. Only some releases resolve
# completely from Maven Central (4.0.8 lacks jetcd-core-shaded 4.0.8).
LTS = "4.0.7"
NEWER = "4.2.4"
OLDER = "3.0.7"
VERSIONS = (LTS, NEWER, OLDER)


class FetchError(RuntimeError):
    """Maven could not resolve the broker's dependencies; the message has Maven's last lines."""


def cache_root() -> Path:
    explicit = os.environ.get("BROKERLENS_PULSAR_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "brokerlens" / "pulsar"


def lib_dir(version: str) -> Path:
    return cache_root() / version / "lib"


def maven(pom: Path, version: str, *arguments: str, purpose: str, error: type[Exception]) -> tuple[int, str]:
    """Run Maven on ``pom`` for Pulsar ``version`` with the settings that send every repository to
    Maven Central: (exit status, the output's last lines). No ``mvn`` raises ``error``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"mvn not found: {purpose} with Maven (Debian/Ubuntu: apt-get install -y maven)")
    command = [mvn, "-B", "-q", "-s", str(HERE / "settings.xml"), "-f", str(pom), f"-Dpulsar.version={version}", *arguments]
    done = subprocess.run(command, capture_output=True, text=True)
    return done.returncode, "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])


def fetch(version: str) -> Path:
    """The folder of ``pulsar-broker``'s JARs for ``version``, fetched with Maven on first use."""
    lib = lib_dir(version)
    if lib.is_dir():
        return lib
    partial = lib.with_name("lib.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    status, tail = maven(
        HERE / "pom.xml",
        version,
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
        "dependency:copy-dependencies",
        purpose="the live Pulsar broker's JARs are fetched",
        error=FetchError,
    )
    if status != 0 or not any(partial.glob("pulsar-broker-*.jar")):
        raise FetchError(f"mvn could not fetch pulsar-broker {version} (exit {status}):\n{tail}")
    os.replace(partial, lib)
    return lib


def main(argv: list[str]) -> int:
    for version in argv or VERSIONS:
        try:
            lib = fetch(version)
        except FetchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"pulsar {version}: {lib} ({sum(1 for _ in lib.glob('*.jar'))} jars)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
