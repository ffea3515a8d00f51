"""Every entry under a day's landing folder, accounted for before Spark reads anything.

Each file under ``<landing>/<day>/`` is either handed to its kind's parser or becomes one
quarantine row saying why it was not read: a folder of no known kind, a name the kind does not
read, an empty file, a link out of the landing folder, something that is not a regular file, or
content that cannot be read (permissions, binary, a broken compressed stream), or a record too
large for the driver's memory. Nothing is skipped without a row.

Compressed files (``.gz``, ``.bz2``) are read by Spark's own Hadoop codecs, chosen by the
extension, and land like their plain twins. Spark fails the whole job on a truncated or corrupt
stream, so each one is decompressed here first, in chunks (constant memory), and quarantined
when it does not decompress to the end.

A record is a whole file (stats JSON) or a line; Spark holds one as a single row, copied a few
times while it is parsed, so one of hundreds of MB runs the driver out of memory and fails the
whole day. A record over ``land.max_record_mb`` is quarantined here instead: a whole file by its
size, a line file only when it is larger than the limit, by its longest line (read in chunks).
"""

from __future__ import annotations

import bz2
import gzip
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .checks import UNREADABLE_FILE

UNKNOWN_KIND = "not-read: unknown kind"
UNSUPPORTED_EXTENSION = "not-read: unsupported extension"
EMPTY_FILE = "not-read: empty file"
OUTSIDE_LANDING = "not-read: link out of the landing folder"
NOT_A_FILE = "not-read: not a regular file"
TOO_LARGE = "not-read: record too large"
# The codecs Spark's text reader picks by extension, with the magic bytes their streams start with.
COMPRESSED: dict[str, tuple[Callable[..., Any], bytes]] = {".gz": (gzip.open, b"\x1f\x8b"), ".bz2": (bz2.open, b"BZh")}
# Enough of a file's head to tell text from binary (a NUL byte never occurs in JSON or
# Prometheus text) without reading gigabytes on the driver.
_SNIFF_BYTES = 4096
_CHUNK = 1 << 20
DAY_FOLDER = "-"  # the kind of a file directly in the day's folder, outside any kind's folder


@dataclass(frozen=True)
class NotRead:
    """A landing file that is not read: one quarantine row."""

    source_file: str
    reason: str
    detail: str
    ingested_at: datetime


@dataclass
class KindFiles:
    read: list[Path] = field(default_factory=list)
    not_read: list[NotRead] = field(default_factory=list)

    @property
    def seen(self) -> int:
        return len(self.read) + len(self.not_read)


def survey(landing: Path, day: str, suffixes: dict[str, tuple[str, ...]], whole_file: set[str], max_record: int) -> dict[str, KindFiles]:
    """kind → its files to read and those it does not read, for every kind folder of the day
    (the known kinds always, with no files when their folder is missing). ``whole_file``: the
    kinds whose record is a whole file; ``max_record``: the largest record read, in bytes."""
    kinds = {kind: KindFiles() for kind in suffixes}
    root = landing / day
    if not root.is_dir():
        return kinds
    top = landing.resolve()
    for path in _entries(root):
        parts = path.relative_to(root).parts
        if len(parts) == 1 and path.name.startswith("_"):
            continue  # the day's own metadata (demo-data's _demo_manifest.json), as Spark skips _ files
        kind = parts[0] if len(parts) > 1 else DAY_FOLDER
        files = kinds.setdefault(kind, KindFiles())
        problem = _problem(path, top, len(parts), suffixes.get(kind)) or _content_problem(path, kind in whole_file, max_record)
        if problem is None:
            files.read.append(path)
        else:
            files.not_read.append(NotRead(path.relative_to(landing).as_posix(), *problem, _mtime(path)))
    return kinds


