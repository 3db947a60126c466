"""The WAL is checkpointed by a thread of its own, never inside a commit."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from ledger.walcheckpoint import AUTOCHECKPOINT_OFF, WalCheckpointer


def _writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(AUTOCHECKPOINT_OFF)
    conn.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    return conn


def _write_pages(conn: sqlite3.Connection, n: int) -> None:
    for _ in range(n):  # one commit of about one page each: well past the automatic 1,000-page mark
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 3000,))


def test_commits_leave_the_wal_alone_and_the_thread_checkpoints_it(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    conn = _writer(path)
    _write_pages(conn, 1500)
    time.sleep(0.3)
    assert path.stat().st_size < 100_000  # nothing checkpointed: the rows are only in the WAL
    checkpointer = WalCheckpointer(path, interval_s=0.05)
    try:
        deadline = time.monotonic() + 60
        while checkpointer.checkpoints < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpointer.checkpoints >= 1
        assert path.stat().st_size >= 1500 * 3000  # copied into the database file by the thread
    finally:
        checkpointer.close()
        conn.close()


def test_close_stops_the_thread(tmp_path: Path) -> None:
    checkpointer = WalCheckpointer(tmp_path / "db.sqlite", interval_s=0.01)
    checkpointer.close()
    done = checkpointer.checkpoints
    time.sleep(0.1)
    assert checkpointer.checkpoints == done


def test_the_ledger_store_and_the_business_db_write_without_automatic_checkpoints(tmp_path: Path) -> None:
    from gateway.store.db import Database
    from ledger.keys import NoteSigner
    from ledger.service import Ledger

    db = Database(f"sqlite:///{tmp_path / 'jobgate.db'}")
    try:
        with db.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    finally:
        db.close()
    led = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}", signer=NoteSigner.generate("test.example/ledger"))
    try:
        led.append("k", {"i": 0})
        with sqlite3.connect(tmp_path / "ledger.db") as probe:  # the setting is per connection: ask the store's
            assert probe.execute("PRAGMA wal_autocheckpoint").fetchone() == (1000,)  # a fresh one has the default
        assert led._store._w.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)  # type: ignore[attr-defined]
    finally:
        led.close()


def _frames(conn: sqlite3.Connection) -> tuple[int, int]:
    """(frames in the WAL, frames copied) without copying any: a PASSIVE pass that a held lock stops."""
    _busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return frames, done


def test_finish_lets_a_wal_that_kept_growing_during_the_rounds_restart(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    wal = tmp_path / "db.sqlite-wal"
    writer = _writer(path)
    _write_pages(writer, 300)
    reader, other = sqlite3.connect(path, isolation_level=None), sqlite3.connect(path, isolation_level=None)
    try:
        # The state a round leaves under steady commits: frames it could not copy (here held back by a
        # reader's snapshot instead, so that the test does not depend on timing).
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()
        _write_pages(writer, 20)
        frames, done = _frames(other)
        assert 0 < done < frames
        reader.execute("COMMIT")
        size = wal.stat().st_size
        _write_pages(writer, 50)
        assert wal.stat().st_size > size  # the WAL cannot restart: it grows
        checkpointer = WalCheckpointer(path, interval_s=3600, finishing=True)
        try:
            checkpointer.finish(writer)  # between two of the writer's transactions
            size = wal.stat().st_size
            _write_pages(writer, 100)
            assert wal.stat().st_size == size  # these overwrote the start of the WAL
            assert _frames(other)[0] < frames
        finally:
            checkpointer.close()
    finally:
        reader.close()
        other.close()
        writer.close()


@pytest.mark.parametrize("finishing", [True, False], ids=["ledger", "business-db"])
def test_a_round_that_copied_frames_asks_the_writer_to_finish_it(tmp_path: Path, finishing: bool) -> None:
    path = tmp_path / "db.sqlite"
    writer = _writer(path)
    _write_pages(writer, 50)
    checkpointer = WalCheckpointer(path, interval_s=3600, finishing=finishing)
    try:
        checkpointer.kick()
        deadline = time.monotonic() + 30
        while checkpointer.checkpoints < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        frames, done = _frames(writer)
        assert checkpointer.checkpoints == 1 and frames == done > 0
        assert checkpointer.finish_due is finishing
    finally:
        checkpointer.close()
        writer.close()


def test_a_finishing_round_makes_its_later_passes_right_after_the_writers_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ledger.walcheckpoint

    monkeypatch.setattr(ledger.walcheckpoint, "_COMMIT_WAIT_S", 60.0)
    path = tmp_path / "db.sqlite"
    writer = _writer(path)
    _write_pages(writer, 50)
    checkpointer = WalCheckpointer(path, interval_s=3600, finishing=True)
    try:
        checkpointer.kick()
        time.sleep(0.3)
        assert checkpointer.checkpoints == 0  # the first pass is done; the next waits for a commit
        deadline = time.monotonic() + 30
        while checkpointer.checkpoints < 1 and time.monotonic() < deadline:
            _write_pages(writer, 1)
            checkpointer.committed()
            time.sleep(0.01)
        assert checkpointer.checkpoints == 1 and checkpointer.finish_due
    finally:
        checkpointer.close()
        writer.close()
