"""Stop evidence (P4, C3, C5): which files a job produced and what its log said last.

Stopping is not rolling back (C5): everything under the checkpoints directory is listed as an artifact,
and the subset written since the prepare signal is listed separately as the checkpoints of this stop.

The job owns its directory, so anything in it may be a trap: a symlink to a
file outside, a FIFO whose open() blocks forever, a socket, /dev/zero. Every directory and file is
therefore opened relative to its parent's descriptor with O_NOFOLLOW and O_NONBLOCK, and only regular
files are read; a symlink is never followed, not even one that replaced the job or checkpoint directory.
(The log tail is read by path: a log that is not a regular file gives none, and what a swapped job
directory's log says is the job's own word either way.)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20
# Filesystem timestamps come from a coarse kernel clock that may lag time.time() by a tick (≤ 10 ms),
# so a checkpoint written right after the signal could otherwise look older than the signal.
MTIME_SLACK_SECONDS = 0.01
# Deeper directories are not entered: the walk recurses, and a job can nest directories without end.
MAX_DEPTH = 32

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    """One directory entry met by `walk`; `dir_fd` and `name` address it without resolving a path."""

    path: str  # relative to the job directory, "/"-separated
    dir_fd: int
    name: str
    is_dir: bool


@contextlib.contextmanager
def open_job_dir(job_dir: Path) -> Iterator[int]:
    """A descriptor of `job_dir`, refusing a symlink as it or its parent (the job may have swapped either).

    Raises OSError: FileNotFoundError if it does not exist, ELOOP/ENOTDIR if it is not a real directory.
    """
    parent = os.open(job_dir.parent, _OPEN_DIR)
    try:
        fd = os.open(job_dir.name, _OPEN_DIR, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        yield fd
    finally:
        os.close(fd)


def walk(dir_fd: int, rel: str = "", depth: int = 0) -> Iterator[Entry]:
    """Every entry under the directory `dir_fd`, sorted, a directory after its contents; never follows a
    symlink and skips what cannot be opened. Entries are valid while the generator is suspended on them."""
    try:
        with os.scandir(dir_fd) as it:
            names = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except OSError:
        return
    for name, is_dir in names:
        path = f"{rel}/{name}" if rel else name
        if is_dir and depth < MAX_DEPTH:
            try:
                fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
            except OSError:
                continue  # replaced by something else since the listing
            try:
                yield from walk(fd, path, depth + 1)
            finally:
                os.close(fd)
        yield Entry(path, dir_fd, name, is_dir)


def file_record(entry: Entry, owner: int | None = None) -> dict[str, Any] | None:
    """`{"path", "size", "mtime", "sha256"}` for a regular file (owned by `owner`, if given); None for anything
    else or a vanished one."""
    try:
        fd = os.open(entry.name, _OPEN_FILE, dir_fd=entry.dir_fd)
    except OSError:
        return None  # a symlink (ELOOP), socket (ENXIO), directory, or gone
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None  # a FIFO or device: opened without blocking, but never read
            if owner is not None and st.st_uid != owner:
                return None  # not written by the job: a hard link to someone else's file is not its artifact
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return {"path": entry.path, "size": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}


def scan_files(job_dir: Path, sub: str = "checkpoints", *, owner: int | None = None) -> list[dict[str, Any]]:
    """Records for every regular file under `job_dir/sub` (`sub` "" for the whole job directory) owned by
    `owner` if given, with paths relative to `job_dir`, sorted by path. A missing or symlinked directory has
    no files."""
    records = []
    try:
        with open_job_dir(job_dir) as job_fd:
            for entry in _walk_sub(job_fd, sub):
                record = None if entry.is_dir else file_record(entry, owner)
                if record is not None:
                    records.append(record)
    except OSError:
        return []
    return sorted(records, key=lambda r: str(r["path"]))


def _walk_sub(job_fd: int, sub: str) -> Iterator[Entry]:
    if not sub:
        yield from walk(job_fd)
        return
    try:
        fd = os.open(sub, _OPEN_DIR, dir_fd=job_fd)
    except OSError:
        return
    try:
        yield from walk(fd, sub, 1)
    finally:
        os.close(fd)


def delete_files(job_dir: Path, sub: str = "checkpoints") -> tuple[list[dict[str, Any]], list[str]]:
    """Remove everything under `job_dir/sub` (`sub` "": the job directory itself too), each entry through
    its parent's descriptor, so a symlink the job planted is removed, never followed.

    Returns the records of the removed files (regular files hashed first; others with their `type` and no
    hash) and the paths left behind (nested deeper than MAX_DEPTH, or not removable).
    Raises FileNotFoundError if the job directory is missing, OSError if it is not a real directory.
    """
    removed: list[dict[str, Any]] = []
    left: list[str] = []
    with open_job_dir(job_dir) as job_fd:
        for entry in _walk_sub(job_fd, sub):
            try:
                if entry.is_dir:
                    os.rmdir(entry.name, dir_fd=entry.dir_fd)
                    continue
                record = file_record(entry) or _other_record(entry)
                os.unlink(entry.name, dir_fd=entry.dir_fd)
            except OSError:
                left.append(entry.path)
                continue
            removed.append(record)
    if not sub:
        try:
            parent = os.open(job_dir.parent, _OPEN_DIR)
            try:
                os.rmdir(job_dir.name, dir_fd=parent)
            finally:
                os.close(parent)
        except OSError:
            left.append(".")
    return sorted(removed, key=lambda r: str(r["path"])), left


def _other_record(entry: Entry) -> dict[str, Any]:
    try:
        st = os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False)
    except OSError:
        return {"path": entry.path, "type": "gone", "size": None, "mtime": None, "sha256": None}
    kind = next((k for k, test in _KINDS if test(st.st_mode)), "other")
    return {"path": entry.path, "type": kind, "size": st.st_size, "mtime": st.st_mtime, "sha256": None}


_KINDS = (("file", stat.S_ISREG), ("symlink", stat.S_ISLNK), ("fifo", stat.S_ISFIFO), ("socket", stat.S_ISSOCK))


def since(records: list[dict[str, Any]], t: float | None) -> list[dict[str, Any]]:
    """The records modified at or after `t` (none when there was no signal)."""
    if t is None:
        return []
    return [r for r in records if float(r["mtime"]) >= t - MTIME_SLACK_SECONDS]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, *, owner: int | None = None) -> list[str]:
    """The last `lines` lines of the job's output log, decoded leniently; [] unless it is a regular file (owned
    by `owner`, if given: the job could have linked another file in its place)."""
    try:
        fd = os.open(path, _OPEN_FILE)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
                return []
            # Read only the end: training logs can be gigabytes.
            f.seek(max(0, st.st_size - 64 * 1024))
            data = f.read(64 * 1024)
    except OSError:
        return []
    tail: deque[str] = deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=lines)
    return list(tail)