def _entries(root: Path) -> Iterator[Path]:
    """Every non-folder entry under ``root``, sorted; links to folders are entries, not descended."""
    for folder, folders, names in os.walk(root, followlinks=False):
        here = Path(folder)
        folders.sort()
        linked = [name for name in folders if (here / name).is_symlink()]
        folders[:] = [name for name in folders if name not in linked]
        yield from (here / name for name in sorted(names + linked))


def _problem(path: Path, landing: Path, depth: int, suffixes: tuple[str, ...] | None) -> tuple[str, str] | None:
    """(reason, detail) when ``path`` is not read, else None."""
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(landing):
            return OUTSIDE_LANDING, "a symbolic link whose target is outside the landing folder: not followed"
    try:
        info = path.stat()
    except OSError as exc:
        return UNREADABLE_FILE, f"cannot read: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return NOT_A_FILE, "a folder, pipe, socket or device, not a file with content"
    if suffixes is None:
        where = "directly in the day's folder" if depth == 1 else "in a folder that is no landing kind"
        return UNKNOWN_KIND, f"{where}: files belong in <day>/<kind>/"
    codec = next((c for c in COMPRESSED if path.name.endswith(c)), None)
    plain_name = path.name.removesuffix(codec) if codec else path.name
    if depth > 2 or not plain_name.endswith(suffixes):
        where = "in a subfolder: " if depth > 2 else ""
        readable = ", ".join(f"*{s}" for s in suffixes)
        return UNSUPPORTED_EXTENSION, f"{where}this kind reads {readable} (plain, .gz or .bz2) directly in its folder"
    if info.st_size == 0:
        return EMPTY_FILE, "0 bytes"
    return None


def _content_problem(path: Path, whole_file: bool, max_record: int) -> tuple[str, str] | None:
    """(reason, detail) when the content of a file its kind reads cannot be landed, else None."""
    codec = next((c for c in COMPRESSED if path.name.endswith(c)), None)
    try:
        with path.open("rb") as raw:
            if codec:
                opener, magic = COMPRESSED[codec]
                if not raw.read(len(magic)).startswith(magic):
                    raise ValueError(f"not a {codec} stream (wrong magic bytes)")
                raw.seek(0)
                with opener(raw, "rb") as stream:
                    head, size, longest = _scan(stream)
            elif whole_file or path.stat().st_size <= max_record:  # no line can be over the limit
                head, size = raw.read(_SNIFF_BYTES), path.stat().st_size
                longest = size
            else:
                head, size, longest = _scan(raw)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        return UNREADABLE_FILE, f"cannot read: {getattr(exc, 'strerror', None) or exc}"
    if not head:
        return EMPTY_FILE, f"a {codec} stream of 0 bytes"
    if b"\x00" in head:
        return UNREADABLE_FILE, "binary content (NUL bytes), not text"
    record = size if whole_file else longest
    if record > max_record:
        what = "the file, one record," if whole_file else "its longest line"
        return TOO_LARGE, f"{what} has {record / 2**20:.0f} MiB, over land.max_record_mb ({max_record / 2**20:.0f} MiB)"
    return None


def _scan(stream) -> tuple[bytes, int, int]:
    """(head, size, longest line) of a byte stream, read to its end in chunks. A line within one
    chunk is shorter than the chunk, so only runs across chunks are measured: the limit is at
    least one chunk."""
    head = chunk = stream.read(_SNIFF_BYTES)
    size = longest = run = 0
    while chunk:
        size += len(chunk)
        first = chunk.find(b"\n")
        if first < 0:
            run += len(chunk)
        else:
            longest = max(longest, run + first)
            run = len(chunk) - chunk.rfind(b"\n") - 1
        chunk = stream.read(_CHUNK)
    return head, size, max(longest, run)


def _mtime(path: Path) -> datetime:
    try:
        return datetime.fromtimestamp(path.lstat().st_mtime, tz=timezone.utc)
    except OSError:
        return datetime.fromtimestamp(0, tz=timezone.utc)
