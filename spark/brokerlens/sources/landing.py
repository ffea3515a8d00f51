"""Writing landing files: land may scan a folder at any time, so a file appears whole or not at all.
Collects may run at once into one landing (two clusters, or a manual run beside the scheduled
one): a snapshot never replaces another's file, and the collect state is changed under a lock."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temporary(path: Path, text: str) -> Path:
    # The writer's own name (process and thread): writers at once never share a temporary file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_text(text)
    return tmp


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole, replacing what it held (a file whose content is ``path``'s own, such
    as a Prometheus range re-collected or the collect state)."""
    os.replace(_temporary(path, text), path)


def write_new(path: Path, text: str) -> Path:
    """Write a new file whole, never replacing one: when ``path`` exists (another collect's
    snapshot of the same millisecond), ``<stem>-2<suffix>``, ``-3``, ... Returns the path written."""
    tmp = _temporary(path, text)
    target, n = path, 1
    try:
        while True:
            try:
                os.link(tmp, target)  # fails on a taken name, where a rename would replace it
                return target
            except FileExistsError:
                pass
            except OSError:
                # A filesystem without hard links (some FUSE mounts): a rename to a name that is
                # free when looked at (another writer could still take it in between).
                if not target.exists():
                    os.replace(tmp, target)
                    return target
            n += 1
            target = path.with_name(f"{path.stem}-{n}{path.suffix}")
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for a read-modify-write of ``path`` (on ``<path>.lock`` beside it):
    without it, two collects at once each rewrite the state the other read before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield
