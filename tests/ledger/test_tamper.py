"""Tampering through raw SQL on the ledger database; the verifier must name the exact problem.

An attacker with the file (or the PostgreSQL owner) can drop or disable the append-only triggers, so each test
does that first.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from ledger_bundle_kit import TAMPER_VARIANTS, Line, delete, edit, edit_prev, insert, relink, run

from ledger.entry import encode, prepare
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.store import open_store
from ledger.verify import verify_store

N = 12
BLOB_SEQ = 3


@pytest.fixture
def db(tmp_path: Path, signer: NoteSigner, clock: Callable[[], datetime]) -> Path:
    path = tmp_path / "ledger.db"
    with Ledger.open(f"sqlite:///{path}", signer=signer, clock=clock) as led:
        for i in range(N):
            blobs = {"snapshot": b"queue snapshot " * 10} if i == BLOB_SEQ else None
            led.append("decision", {"i": i, "actor": "alice"}, blobs=blobs)
    return path


def raw(db: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    conn = sqlite3.connect(db)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    for sql, args in statements:
        conn.execute(sql, args)
    conn.commit()
    conn.close()


def row(db: Path, seq: int) -> tuple[str, bytes]:
    conn = sqlite3.connect(db)
    h, data = conn.execute("SELECT hash, data FROM ledger_entries WHERE seq = ?", (seq,)).fetchone()
    conn.close()
    return h, data


def check(db: Path, signer: NoteSigner, problem: str, seq: int | None) -> None:
    v = verify_store(f"sqlite:///{db}", signer.verifier())
    assert not v.ok
    assert (v.problem, v.first_bad_seq) == (problem, seq), v.message
    assert v.problem in v.message and "\n" not in v.message


def test_intact(db: Path, signer: NoteSigner) -> None:
    v = verify_store(f"sqlite:///{db}", signer.verifier(), deep=True)
    assert v.ok and v.size == N and v.checkpoints == N, v.message


def test_one_byte_changed_is_modified(db: Path, signer: NoteSigner) -> None:
    _, data = row(db, 5)
    bad = data.replace(b'"alice"', b'"alicf"')
    raw(db, ("UPDATE ledger_entries SET data = ? WHERE seq = 5", (bad,)))
    check(db, signer, "modified", 5)


def test_rewritten_hash_column_names_the_entry_not_the_next(db: Path, signer: NoteSigner) -> None:
    # The chain breaks at seq 6 (its prev is the old hash); the checkpoint at size 6 says seq 5 is the one changed.
    _, data = row(db, 5)
    bad = data.replace(b'"alice"', b'"mallory"')
    raw(db, ("UPDATE ledger_entries SET data = ?, hash = ? WHERE seq = 5", (bad, hashlib.sha256(bad).hexdigest())))
    check(db, signer, "modified", 5)


def test_rewritten_last_entry_fails_its_checkpoint(db: Path, signer: NoteSigner) -> None:
    _, data = row(db, N - 1)
    bad = data.replace(b'"alice"', b'"mallory"')
    raw(
        db,
        ("UPDATE ledger_entries SET data = ?, hash = ? WHERE seq = ?", (bad, hashlib.sha256(bad).hexdigest(), N - 1)),
    )
    check(db, signer, "modified", N - 1)


def test_deleted_middle_entry_is_missing(db: Path, signer: NoteSigner) -> None:
    raw(db, ("DELETE FROM ledger_entries WHERE seq = 6", ()))
    check(db, signer, "missing", 6)


def test_swapped_entries_are_reordered(db: Path, signer: NoteSigner) -> None:
    h4, d4 = row(db, 4)
    h7, d7 = row(db, 7)
    raw(
        db,
        ("UPDATE ledger_entries SET hash = ?, data = ? WHERE seq = 4", (h7, d7)),
        ("UPDATE ledger_entries SET hash = ?, data = ? WHERE seq = 7", (h4, d4)),
    )
    check(db, signer, "reordered", 4)


def test_truncated_tail_is_truncated(db: Path, signer: NoteSigner) -> None:
    raw(db, ("DELETE FROM ledger_entries WHERE seq >= 9", ()))
    check(db, signer, "truncated", 9)


def test_unsigned_appended_entry_is_inserted(db: Path, signer: NoteSigner) -> None:
    prev, _ = row(db, N - 1)
    data = encode(prepare("decision", {"forged": True}, None), N, "2025-01-02T03:04:06.000000Z", prev)
    raw(db, ("INSERT INTO ledger_entries VALUES (?, ?, ?)", (N, hashlib.sha256(data).hexdigest(), data)))
    check(db, signer, "inserted", N)


def test_entry_shifted_in_is_inserted(db: Path, signer: NoteSigner) -> None:
    rows = [row(db, s) for s in range(N)]
    forged = encode(prepare("decision", {"forged": True}, None), 5, "2025-01-02T03:04:06.000000Z", rows[4][0])
    stmts = [("DELETE FROM ledger_entries WHERE seq >= 5", ())]
    shifted = [(hashlib.sha256(forged).hexdigest(), forged), *rows[5:]]
    stmts += [("INSERT INTO ledger_entries VALUES (?, ?, ?)", (5 + i, h, d)) for i, (h, d) in enumerate(shifted)]
    raw(db, *stmts)
    check(db, signer, "inserted", 5)  # the forged entry, not the one after it that still claims seq 5


def test_bad_checkpoint_signature(db: Path, signer: NoteSigner) -> None:
    conn = sqlite3.connect(db)
    (note,) = conn.execute("SELECT note FROM ledger_checkpoints WHERE size = 4").fetchone()
    conn.close()
    text, _, line = note.rpartition("\n\n")
    dash, name, b64 = line.rstrip("\n").split(" ")
    sig = bytearray(base64.b64decode(b64))
    sig[-1] ^= 1
    forged = f"{text}\n\n{dash} {name} {base64.b64encode(bytes(sig)).decode()}\n"
    raw(db, ("UPDATE ledger_checkpoints SET note = ? WHERE size = 4", (forged,)))
    check(db, signer, "bad_signature", None)


def test_checkpoint_with_changed_root_is_bad_signature(db: Path, signer: NoteSigner) -> None:
    conn = sqlite3.connect(db)
    (note,) = conn.execute("SELECT note FROM ledger_checkpoints WHERE size = 4").fetchone()
    conn.close()
    lines = note.split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    raw(db, ("UPDATE ledger_checkpoints SET note = ? WHERE size = 4", ("\n".join(lines),)))
    check(db, signer, "bad_signature", None)


def test_other_key_is_untrusted_key_not_tampering(db: Path) -> None:
    v = verify_store(f"sqlite:///{db}", NoteSigner.generate("jobgate.local/ledger").verifier())
    assert (v.ok, v.problem, v.first_bad_seq) == (False, "untrusted_key", None)
    assert "signed by a key not in the history you gave" in v.message


def test_changed_blob_is_blob_mismatch(db: Path, signer: NoteSigner) -> None:
    raw(db, ("UPDATE ledger_blobs SET data = ?", (b"another snapshot",)))
    check(db, signer, "blob_mismatch", BLOB_SEQ)


def test_deleted_blob_is_blob_mismatch(db: Path, signer: NoteSigner) -> None:
    raw(db, ("DELETE FROM ledger_blobs", ()))
    check(db, signer, "blob_mismatch", BLOB_SEQ)


@pytest.mark.parametrize(
    "data",
    [b"not json", b"\xff\xfe", b"[1,2]", b'{"seq":5}', b"[" * 100000],
    ids=["text", "not-utf8", "array", "fields", "deep-nesting"],
)
def test_garbage_with_matching_hash_is_malformed(db: Path, signer: NoteSigner, data: bytes) -> None:
    raw(db, ("UPDATE ledger_entries SET data = ?, hash = ? WHERE seq = 5", (data, hashlib.sha256(data).hexdigest())))
    check(db, signer, "malformed", 5)


def test_garbage_checkpoint_is_malformed(db: Path, signer: NoteSigner) -> None:
    raw(db, ("UPDATE ledger_checkpoints SET note = 'garbage' WHERE size = 2", ()))
    check(db, signer, "malformed", None)


# -- every way of rewriting the entries, on both stores (ledger_bundle_kit.TAMPER_VARIANTS) -------------------


def rewrite(url: str, change: Callable[[list[Line]], object]) -> None:
    """Read every entry row, change the list, and write it back in place of the old rows, the append-only
    triggers out of the way (dropped on SQLite, disabled by the owner on PostgreSQL)."""
    store = open_store(url, create=False)
    try:
        rows: list[Line] = [(s, h.encode(), d) for s, h, d in store.get_entries(0, store.count())]
    finally:
        store.close()
    change(rows)
    values = [(s, h.decode(), d) for s, h, d in rows]
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        raw(path, ("DELETE FROM ledger_entries", ()))
        conn = sqlite3.connect(path)
        conn.executemany("INSERT INTO ledger_entries VALUES (?, ?, ?)", values)
        conn.commit()
        conn.close()
        return
    import psycopg

    with psycopg.connect(url) as pg:
        pg.execute("ALTER TABLE ledger_entries DISABLE TRIGGER USER")
        pg.execute("DELETE FROM ledger_entries")
        pg.cursor().executemany("INSERT INTO ledger_entries VALUES (%s, %s, %s)", values)
        pg.execute("ALTER TABLE ledger_entries ENABLE TRIGGER USER")


def build(url: str, signer: NoteSigner, clock: Callable[[], datetime], batch: int = 1, n: int = N) -> None:
    """n decisions by alice, committed `batch` at a time: one signed checkpoint per batch. On PostgreSQL by two
    appenders taking turns, as two replicas write it: each batch numbered from the head, signed by its committer."""
    with Ledger.open(url, signer=signer, clock=clock) as a, contextlib.ExitStack() as more:
        appenders = [a]
        if url.startswith("postgresql"):
            appenders.append(more.enter_context(Ledger.open(url, signer=signer, clock=clock)))
        for k, lo in enumerate(range(0, n, batch)):
            appenders[k % len(appenders)].append_many(
                [("decision", {"i": i, "actor": "alice"}, None) for i in range(lo, min(n, lo + batch))])


@pytest.mark.parametrize(
    ("change", "problem", "seq"), [v[1:] for v in TAMPER_VARIANTS], ids=[v[0] for v in TAMPER_VARIANTS]
)
def test_a_rewrite_names_the_first_entry_it_changed(
    store_url: str, tmp_path: Path, signer: NoteSigner, clock: Callable[[], datetime],
    change: Callable[[list[Line]], object], problem: str, seq: int,
) -> None:  # fmt: skip
    """`jobgate ledger verify --db` on SQLite and on PostgreSQL: one verifier over both stores' snapshots."""
    build(store_url, signer, clock)
    rewrite(store_url, change)
    code, out, err = run("verify", "--db", store_url, "--public-key", str(tmp_path / "keys" / "ledger.vkey"))
    assert code == 1 and out.startswith(f"FAIL: seq {seq} {problem}: ") and out.count("\n") == 1, out + err


