"""Ledger service on real stores: appends, group commit, proofs, checkpoints, failure recovery."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from ledger.errors import (
    EntryNotFound,
    InvalidEntry,
    LedgerClosed,
    LedgerCorrupted,
    LedgerUnavailable,
    ProofError,
    StoreError,
)
from ledger.keys import NoteSigner
from ledger.merkle import leaf_hash, verify_consistency, verify_inclusion
from ledger.note import open_checkpoint
from ledger.service import Ledger
from ledger.store import Head, PostgresStore, Row, SequencedBatch, SqliteStore, open_store
from ledger.verify import verify_store


@pytest.fixture
def ledger(store_url: str, signer: NoteSigner, clock: Callable[[], datetime]) -> Iterator[Ledger]:
    led = Ledger.open(store_url, signer=signer, clock=clock)
    yield led
    led.close()


def test_append_read_prove_and_verify(ledger: Ledger, store_url: str, signer: NoteSigner) -> None:
    v = signer.verifier()
    assert open_checkpoint(ledger.latest_checkpoint(), v).size == 0
    r0 = ledger.append("decision", {"actor": "alice", "n": 1})
    r1 = ledger.append("outcome", {"ok": True}, blobs={"snapshot": b"queue state"})
    assert (r0.seq, r1.seq) == (0, 1)
    assert r0.time == "2025-01-02T03:04:05.000001Z"
    e1 = ledger.entry(1)
    assert e1.hash == r1.hash and e1.value["prev"] == r0.hash and e1.value["kind"] == "outcome"
    assert e1.value["blobs"] == r1.blobs
    assert ledger.blob(r1.blobs["snapshot"]) == b"queue state"
    assert ledger.entry(0).value["prev"] == "0" * 64
    for i in range(2, 11):
        ledger.append("decision", {"i": i})
    assert ledger.size() == 11
    assert [e.seq for e in ledger.entries(3, 4)] == [3, 4, 5, 6]
    cp = open_checkpoint(ledger.latest_checkpoint(), v)
    assert cp.size == 11 and cp.origin == signer.name
    for seq in range(11):
        p = ledger.inclusion_proof(seq)
        assert p.leaf_hash == leaf_hash(ledger.entry(seq).raw)
        assert verify_inclusion(seq, 11, p.leaf_hash, p.hashes, cp.root)
    c = ledger.consistency_proof(5)
    assert verify_consistency(5, 11, c.hashes, ledger.root(5), cp.root)
    assert set(ledger.inclusion_proof(3, 7).to_json()) == {"leaf_index", "tree_size", "leaf_hash", "hashes"}
    assert c.to_json()["old_size"] == 5 and c.to_json()["new_size"] == 11
    with pytest.raises(EntryNotFound):
        ledger.entry(11)
    with pytest.raises(ProofError):
        ledger.inclusion_proof(3, 12)
    verdict = verify_store(store_url, v)
    assert verdict.ok and verdict.size == 11 and verdict.checkpoints == 11, verdict.message


def test_reopen_rebuilds_the_same_tree(store_url: str, signer: NoteSigner) -> None:
    with Ledger.open(store_url, signer=signer) as led:
        for i in range(37):
            led.append("k", {"i": i})
        root = led.root()
    with Ledger.open(store_url, signer=signer) as led:
        assert led.size() == 37 and led.root() == root
        assert led.append("k", {}).seq == 37
        assert led.entry(37).value["prev"] == led.entry(36).hash


def test_group_commit_64_threads(ledger: Ledger, store_url: str, signer: NoteSigner) -> None:
    per_thread = 20
    got: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def worker(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            try:
                r = ledger.append("decision", {"thread": t, "i": i, "pad": "x" * 200})
                # Readable as soon as append returns.
                assert ledger.entry(r.seq).hash == r.hash
            except BaseException as e:
                errors.append(e)
                return
            with lock:
                got.append(r.seq)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(64)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    n = 64 * per_thread
    assert sorted(got) == list(range(n))
    assert ledger.size() == n
    assert ledger.stats.max_batch > 1 and ledger.stats.entries == n
    assert ledger.stats.batches < n
    verdict = verify_store(store_url, signer.verifier())
    assert verdict.ok, verdict.message
    assert verdict.checkpoints == ledger.stats.batches


def test_invalid_entries_do_not_disturb_the_ledger(ledger: Ledger) -> None:
    with pytest.raises(InvalidEntry):
        ledger.append("k", {"x": float("inf")})
    with pytest.raises(InvalidEntry):
        ledger.append("", {})
    assert ledger.append("k", {}).seq == 0


def test_append_after_close_raises(store_url: str, signer: NoteSigner) -> None:
    led = Ledger.open(store_url, signer=signer)
    led.close()
    led.close()
    with pytest.raises(LedgerClosed):
        led.append("k", {})


class FlakyStore(SqliteStore):
    """A real SQLite store whose writes can be made to fail before or after the commit."""

    fail_before = False
    fail_after = False

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        if self.fail_before:
            raise StoreError("disk full")
        super().write_batch(rows, blobs, checkpoint, before_commit)
        if self.fail_after:
            raise StoreError("connection lost after COMMIT")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def flaky(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FlakyStore | GatedPgStore, str]:
    """A store whose writes fail on demand, before or after the commit, and its URL: on both engines."""
    if request.param == "sqlite":
        return FlakyStore(tmp_path / "ledger.db"), f"sqlite:///{tmp_path}/ledger.db"
    url = str(request.getfixturevalue("pg_url"))
    return GatedPgStore(url), url


def test_failed_write_raises_and_keeps_memory_consistent(flaky: tuple[FlakyStore | GatedPgStore, str],
                                                         signer: NoteSigner) -> None:
    store, url = flaky
    led = Ledger.from_store(store, signer=signer)
    led.append("k", {"i": 0})
    root1 = led.root()
    store.fail_before = True
    with pytest.raises(LedgerUnavailable):
        led.append("k", {"i": 1})
    assert led.size() == 1 and led.root() == root1
    assert led.stats.failed_batches == 1
    store.fail_before = False
    assert led.append("k", {"i": 2}).seq == 1
    # A commit that reached the disk counts even if the driver then reported an error.
    store.fail_after = True
    assert led.append("k", {"i": 3}).seq == 2
    store.fail_after = False
    assert led.append("k", {"i": 4}).seq == 3
    led.close()
    verdict = verify_store(url, signer.verifier())
    assert verdict.ok and verdict.size == 4, verdict.message


def test_open_refuses_a_broken_tail(tmp_path: Path, signer: NoteSigner) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(url, signer=signer) as led:
        for i in range(5):
            led.append("k", {"i": i})
    conn = sqlite3.connect(tmp_path / "ledger.db")
    conn.execute("DROP TRIGGER ledger_entries_no_delete")
    conn.execute("DELETE FROM ledger_entries WHERE seq = 4")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerCorrupted):
        Ledger.open(url, signer=signer)


def test_store_refuses_updates_and_deletes(tmp_path: Path, signer: NoteSigner) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(url, signer=signer) as led:
        led.append("k", {})
    conn = sqlite3.connect(tmp_path / "ledger.db")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE ledger_entries SET hash = 'x'")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("DELETE FROM ledger_checkpoints")
    conn.close()


@pytest.mark.integration
def test_postgres_refuses_updates_deletes_and_truncate(pg_url: str, signer: NoteSigner) -> None:
    import psycopg

    with Ledger.open(pg_url, signer=signer) as led:
        led.append("k", {}, blobs={"b": b"blob"})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for stmt in ("UPDATE ledger_entries SET hash = 'x'", "DELETE FROM ledger_blobs", "TRUNCATE ledger_entries"):
            with pytest.raises(psycopg.errors.RaiseException):
                conn.execute(stmt)


def test_both_spellings_of_an_absolute_sqlite_url_name_the_same_file(tmp_path: Path) -> None:
    for url in (f"sqlite://{tmp_path}/ledger.db", f"sqlite:///{tmp_path}/ledger.db"):  # tmp_path starts with /
        store = open_store(url)
        assert isinstance(store, SqliteStore) and str(store.path) == f"{tmp_path}/ledger.db", url
        store.close()


def test_bad_urls_raise_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        open_store("mysql://x/y")
    with pytest.raises(StoreError):
        open_store(f"sqlite:///{tmp_path}/absent.db", create=False)


class GatedStore(FlakyStore):
    """A real SQLite store whose batch writes wait at a gate (open until cleared), so a test can pile up
    appends behind a write; `writing` tells when the writer has reached it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self.writing.set()
        assert self.gate.wait(30)
        super().write_batch(rows, blobs, checkpoint, before_commit)


