"""SqliteStore.write_batch: one statement per batch through the ledger_batch view, or an explicit
transaction of several when the batch has more bound values than a statement may hold (or the database
predates the view); all or nothing either way, with the same stored types."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ledger.errors import StoreError
from ledger.store import Row, SqliteStore


def rows(start: int, n: int) -> list[Row]:
    return [(s, f"{s:064x}", b'{"seq":%d}' % s) for s in range(start, start + n)]


def traced(store: SqliteStore) -> list[str]:
    """The SQL statements the store's writer connection runs from now on, up to their column list (SQLite
    reports a statement again for each trigger step it runs)."""
    seen: list[str] = []
    store._w.set_trace_callback(lambda sql: seen.append(sql.split(" (")[0]))
    return seen


def stored(path: Path) -> tuple[list[tuple[int, str, str, str]], list[tuple[int, str]], list[tuple[str, bytes]]]:
    conn = sqlite3.connect(path)
    try:
        entries = conn.execute("SELECT seq, typeof(hash), typeof(data), hash FROM ledger_entries ORDER BY seq")
        cps = conn.execute("SELECT size, typeof(note) FROM ledger_checkpoints ORDER BY size")
        blobs = conn.execute("SELECT digest, data FROM ledger_blobs ORDER BY digest")
        return entries.fetchall(), cps.fetchall(), blobs.fetchall()
    finally:
        conn.close()


def test_a_batch_is_one_insert_statement(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "l.db")
    seen = traced(store)
    woken: list[int] = []
    store.write_batch(rows(0, 3), {"d" * 64: b"blob"}, (3, "note\n"), before_commit=lambda: woken.append(len(seen)))
    store.close()
    # No BEGIN / COMMIT: each statement the writer runs gives the GIL away and must win it back.
    assert set(seen) == {"INSERT INTO ledger_batch"}
    assert woken == [0]
    entries, cps, blobs = stored(tmp_path / "l.db")
    assert [(s, th, td) for s, th, td, _ in entries] == [(0, "text", "blob"), (1, "text", "blob"), (2, "text", "blob")]
    assert cps == [(3, "text")]
    assert blobs == [("d" * 64, b"blob")]


def test_a_batch_too_big_for_one_statement_is_one_transaction_of_several(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "l.db")
    store._w.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 30)
    seen = traced(store)
    store.write_batch(rows(0, 25), {}, (25, "note\n"))
    store.close()
    assert seen[0] == "BEGIN IMMEDIATE" and seen[-1] == "COMMIT"
    assert seen.count("INSERT INTO ledger_entries") == 3  # 10 rows (30 values) per statement
    entries, cps, _ = stored(tmp_path / "l.db")
    assert [e[0] for e in entries] == list(range(25)) and {e[2] for e in entries} == {"blob"}
    assert cps == [(25, "text")]


@pytest.mark.parametrize("max_params", [32766, 30], ids=["one-statement", "in-steps"])
def test_a_failing_batch_leaves_nothing_behind(tmp_path: Path, max_params: int) -> None:
    store = SqliteStore(tmp_path / "l.db")
    store._w.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, max_params)
    store.write_batch(rows(0, 2), {"a" * 64: b"A"}, (2, "note 2\n"))
    with pytest.raises(StoreError):  # the checkpoint for size 2 exists: the whole batch must go
        store.write_batch(rows(2, 20), {"b" * 64: b"B", "a" * 64: b"A"}, (2, "again\n"))
    store.write_batch(rows(2, 1), {"a" * 64: b"A"}, (3, "note 3\n"))  # a stored blob again is fine
    store.close()
    entries, cps, blobs = stored(tmp_path / "l.db")
    assert [e[0] for e in entries] == [0, 1, 2]
    assert cps == [(2, "text"), (3, "text")]
    assert blobs == [("a" * 64, b"A")]


def test_a_database_without_the_view_is_written_in_steps_until_its_schema_is_updated(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP VIEW ledger_batch")  # (its trigger goes with it): a database from before the view
    conn.close()
    old = SqliteStore(path, create=False)
    seen = traced(old)
    old.write_batch(rows(0, 2), {}, (2, "note\n"))
    old.close()
    assert "INSERT INTO ledger_entries" in seen and "INSERT INTO ledger_batch" not in seen
    new = SqliteStore(path)  # create=True adds the view
    seen = traced(new)
    new.write_batch(rows(2, 2), {}, (4, "note\n"))
    new.close()
    assert set(seen) == {"INSERT INTO ledger_batch"}
    entries, cps, _ = stored(path)
    assert [e[0] for e in entries] == [0, 1, 2, 3] and [c[0] for c in cps] == [2, 4]


def test_the_first_batch_trigger_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(
        """CREATE TRIGGER ledger_batch_insert INSTEAD OF INSERT ON ledger_batch BEGIN
             INSERT INTO ledger_entries (seq, hash, data) SELECT NEW.seq, NEW.hash, NEW.data
               WHERE NEW.seq IS NOT NULL AND NEW.hash IS NOT NULL;
           END"""
    )
    conn.close()
    store = SqliteStore(path)  # beside today's triggers it would insert every entry a second time
    store.write_batch(rows(0, 2), {}, (2, "note\n"))
    store.close()
    entries, cps, _ = stored(path)
    assert [e[0] for e in entries] == [0, 1] and [c[0] for c in cps] == [2]
