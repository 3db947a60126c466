"""Stop evidence (P4, C3, C5): which files a job produced and what its log said last.

Stopping is not rolling back (C5): everything under the checkpoints directory is listed as an artifact,
and the subset written since the prepare signal is listed separately as the checkpoints of this stop.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20
# Filesystem timestamps come from a coarse kernel clock that may lag time.time() by a tick (≤ 10 ms),
# so a checkpoint written right after the signal could otherwise look older than the signal.
MTIME_SLACK_SECONDS = 0.01


def file_record(path: Path, base: Path) -> dict[str, Any] | None:
    """`{"path", "size", "mtime", "sha256"}` for one file, or None if it vanished while we looked."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    return {
        "path": path.relative_to(base).as_posix(),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "sha256": digest.hexdigest(),
    }


def scan_files(directory: Path, base: Path) -> list[dict[str, Any]]:
    """Records for every regular file under `directory`, paths relative to `base`, sorted by path."""
    records = []
    if directory.is_dir():
        for root, _dirs, files in os.walk(directory):
            for name in files:
                record = file_record(Path(root) / name, base)
                if record is not None:
                    records.append(record)
    return sorted(records, key=lambda r: str(r["path"]))


def since(records: list[dict[str, Any]], t: float | None) -> list[dict[str, Any]]:
    """The records modified at or after `t` (none when there was no signal)."""
    if t is None:
        return []
    return [r for r in records if float(r["mtime"]) >= t - MTIME_SLACK_SECONDS]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of the job's output log, decoded leniently."""
    try:
        with path.open("rb") as f:
            # Read only the end: training logs can be gigabytes.
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return []
    tail: deque[str] = deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=lines)
    return list(tail)