class GatedPgStore(PostgresStore):
    """GatedStore's and FlakyStore's PostgreSQL twin: a real store whose sequenced batches wait at a gate (open
    until cleared), and fail before writing while `fail_before` is set, after committing while `fail_after` is."""

    fail_before = False
    fail_after = False

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()

    def write_sequenced(
        self, build: Callable[[Head], SequencedBatch], before_commit: Callable[[], None] | None = None
    ) -> None:
        self.writing.set()
        assert self.gate.wait(30)
        if self.fail_before:
            raise StoreError("disk full")
        super().write_sequenced(build, before_commit)
        if self.fail_after:
            raise StoreError("connection lost after COMMIT")


def _wait_for(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _append_in_threads(led: Ledger, n: int) -> tuple[list[threading.Thread], dict[int, object]]:
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = led.append("k", {"i": i})
        except BaseException as e:  # the test inspects what each caller got
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    return threads, out


def test_a_batch_of_waiters_is_woken_one_after_another(tmp_path: Path, signer: NoteSigner) -> None:
    store = GatedStore(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    store.gate.clear()
    first, _ = _append_in_threads(led, 1)
    assert store.writing.wait(10)
    # These queue up behind the first batch and commit together in the next one.
    threads, got = _append_in_threads(led, 20)
    _wait_for(lambda: len(led._queue) == 20)
    store.gate.set()
    for th in first + threads:
        th.join(30)
        assert not th.is_alive()
    seqs = sorted(r.seq for r in got.values())  # type: ignore[attr-defined]
    assert seqs == list(range(1, 21)) and led.stats.max_batch == 20
    led.close()


class _InterruptOnce:
    """A lock whose first wait raises, as KeyboardInterrupt does in the main thread."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self.raised = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking and self._lock.locked() and not self.raised:
            self.raised = True
            raise KeyboardInterrupt
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()


def test_an_interrupted_waiter_does_not_strand_the_rest_of_its_batch(
    tmp_path: Path, signer: NoteSigner, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ledger.service as service

    store = GatedStore(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    store.gate.clear()
    first, _ = _append_in_threads(led, 1)
    assert store.writing.wait(10)
    flaky = _InterruptOnce()
    made = iter([flaky])
    monkeypatch.setattr(service, "_allocate_lock", lambda: next(made, None) or _thread.allocate_lock())
    interrupted, got_i = _append_in_threads(led, 1)  # the head of the next batch: it holds the baton
    _wait_for(lambda: len(led._queue) == 1)
    monkeypatch.setattr(service, "_allocate_lock", _thread.allocate_lock)
    threads, got = _append_in_threads(led, 10)
    _wait_for(lambda: len(led._queue) == 11)
    store.gate.set()
    for th in first + interrupted + threads:
        th.join(30)
        assert not th.is_alive(), "a caller was never woken"
    assert isinstance(got_i[0], KeyboardInterrupt)
    assert sorted(r.seq for r in got.values()) == list(range(2, 12))  # type: ignore[attr-defined]
    assert led.size() == 12  # the interrupted caller's entry was committed all the same
    led.close()


class MaintainedStore(SqliteStore):
    """A real SQLite store that asks for maintenance after every batch and holds it at a gate."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.due = False
        self.gate = threading.Event()
        self.maintaining = threading.Event()

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        super().write_batch(rows, blobs, checkpoint, before_commit)
        self.due = True

    def maintenance_due(self) -> bool:
        return self.due

    def maintain(self) -> None:
        self.due = False
        self.maintaining.set()
        assert self.gate.wait(30)
        super().maintain()


def test_callers_of_a_durable_batch_do_not_wait_for_store_maintenance(tmp_path: Path, signer: NoteSigner) -> None:
    store = MaintainedStore(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    threads, got = _append_in_threads(led, 1)
    try:
        assert store.maintaining.wait(10)
        threads[0].join(10)
        assert not threads[0].is_alive() and got[0].seq == 0  # type: ignore[attr-defined]
    finally:
        store.gate.set()
        led.close()
    assert led.stats.batches == 1


def test_steady_appends_keep_the_sqlite_wal_short(
    tmp_path: Path, signer: NoteSigner, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ledger.store

    monkeypatch.setattr(ledger.store, "_CHECKPOINT_EVERY", 64 << 10)
    led = Ledger.open(f"sqlite:///{tmp_path}/ledger.db", signer=signer)

    def run(t: int) -> None:
        for i in range(500):
            led.append("k", {"t": t, "i": i, "pad": "x" * 1000})

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wal = (tmp_path / "ledger.db-wal").stat().st_size
    led.close()
    # 4,000 entries of 1 KiB take about 8 MB of WAL frames; restarted after every round, the WAL
    # stays a small part of that (without the writer's help it would restart only when writing pauses).
    assert wal < 2_000_000, wal
