"""Checkpoint a SQLite WAL in a background thread, so that no commit pays for it.

SQLite's automatic checkpoint runs inside whichever commit takes the WAL past 1,000 pages: that commit
copies the WAL back into the database and fsyncs both (150-300 ms on this project's machines) while every
other writer waits behind it, which showed up as p99 spikes on submissions and appends. Connections that
write turn the automatic checkpoint off (`AUTOCHECKPOINT_OFF`), and one of these per database file
checkpoints every `interval_s` in PASSIVE mode, which never blocks a reader or a writer. A WAL that
readers keep from restarting and that grows past `RESTART_FRAMES` gets a RESTART checkpoint, which waits
for them (writers wait too, briefly), so that it cannot grow without bound.

Under a steady stream of commits, though, a PASSIVE pass never reaches the end of the WAL (frames come in
while it copies), and SQLite restarts a WAL only once it has all been copied. So the WAL grew to
`RESTART_FRAMES`, whose RESTART then stalled the ledger's writer for 150 ms, and until then every commit
grew the file: an fsync that grows a file also commits the file system's journal (0.35 ms instead of
0.2 ms on a quiet disk, several ms when other I/O is queued on that journal). A database with one busy
writer (the ledger) therefore takes `finishing=True`: it asks for rounds by volume (`kick`), and the
writer finishes each round itself between two of its transactions (`finish_due`, `finish`), copying the
frames that came in meanwhile; its next transaction then restarts the WAL from the start, and later
commits overwrite blocks the file already has. The finish also has to fsync the database pages the round
copied (SQLite syncs the database only when a pass reaches the end of the WAL): 4-6 ms in the writer on
this project's machines. So after its first pass a round makes three more, each just after one of the
writer's commits (`committed`): copying one commit's frames often ends before the next commit, the sync
then happens in this thread, and the finish takes about 1 ms (one such pass was not enough often enough).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

AUTOCHECKPOINT_OFF = "PRAGMA wal_autocheckpoint=0"
RESTART_FRAMES = 16_384  # 64 MiB of 4 KiB pages
_PASSES = 4  # per round, when finishing: one, then three after commits (one of which usually syncs)
_COMMIT_WAIT_S = 0.05

log = logging.getLogger("jobgate.sqlite")


class WalCheckpointer:
    """Runs `PRAGMA wal_checkpoint(PASSIVE)` on its own connection every `interval_s` (or at once when
    kicked) until closed."""

    def __init__(self, path: Path, interval_s: float = 1.0, *, finishing: bool = False) -> None:
        self.path = path
        self.interval_s = interval_s
        self.finishing = finishing
        self.checkpoints = 0  # completed rounds (read them, do not write)
        # finishing only: True after a round, until the writer calls finish() (read it, do not write).
        self.finish_due = False
        self._stop = False
        self._wake = threading.Event()
        self._commit = threading.Event()
        self._waiting = False  # for committed()
        self._seen = -1  # the WAL's frames at the end of the last round
        self._thread = threading.Thread(target=self._run, name=f"wal-checkpoint {path.name}", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Start a round now (the writer has committed enough since the last one)."""
        self._wake.set()

    def finish(self, conn: sqlite3.Connection) -> None:
        """Copy what the last round left behind, on the writer's connection, outside a transaction.

        PASSIVE too, so it never waits (while a round runs it does nothing). With no other writer it
        reaches the end of the WAL, so the writer's next transaction restarts the WAL unless a reader
        is still using it. Raises sqlite3.Error.
        """
        self.finish_due = False
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous=FULL")  # the checkpoint fsyncs the database file
            conn.execute("PRAGMA busy_timeout=5000")  # for RESTART only; PASSIVE never waits
            while True:
                self._wake.wait(self.interval_s)
                self._wake.clear()
                if self._stop:
                    break
                try:
                    self._round(conn)
                    self.checkpoints += 1
                except sqlite3.Error as e:  # e.g. the file went away; the next round tries again
                    log.warning("WAL checkpoint of %s failed: %s", self.path, e)
        finally:
            conn.close()

    def committed(self) -> None:
        """The writer has just committed (finishing only; cheap unless a round waits for it)."""
        if self._waiting:
            self._commit.set()

    def _after_next_commit(self) -> None:
        self._commit.clear()
        self._waiting = True
        self._commit.wait(_COMMIT_WAIT_S)  # a writer that has gone quiet leaves the WAL whole anyway
        self._waiting = False

    def _round(self, conn: sqlite3.Connection) -> None:
        for i in range(_PASSES if self.finishing else 1):
            if i:
                if self._stop:
                    return
                # A pass that copies the few frames of one commit before the next one lands reaches the
                # end of the WAL, and then SQLite fsyncs the database here, not in the writer's finish().
                self._after_next_commit()
            # frames: the WAL's frames when the pass began; done: how many of them are now copied.
            busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames > RESTART_FRAMES:
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                return
            if busy or done <= 0 or frames == self._seen:
                return  # (the same frames as the last round saw: nothing was written since)
        self._seen = frames
        self.finish_due = self.finishing

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._commit.set()
        self._thread.join(timeout=10)
