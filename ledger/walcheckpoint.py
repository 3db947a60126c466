"""Checkpoint a SQLite WAL in a background thread, so that no commit pays for it.

SQLite's automatic checkpoint runs inside whichever commit takes the WAL past 1,000 pages: that commit
copies the WAL back into the database and fsyncs both (150-300 ms on this project's machines) while every
other writer waits behind it, which showed up as p99 spikes on submissions and appends. Connections that
write turn the automatic checkpoint off (`AUTOCHECKPOINT_OFF`), and one of these per database file
checkpoints every `interval_s` in PASSIVE mode, which never blocks a reader or a writer. A WAL that
readers keep from restarting and that grows past `RESTART_FRAMES` gets a RESTART checkpoint, which waits
for them (writers wait too, briefly), so that it cannot grow without bound.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

AUTOCHECKPOINT_OFF = "PRAGMA wal_autocheckpoint=0"
RESTART_FRAMES = 16_384  # 64 MiB of 4 KiB pages

log = logging.getLogger("jobgate.sqlite")


class WalCheckpointer:
    """Runs `PRAGMA wal_checkpoint(PASSIVE)` on its own connection every `interval_s` until closed."""

    def __init__(self, path: Path, interval_s: float = 1.0) -> None:
        self.path = path
        self.interval_s = interval_s
        self.checkpoints = 0  # completed rounds (read them, do not write)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wal-checkpoint {path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous=FULL")  # the checkpoint fsyncs the database file
            conn.execute("PRAGMA busy_timeout=5000")  # for RESTART only; PASSIVE never waits
            while not self._stop.wait(self.interval_s):
                try:
                    _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if frames > RESTART_FRAMES:
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error as e:  # e.g. the file went away; the next round tries again
                    log.warning("WAL checkpoint of %s failed: %s", self.path, e)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
