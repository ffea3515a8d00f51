"""brokerlens' Pulsar broker interceptor (infra/pulsar/interceptor/, docs/interceptor.md), built
once per source and Pulsar version into
``~/.cache/brokerlens/pulsar/interceptor/brokerlens-interceptor-<sha>.nar`` (``BROKERLENS_PULSAR_DIR``
moves the cache, as for fetch.py), where ``<sha>`` hashes the module's files and the version.

``python infra/pulsar/interceptor.py [version]`` builds it (default: the LTS pinned in fetch.py)
and prints the NAR's path; when that NAR exists it is a no-op, Maven is not run. Maven builds in a
scratch folder and the NAR is copied to a partial file renamed into place, so an interrupted build
is never taken as done. Standard library only: the tests import it, and the bootstrap runs it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = HERE / "interceptor"
sys.path.insert(0, str(HERE))
import fetch  # noqa: E402  (the pinned versions and the cache root)

# broker.conf: brokerInterceptors=<NAME>, the `name` in META-INF/services/broker_interceptor.yml.
NAME = "brokerlens"
# The HTTP path the interceptor answers (DispatchInterceptor.PATH).
PATH = "/admin/v2/brokerlens/dispatch"


class BuildError(RuntimeError):
    """Maven could not build the NAR; the message has Maven's last lines."""


def sources() -> list[Path]:
    """The files the NAR is built from (build output and editor droppings excluded)."""
    files = [MODULE / "pom.xml", HERE / "settings.xml", *sorted((MODULE / "src").rglob("*"))]
    return [f for f in files if f.is_file()]


def digest(version: str) -> str:
    h = hashlib.sha256(f"pulsar {version}\n".encode())
    for f in sources():
        h.update(f.relative_to(HERE).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def nar_dir() -> Path:
    return fetch.cache_root() / "interceptor"


def nar_path(version: str = fetch.LTS) -> Path:
    return nar_dir() / f"brokerlens-interceptor-{digest(version)}.nar"


def build(version: str = fetch.LTS) -> Path:
    """The NAR for ``version``, built with Maven when it is not in the cache."""
    nar = nar_path(version)
    if nar.is_file():
        return nar
    nar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=nar.parent) as scratch:
        status, tail = fetch.maven(
            MODULE / "pom.xml",
            version,
            f"-Dbrokerlens.build.dir={scratch}",
            "package",
            purpose="the broker interceptor NAR is built",
            error=BuildError,
        )
        built = sorted(Path(scratch).glob("*.nar"))
        if status != 0 or not built:
            raise BuildError(f"mvn could not build the broker interceptor for pulsar {version} (exit {status}):\n{tail}")
        partial = nar.with_name(nar.name + ".partial")
        shutil.copyfile(built[0], partial)
        os.replace(partial, nar)
    return nar


def main(argv: list[str]) -> int:
    version = argv[0] if argv else fetch.LTS
    try:
        nar = build(version)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(nar)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