# Batches of 8 share one checkpoint (sizes 8, 16, ... 48): inside a batch no signed root tells its entries apart,
# so the chain's break points at the entry, and the signed roots at the batch ends confirm or clear it.
BATCHED = [
    ("edited-first-of-batch", lambda r: edit(r, 40), "modified", 40),  # the chain breaks at 41, in the same batch
    ("edited-mid-batch", lambda r: edit(r, 43), "modified", 43),
    ("edited-last-of-batch", lambda r: edit(r, 39), "modified", 39),  # the break is in the next batch
    ("prev-of-first-of-batch", lambda r: edit_prev(r, 40), "modified", 40),  # the root at size 40 clears seq 39
    ("inserted-mid-batch", lambda r: insert(r, 43), "inserted", 43),
    ("edited-relinked-mid-batch", lambda r: (edit(r, 43), relink(r, 44)), "modified", 40),  # as near as it gets
    # Renumbered and re-chained, nothing but the roots shows it: the first entry of the batch they no longer
    # match is as near as the signatures go. In the last batch, whose root needs the entry removed, that cannot
    # be told from a cut there.
    ("deleted-relinked-mid-batch", lambda r: delete(r, 35), "missing", 32),
    ("deleted-relinked-in-last-batch", lambda r: delete(r, 43), "truncated", 40),
]


@pytest.mark.parametrize(("change", "problem", "seq"), [v[1:] for v in BATCHED], ids=[v[0] for v in BATCHED])
def test_a_rewrite_inside_a_batch_names_the_entry(
    tmp_path: Path, signer: NoteSigner, clock: Callable[[], datetime],
    change: Callable[[list[Line]], object], problem: str, seq: int,
) -> None:  # fmt: skip
    url = f"sqlite:///{tmp_path}/batched.db"
    build(url, signer, clock, batch=8, n=48)
    rewrite(url, change)
    v = verify_store(url, signer.verifier())
    assert (v.ok, v.problem, v.first_bad_seq) == (False, problem, seq), v.message
