"""Ledger storage port (LedgerStore) and its SQLite and PostgreSQL adapters.

Schema (both engines): ledger_entries(seq, hash, data), ledger_checkpoints(size, note),
ledger_blobs(digest, data). Triggers refuse UPDATE and DELETE (and TRUNCATE on PostgreSQL) so the
ledger role can only append and read (DESIGN.md "Stores", requirement H3). SQLite also has
ledger_batch, an always-empty view whose INSTEAD OF INSERT triggers send each row on to one of the
three tables, so that one INSERT statement writes a whole batch (see SqliteStore.write_batch). Every
driver error is mapped to StoreError here, at the boundary.

Who numbers the entries. SQLite has one writer (a flock, claim_writer): it numbers entries from what it
loaded, so a seq is known when an entry is queued. PostgreSQL is sequenced in the database, so that several
processes append to one ledger: its one-row table ledger_head holds where the next batch goes (next_seq, the
last entry's hash and time, the Merkle frontier, the signing key in use). A batch takes that row FOR UPDATE,
numbers its entries from it, writes them, their blobs, its checkpoint and the new head, and commits
(PostgresStore.write_sequenced): gapless, one chain, one tree, and never a PostgreSQL sequence (a sequence
leaves gaps on rollback). The gateway's role may UPDATE ledger_head, and nothing else it may change: its
DELETE and TRUNCATE are refused by trigger. A head that role sets wrong cannot rewrite history: set behind the
entries, the next batch collides with the seqs already stored and fails; set ahead, it leaves a gap the
verifier reports as missing; with another last hash, frontier or key, the next entry's prev, the next
checkpoint's root or its signature is wrong and the verifier names it. A process opening the ledger refuses a
head that disagrees with the entries (Ledger.open raises LedgerCorrupted).
"""

from __future__ import annotations

import collections
import fcntl
import functools
import itertools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Protocol
from urllib.parse import urlparse

from ledger.errors import StoreError
from ledger.walcheckpoint import AUTOCHECKPOINT_OFF, WalCheckpointer

if TYPE_CHECKING:
    from psycopg import Connection

Row = tuple[int, str, bytes]

log = logging.getLogger("jobgate.sqlite")
pg_log = logging.getLogger("jobgate.ledger.postgres")

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_entries (seq INTEGER PRIMARY KEY, hash TEXT NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_checkpoints (size INTEGER PRIMARY KEY, note TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TRIGGER IF NOT EXISTS ledger_entries_no_update BEFORE UPDATE ON ledger_entries
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_entries_no_delete BEFORE DELETE ON ledger_entries
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_checkpoints_no_update BEFORE UPDATE ON ledger_checkpoints
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_checkpoints_no_delete BEFORE DELETE ON ledger_checkpoints
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_blobs_no_update BEFORE UPDATE ON ledger_blobs
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_blobs_no_delete BEFORE DELETE ON ledger_blobs
  BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE VIEW IF NOT EXISTS ledger_batch (seq, hash, data) AS SELECT NULL, NULL, NULL WHERE 0;
-- One trigger per table, chosen by its WHEN clause: 40% less CPU per row than one trigger with three
-- INSERT ... SELECT ... WHERE steps, ledger_batch_insert, which the first schema with this view had.
DROP TRIGGER IF EXISTS ledger_batch_insert;
CREATE TRIGGER IF NOT EXISTS ledger_batch_entry INSTEAD OF INSERT ON ledger_batch
  WHEN NEW.seq IS NOT NULL AND NEW.hash IS NOT NULL
  BEGIN INSERT INTO ledger_entries (seq, hash, data) VALUES (NEW.seq, NEW.hash, NEW.data); END;
CREATE TRIGGER IF NOT EXISTS ledger_batch_checkpoint INSTEAD OF INSERT ON ledger_batch
  WHEN NEW.seq IS NOT NULL AND NEW.hash IS NULL
  BEGIN INSERT INTO ledger_checkpoints (size, note) VALUES (NEW.seq, NEW.data); END;
CREATE TRIGGER IF NOT EXISTS ledger_batch_blob INSTEAD OF INSERT ON ledger_batch
  WHEN NEW.seq IS NULL
  BEGIN INSERT OR IGNORE INTO ledger_blobs (digest, data) VALUES (NEW.hash, NEW.data); END;
"""

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_entries (seq BIGINT PRIMARY KEY, hash TEXT NOT NULL, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_checkpoints (size BIGINT PRIMARY KEY, note TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_blobs (digest TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_head (
  id BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),  -- one row
  next_seq BIGINT NOT NULL,   -- the entries stored: the seq the next batch starts at
  last_hash TEXT NOT NULL,    -- the hash of entry next_seq - 1 (64 zeros for none): the next entry's prev
  frontier BYTEA NOT NULL,    -- the RFC 6962 compact range [0, next_seq), 32-byte hashes, largest subtree first
  signer TEXT NOT NULL,       -- the verifier key that signs the next checkpoint ('' until the first batch)
  last_time TEXT NOT NULL     -- the time of entry next_seq - 1 ('' for none): no later entry is stamped earlier
);
-- An empty ledger gets its head with the schema. One that has entries but no head (written by a jobgate from
-- before the head) gets it computed from its entries by the next process that opens it (Ledger.open).
INSERT INTO ledger_head (id, next_seq, last_hash, frontier, signer, last_time)
  SELECT TRUE, 0, repeat('0', 64), '', '', '' WHERE NOT EXISTS (SELECT 1 FROM ledger_entries)
  ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'ledger is append-only'; END $$;
DO $$ DECLARE t text; BEGIN
  FOREACH t IN ARRAY ARRAY['ledger_entries', 'ledger_checkpoints', 'ledger_blobs'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = t || '_append_only') THEN
      EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I
                      FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()', t || '_append_only', t);
      EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I
                      FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change()', t || '_no_truncate', t);
    END IF;
  END LOOP;
  -- The head moves forward with every batch (UPDATE), but is never removed.
  IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'ledger_head_no_delete') THEN
    CREATE TRIGGER ledger_head_no_delete BEFORE DELETE ON ledger_head
      FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
    CREATE TRIGGER ledger_head_no_truncate BEFORE TRUNCATE ON ledger_head
      FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
  END IF;
END $$;
"""
_PG_TABLES = ("ledger_entries", "ledger_checkpoints", "ledger_blobs", "ledger_head")
# What appending takes (ledger/admin.py init-db grants the append-only role exactly these).
_APPEND_PRIVILEGES = (("ledger_entries", "INSERT"), ("ledger_checkpoints", "INSERT"), ("ledger_blobs", "INSERT"),
                      ("ledger_head", "UPDATE"))
_HEAD_COLUMNS = "next_seq, last_hash, frontier, signer, last_time"
# One statement for a whole batch: one round trip while the head is locked, not one per table; its parameters in
# binary (%b), which halved its time: a batch's 64 KiB of entries went as hex text, for the server to parse.
_PG_WRITE_BATCH = """
WITH entries AS (
  INSERT INTO ledger_entries (seq, hash, data) SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bytea[])
), blobs AS (
  INSERT INTO ledger_blobs (digest, data) SELECT * FROM unnest(%b::text[], %b::bytea[])
  ON CONFLICT (digest) DO NOTHING
), checkpoint AS (
  INSERT INTO ledger_checkpoints (size, note) VALUES (%b, %b)
)
UPDATE ledger_head SET next_seq = %b, last_hash = %b, frontier = %b, signer = %b, last_time = %b
"""

_FETCH = 2048
# Bound values a statement may hold: 999 before SQLite 3.32, 32,766 since (a build may set another).
_MAX_PARAMS = sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
# Entry bytes committed between two WAL checkpoint rounds (see ledger/walcheckpoint.py): the WAL then
# cycles through about twice this (pages are not full, a commit rewrites its last page) instead of growing.
_CHECKPOINT_EVERY = 4 << 20


@functools.lru_cache(maxsize=64)
def _multi_insert(n: int) -> str:
    return "INSERT INTO ledger_entries (seq, hash, data) VALUES " + ",".join(["(?, ?, ?)"] * n)


@functools.lru_cache(maxsize=64)
def _batch_insert(n: int) -> str:
    return "INSERT INTO ledger_batch (seq, hash, data) VALUES " + ",".join(["(?, ?, ?)"] * n)


def _row(seq: Any, h: Any, data: Any) -> Row:
    """Normalise a fetched row; a tampered SQLite file may hold TEXT, a number or NULL where BLOBs belong."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    elif not isinstance(data, bytes | bytearray | memoryview):
        # NULL, or a number: bytes(9_000_000_000_000_000_000) would try to allocate that many zero bytes. As
        # text, it fails its hash like any other edit.
        data = b"" if data is None else str(data).encode()
    return int(seq), str(h), bytes(data)


@dataclass
class ReadSnapshot:
    """A ledger as of one instant. The writer commits a batch's entries and its checkpoint together, so every
    entry here is covered by a checkpoint here: read apart, a verifier read the checkpoints, then entries
    appended since, and reported those as inserted, uncovered by any signed checkpoint."""

    total: int
    checkpoints: list[tuple[int, str]]
    entries: Iterator[Row]  # from seq 0, in the same transaction
    close: Callable[[], None]


@dataclass(frozen=True)
class Head:
    """A PostgreSQL ledger's head row (see the module docstring): where the next batch goes."""

    size: int  # next_seq
    last_hash: str
    frontier: bytes
    signer: str
    last_time: str


@dataclass(frozen=True)
class SequencedBatch:
    """What a batch writes, numbered from the head it was built on: entries, blobs, checkpoint, the new head."""

    rows: Sequence[Row]
    blobs: Mapping[str, bytes]
    checkpoint: tuple[int, str]
    head: Head


@dataclass(frozen=True)
class HeadView:
    """A PostgreSQL ledger as of one instant, for opening it: its head (None: none yet), latest checkpoint and
    entries, read in one transaction. Close it when done."""

    head: Head | None
    latest: tuple[int, str] | None
    entries: Iterator[Row]
    close: Callable[[], None]


@dataclass(frozen=True)
class BatchTiming:
    """Where one sequenced batch's time went, in seconds, measured in the writing process. `hold` runs from the
    moment SELECT ... FOR UPDATE returned the head to the moment COMMIT returned: the other processes' batches
    waited that long (plus a network leg). Its parts: `build` numbering, hashing and signing the batch in
    Python, `write` the one statement that writes it, `commit` COMMIT with its WAL flush."""

    wait: float  # BEGIN and SELECT ... FOR UPDATE: the wait for the head, mostly
    hold: float
    build: float
    write: float
    commit: float
    entries: int


class LedgerStore(Protocol):
    """What the ledger needs from a database. Implementations are safe to share between threads."""

    # True when the database numbers the entries (SequencedStore), so that several processes may append;
    # False when the one writer does (SQLite).
    sequenced: ClassVar[bool]

    def create_schema(self) -> None: ...
    def count(self) -> int: ...
    def iter_entries(self, start: int = 0) -> Iterator[Row]: ...
    def get_entries(self, start: int, limit: int) -> list[Row]: ...
    def get_blob(self, digest: str) -> bytes | None: ...
    def checkpoints(self) -> list[tuple[int, str]]: ...
    def latest_checkpoint(self) -> tuple[int, str] | None: ...
    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Insert rows, blobs and the checkpoint in one durable transaction (all or nothing).

        before_commit runs just before the step that makes the batch durable (COMMIT, or on SQLite
        usually the one statement that writes and commits it all): the group-commit writer wakes the
        previous batch's callers there, so their work overlaps this batch's write.
        """
        ...

    def snapshot(self) -> ReadSnapshot:
        """The entry count, the checkpoints and the entries as of one instant, read in one transaction, for a
        verifier reading a ledger that is being written. Close it when done. Raises StoreError."""
        ...

    def claim_writer(self) -> None:
        """Claim what appending needs. A store that is not sequenced: become the ledger's only writer until
        close(), or raise StoreError if another process (or another Ledger in this one) writes it, since each
        writer numbers entries from what it loaded, and a second one would fail every write, or leave its own
        view behind. A sequenced store: nothing (every batch is numbered under the head's row lock)."""
        ...

    def maintenance_due(self) -> bool:
        """True when maintain() has work to do; cheap (the writer asks between every two batches)."""
        ...

    def maintain(self) -> None:
        """Housekeeping the writer runs between two batches, in its own thread (SQLite: finish a WAL
        checkpoint round so that the WAL restarts). Never raises: a failure is logged and retried."""
        ...

    def close(self) -> None: ...


class SequencedStore(LedgerStore, Protocol):
    """A store that numbers entries itself, under its head row's lock (PostgreSQL), for several appenders."""

    def head(self) -> Head | None:
        """The head row, None if the ledger has none yet (written before it existed); raises StoreError."""
        ...

    def head_size(self) -> int | None:
        """next_seq alone: the cheap question a reader asks to learn whether others appended; raises StoreError."""
        ...

    def init_head(self, head: Head) -> None:
        """Insert the head computed from the entries, unless another process inserted one first; raises
        StoreError."""
        ...

    def head_view(self) -> HeadView:
        """The head, the latest checkpoint and the entries from seq 0, read in one transaction; raises StoreError."""
        ...

    def write_sequenced(
        self, build: Callable[[Head], SequencedBatch], before_commit: Callable[[], None] | None = None
    ) -> None:
        """In one transaction: lock the head row, call build(head) for the batch numbered from it, write the
        batch and its new head, commit (all or nothing). What build raises is raised (the transaction rolls
        back); before_commit as for write_batch. Records a BatchTiming in `timings`. Raises StoreError."""
        ...

    @property
    def timings(self) -> collections.deque[BatchTiming]: ...


def open_store(url: str, *, create: bool = True) -> LedgerStore:
    """Open sqlite:///abs/path.db or postgresql://...; create=False requires existing tables."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        if not parsed.path or parsed.netloc:
            raise StoreError(f"SQLite URL must be sqlite:///absolute/path.db, got {url!r}")
        # sqlite:////abs/path (SQLAlchemy's spelling, which the settings use) parses to //abs/path.
        return SqliteStore(Path("/" + parsed.path.lstrip("/")), create=create)
    if parsed.scheme in ("postgresql", "postgres"):
        return PostgresStore(url, create=create)
    raise StoreError(f"unsupported ledger store URL {url!r} (use sqlite:/// or postgresql://)")


def _first_line(e: Exception) -> str:
    """A driver error's first line: PostgreSQL adds LINE/caret/DETAIL lines, and a StoreError is one line for an
    operator (`jobgate up` printed the failed statement under its one-line error)."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


class SqliteStore:
    """SQLite in WAL mode with synchronous=FULL: a commit returns only after the WAL is fsynced."""

    sequenced: ClassVar[bool] = False

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        if not create and not path.is_file():
            raise StoreError(f"no ledger database at {path}")
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._w = self._connect()
            self._r = self._connect()
            if create:
                self._w.executescript(_SQLITE_SCHEMA)
            else:
                have = {r[0] for r in self._r.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                missing = {"ledger_entries", "ledger_checkpoints", "ledger_blobs"} - have
                if missing:
                    raise StoreError(f"{path} is not a ledger database (missing {', '.join(sorted(missing))})")
            # A database from before the ledger_batch view, opened with create=False, is written the old way.
            self._batch_view = create or bool(
                self._r.execute("SELECT 1 FROM sqlite_master WHERE name = 'ledger_batch_blob'").fetchall()
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open ledger database {path}: {e}") from e
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._checkpointer: WalCheckpointer | None = None  # started by the first write (readers need none)
        self._unchecked = 0  # entry bytes committed since the checkpointer was last kicked
        self._writer_lock: BinaryIO | None = None

    def claim_writer(self) -> None:
        # An flock on a file beside the database: released by the kernel when the process dies.
        lock_path = self.path.with_name(self.path.name + ".writer-lock")
        try:
            handle = open(lock_path, "ab")  # noqa: SIM115 (held open until close())
        except OSError as e:
            raise StoreError(f"cannot open {lock_path}: {e}") from e
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise StoreError(f"ledger {self.path} is already being written by another process (one gateway"
                             " process writes a ledger; stop it first)") from None
        self._writer_lock = handle

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute(AUTOCHECKPOINT_OFF)  # the WalCheckpointer's thread does it, outside the writer's commits
        return conn

    def create_schema(self) -> None:
        with self._wlock:
            try:
                self._w.executescript(_SQLITE_SCHEMA)
            except sqlite3.Error as e:
                raise StoreError(f"cannot create ledger tables: {_first_line(e)}") from e
            self._batch_view = True

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._rlock:
            try:
                return self._r.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"ledger read failed: {_first_line(e)}") from e

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM ledger_entries")[0][0])

    def iter_entries(self, start: int = 0) -> Iterator[Row]:
        # A private connection: a long scan must not hold the shared reader's lock.
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                cur = conn.execute("SELECT seq, hash, data FROM ledger_entries WHERE seq >= ? ORDER BY seq", (start,))
                while rows := cur.fetchmany(_FETCH):
                    for r in rows:
                        yield _row(*r)
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e

    def snapshot(self) -> ReadSnapshot:
        # A private connection in one read transaction: in WAL mode its first read fixes what it sees.
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e
        try:
            conn.execute("BEGIN")
            total = int(conn.execute("SELECT count(*) FROM ledger_entries").fetchone()[0])
            cps = [(int(s), str(n)) for s, n in conn.execute("SELECT size, note FROM ledger_checkpoints ORDER BY size")]
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        def entries() -> Iterator[Row]:
            try:
                cur = conn.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq")
                while rows := cur.fetchmany(_FETCH):
                    for r in rows:
                        yield _row(*r)
            except sqlite3.Error as e:
                raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        return ReadSnapshot(total, cps, entries(), conn.close)

    def get_entries(self, start: int, limit: int) -> list[Row]:
        rows = self._query(
            "SELECT seq, hash, data FROM ledger_entries WHERE seq >= ? ORDER BY seq LIMIT ?", (start, limit)
        )
        return [_row(*r) for r in rows]

    def get_blob(self, digest: str) -> bytes | None:
        rows = self._query("SELECT data FROM ledger_blobs WHERE digest = ?", (digest,))
        return _row(0, "", rows[0][0])[2] if rows else None

    def checkpoints(self) -> list[tuple[int, str]]:
        return [(int(s), str(n)) for s, n in self._query("SELECT size, note FROM ledger_checkpoints ORDER BY size")]

    def latest_checkpoint(self) -> tuple[int, str] | None:
        rows = self._query("SELECT size, note FROM ledger_checkpoints ORDER BY size DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        # The batch as (seq, hash, data) rows for the ledger_batch view: entries, the checkpoint as
        # (size, NULL, note), blobs as (NULL, digest, data).
        params = list(itertools.chain.from_iterable(rows))
        params += (checkpoint[0], None, checkpoint[1])
        for digest, data in blobs.items():
            params += (None, digest, data)
        with self._wlock:
            cp = self._checkpointer
            if cp is None:
                cp = self._checkpointer = WalCheckpointer(self.path, finishing=True)
            try:
                if self._batch_view and len(params) <= self._w.getlimit(_MAX_PARAMS):
                    # One statement in autocommit mode is one transaction (all or nothing; the trigger's
                    # inserts included), made durable before execute() returns. One statement, not
                    # BEGIN, INSERTs and COMMIT, because each execute() releases the GIL and then has to
                    # win it back from the appending threads: under 64 of them that was most of a batch's
                    # time (and a context switch each).
                    if before_commit is not None:
                        before_commit()
                    self._w.execute(_batch_insert(len(params) // 3), params)
                else:
                    self._write_in_steps(rows, blobs, checkpoint, before_commit)
            except sqlite3.Error as e:
                raise StoreError(f"ledger write failed: {_first_line(e)}") from e
            cp.committed()
            self._unchecked += sum(len(r[2]) for r in rows)
            if self._unchecked >= _CHECKPOINT_EVERY:
                self._unchecked = 0
                cp.kick()

    def _write_in_steps(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None,
    ) -> None:
        """The batch in one explicit transaction of several statements: for a batch with more bound
        values than one statement may have, or a database without the ledger_batch view."""
        c = self._w
        per_insert = max(1, c.getlimit(_MAX_PARAMS) // 3)
        c.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(rows), per_insert):
                chunk = rows[i : i + per_insert]
                c.execute(_multi_insert(len(chunk)), list(itertools.chain.from_iterable(chunk)))
            if blobs:
                c.executemany("INSERT OR IGNORE INTO ledger_blobs (digest, data) VALUES (?, ?)", blobs.items())
            c.execute("INSERT INTO ledger_checkpoints (size, note) VALUES (?, ?)", checkpoint)
            if before_commit is not None:
                before_commit()
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def maintenance_due(self) -> bool:
        cp = self._checkpointer
        return cp is not None and cp.finish_due

    def maintain(self) -> None:
        cp = self._checkpointer
        if cp is None:
            return
        with self._wlock:
            try:
                cp.finish(self._w)
            except sqlite3.Error as e:  # the WAL only grows until a later round; appends go on
                log.warning("finishing a WAL checkpoint of %s failed: %s", self.path, e)

    def close(self) -> None:
        with self._wlock, self._rlock:
            if self._checkpointer is not None:
                self._checkpointer.close()
            self._w.close()
            self._r.close()
            if self._writer_lock is not None:
                self._writer_lock.close()  # releases the flock
                self._writer_lock = None


_SCHEMA_LOCK = 7305614  # advisory lock key that serialises schema creation (init-db, concurrent first starts)
# (7305615 was the writer's claim, a session lock, while one process wrote a PostgreSQL ledger.)
# Bounds on the writer (and on the reader's lock waits), each unless the URL sets its own (`?connect_timeout=`,
# `?options=-c statement_timeout=`): a ledger that cannot take a batch in this time is unavailable, and the
# mutations waiting on it are refused (fail closed). Unbounded, a DBA's lock on a ledger table (VACUUM FULL, a held
# LOCK TABLE) or a partitioned server held every mutation, and its job rows, for as long as that lasted.
_WRITE_TIMEOUT_S = 10


class PostgresStore:
    """PostgreSQL via psycopg 3; synchronous_commit=on so COMMIT returns after the WAL flush. Sequenced: any
    number of processes append to one ledger (see the module docstring).

    Its two connections (writer, reader) are opened again when the server dropped them (a restart, a
    failover, an idle-connection reaper): the write or read that met the loss fails, the next one
    reconnects. Without that a ledger server's restart left the gateway refusing every mutation until it
    was restarted too."""

    sequenced: ClassVar[bool] = True
    _TIMINGS = 100_000  # batches whose BatchTiming is kept (bench/replicas.py reads them)

    def __init__(self, url: str, *, create: bool = True) -> None:
        import psycopg

        self._psycopg = psycopg
        self.url = url
        have = missing_head = False
        opened: list[Connection[Any]] = []
        opened_ok = False
        try:
            self._w = self._connect(writer=True)
            opened.append(self._w)
            self._r = self._connect(writer=False)
            opened.append(self._r)
            row = self._r.execute("SELECT " + ", ".join(f"to_regclass('{t}')" for t in _PG_TABLES)).fetchone()
            have = row is not None and all(x is not None for x in row[:3])
            missing_head = row is None or row[3] is None
            if create and (not have or missing_head):
                # Serialise concurrent first starts: CREATE ... IF NOT EXISTS races in PostgreSQL.
                # Skipped when the tables exist: the gateway's append-only role (init-db) may not run DDL.
                with self._w.transaction():
                    self._w.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    self._w.execute(_PG_SCHEMA)
            elif not have:
                raise StoreError("database has no ledger tables")
            opened_ok = True
        except psycopg.errors.InsufficientPrivilege as e:
            if have and missing_head:
                # A ledger set up by a jobgate from before ledger_head, for a role that may not create it.
                raise StoreError(f"the ledger has no ledger_head table (its schema is older) and this role may not"
                                 f" create it ({_first_line(e)}); run `jobgate ledger init-db --url <its owner's URL>`"
                                 " again") from e
            if have:
                raise StoreError(f"cannot open ledger database: {_first_line(e)}") from e
            # A role set up to append only (init-db) may not create the tables it would append to.
            raise StoreError(f"the database has no ledger tables and this role may not create them"
                             f" ({_first_line(e)}); run `jobgate ledger init-db --url <its owner's URL>` first") from e
        except psycopg.Error as e:
            raise StoreError(f"cannot open ledger database: {_first_line(e)}") from e
        finally:
            if not opened_ok:  # refused: nobody will close() this store
                for conn in opened:
                    conn.close()
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._timings: collections.deque[BatchTiming] = collections.deque(maxlen=self._TIMINGS)

    def _connect(self, *, writer: bool) -> Connection[Any]:
        given = self._psycopg.conninfo.conninfo_to_dict(self.url)
        bounds: dict[str, Any] = {}
        if "connect_timeout" not in given:
            bounds["connect_timeout"] = _WRITE_TIMEOUT_S
        if "tcp_user_timeout" not in given:
            bounds["tcp_user_timeout"] = _WRITE_TIMEOUT_S * 1000  # sent data unacknowledged: a partition
        conn = self._psycopg.connect(self.url, autocommit=True, **bounds)
        options = str(given.get("options", ""))
        if writer:
            conn.execute("SET synchronous_commit = on")
            if "statement_timeout" not in options:
                conn.execute(f"SET statement_timeout = {_WRITE_TIMEOUT_S * 1000}")  # lock waits included
        elif "lock_timeout" not in options:
            # The reader's short reads; after a failed batch the writer asks it what was stored before the batch's
            # callers are told. Lock waits only: a count over a large ledger (`ledger verify`) may take its time.
            conn.execute(f"SET lock_timeout = {_WRITE_TIMEOUT_S * 1000}")
        return conn

    @staticmethod
    def _lost(conn: Connection[Any]) -> bool:
        return bool(conn.closed or conn.broken)

    def _writer(self) -> Connection[Any]:
        """The writing connection, opened again if the server dropped it; under _wlock. Raises psycopg.Error."""
        if not self._lost(self._w):
            return self._w
        self._w = self._connect(writer=True)
        pg_log.warning("the ledger database dropped the writing connection; reconnected")
        return self._w

    def _reader(self) -> Connection[Any]:
        """The reading connection, opened again if the server dropped it; under _rlock. Raises psycopg.Error."""
        if self._lost(self._r):
            self._r = self._connect(writer=False)
        return self._r

    def create_schema(self) -> None:
        with self._wlock:
            try:
                self._writer().execute(_PG_SCHEMA)
            except self._psycopg.Error as e:
                raise StoreError(f"cannot create ledger tables: {_first_line(e)}") from e

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._rlock:
            for retry in (True, False):
                try:
                    return self._reader().execute(sql, args).fetchall()
                except self._psycopg.Error as e:
                    # A read may be asked again: once, on a new connection, if the server dropped this one (a
                    # reader's catch-up is the first to meet a restart since every process appends and reads).
                    if retry and self._lost(self._r):
                        continue
                    raise StoreError(f"ledger read failed: {_first_line(e)}") from e
            raise AssertionError("unreachable")

    def write_problem(self) -> str | None:
        """Why this role cannot append here, as far as can be told without writing (None: it can): a standby in
        recovery, a read-only default, or missing privileges (init-db's append-only role holds exactly these).
        Raises StoreError."""
        (recovery, read_only, *granted), = self._query(
            "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only') = 'on', "
            + ", ".join(f"has_table_privilege('{t}', '{p}')" for t, p in _APPEND_PRIVILEGES))
        if recovery:
            return "the ledger database is a standby in recovery (read-only)"
        if read_only:
            return "the ledger database's transactions are read-only (default_transaction_read_only)"
        missing = [f"{p} on {t}" for (t, p), ok in zip(_APPEND_PRIVILEGES, granted, strict=True) if not ok]
        return f"this role lacks {', '.join(missing)} (see `jobgate ledger init-db`)" if missing else None

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM ledger_entries")[0][0])

    def iter_entries(self, start: int = 0) -> Iterator[Row]:
        psycopg = self._psycopg
        try:
            with psycopg.connect(self.url) as conn, conn.cursor(name="ledger_scan") as cur:
                cur.itersize = _FETCH
                cur.execute("SELECT seq, hash, data FROM ledger_entries WHERE seq >= %s ORDER BY seq", (start,))
                for seq, h, data in cur:
                    yield _row(seq, h, data)
        except psycopg.Error as e:
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e

    def snapshot(self) -> ReadSnapshot:
        psycopg = self._psycopg
        try:
            conn = psycopg.connect(self.url)
        except psycopg.Error as e:
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e
        try:
            # One REPEATABLE READ transaction: every statement in it sees the database as of its first.
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            row = conn.execute("SELECT count(*) FROM ledger_entries").fetchone()
            total = int(row[0]) if row else 0
            cps = [(int(s), str(n)) for s, n in conn.execute("SELECT size, note FROM ledger_checkpoints ORDER BY size")]
        except psycopg.Error as e:
            conn.close()
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        def entries() -> Iterator[Row]:
            try:
                with conn.cursor(name="ledger_snapshot_scan") as cur:
                    cur.itersize = _FETCH
                    cur.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq")
                    for seq, h, data in cur:
                        yield _row(seq, h, data)
            except psycopg.Error as e:
                raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        return ReadSnapshot(total, cps, entries(), conn.close)

    def get_entries(self, start: int, limit: int) -> list[Row]:
        rows = self._query(
            "SELECT seq, hash, data FROM ledger_entries WHERE seq >= %s ORDER BY seq LIMIT %s", (start, limit)
        )
        return [_row(*r) for r in rows]

    def get_blob(self, digest: str) -> bytes | None:
        rows = self._query("SELECT data FROM ledger_blobs WHERE digest = %s", (digest,))
        return bytes(rows[0][0]) if rows else None

    def checkpoints(self) -> list[tuple[int, str]]:
        return [(int(s), str(n)) for s, n in self._query("SELECT size, note FROM ledger_checkpoints ORDER BY size")]

    def latest_checkpoint(self) -> tuple[int, str] | None:
        rows = self._query("SELECT size, note FROM ledger_checkpoints ORDER BY size DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Write a batch numbered elsewhere, head untouched: for tools that build a ledger row by row (benchmarks,
        tests). A ledger's appends go through write_sequenced."""
        with self._wlock:
            try:
                w = self._writer()
                with w.transaction(), w.cursor() as cur:
                    cur.executemany("INSERT INTO ledger_entries (seq, hash, data) VALUES (%s, %s, %s)", rows)
                    if blobs:
                        cur.executemany(
                            "INSERT INTO ledger_blobs (digest, data) VALUES (%s, %s) ON CONFLICT (digest) DO NOTHING",
                            list(blobs.items()),
                        )
                    cur.execute("INSERT INTO ledger_checkpoints (size, note) VALUES (%s, %s)", checkpoint)
                    if before_commit is not None:
                        before_commit()
            except self._psycopg.Error as e:
                raise StoreError(f"ledger write failed: {_first_line(e)}") from e

    @staticmethod
    def _head_of(row: Sequence[Any]) -> Head:
        return Head(int(row[0]), str(row[1]), bytes(row[2]), str(row[3]), str(row[4]))

    def head(self) -> Head | None:
        rows = self._query(f"SELECT {_HEAD_COLUMNS} FROM ledger_head")
        return self._head_of(rows[0]) if rows else None

    def head_size(self) -> int | None:
        rows = self._query("SELECT next_seq FROM ledger_head")
        return int(rows[0][0]) if rows else None

    def init_head(self, head: Head) -> None:
        with self._wlock:
            try:
                self._writer().execute(
                    f"INSERT INTO ledger_head (id, {_HEAD_COLUMNS}) VALUES (TRUE, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (id) DO NOTHING",
                    (head.size, head.last_hash, head.frontier, head.signer, head.last_time),
                )
            except self._psycopg.Error as e:
                raise StoreError(f"cannot write the ledger's head: {_first_line(e)}") from e

    def head_view(self) -> HeadView:
        psycopg = self._psycopg
        try:
            conn = psycopg.connect(self.url)
        except psycopg.Error as e:
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e
        try:
            # One REPEATABLE READ transaction: the head and the entries as of one instant, though others append.
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            row = conn.execute(f"SELECT {_HEAD_COLUMNS} FROM ledger_head").fetchone()
            cp = conn.execute("SELECT size, note FROM ledger_checkpoints ORDER BY size DESC LIMIT 1").fetchone()
        except psycopg.Error as e:
            conn.close()
            raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        def entries() -> Iterator[Row]:
            try:
                with conn.cursor(name="ledger_head_view_scan") as cur:
                    cur.itersize = _FETCH
                    cur.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq")
                    for seq, h, data in cur:
                        yield _row(seq, h, data)
            except psycopg.Error as e:
                raise StoreError(f"ledger read failed: {_first_line(e)}") from e

        return HeadView(self._head_of(row) if row else None, (int(cp[0]), str(cp[1])) if cp else None, entries(),
                        conn.close)

    @property
    def timings(self) -> collections.deque[BatchTiming]:
        return self._timings

    def write_sequenced(
        self, build: Callable[[Head], SequencedBatch], before_commit: Callable[[], None] | None = None
    ) -> None:
        clock = time.perf_counter
        with self._wlock:
            try:
                w = self._writer()
                with w.transaction():
                    t0 = clock()
                    row = w.execute(f"SELECT {_HEAD_COLUMNS} FROM ledger_head FOR UPDATE").fetchone()
                    t1 = clock()
                    if row is None:
                        raise StoreError("the ledger has no head row (ledger_head); open it again to compute one")
                    batch = build(self._head_of(row))
                    t2 = clock()
                    rows, blobs, new = batch.rows, batch.blobs, batch.head
                    w.execute(_PG_WRITE_BATCH, (
                        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                        list(blobs), list(blobs.values()),
                        batch.checkpoint[0], batch.checkpoint[1],
                        new.size, new.last_hash, new.frontier, new.signer, new.last_time,
                    ))
                    t3 = clock()
                    if before_commit is not None:
                        before_commit()
                    t4 = clock()
                t5 = clock()  # COMMIT returned: the head's lock is released
            except self._psycopg.Error as e:
                raise StoreError(f"ledger write failed: {_first_line(e)}") from e
            self._timings.append(BatchTiming(t1 - t0, t5 - t1, t2 - t1, t3 - t2, t5 - t4, len(rows)))

    def maintenance_due(self) -> bool:
        return False

    def maintain(self) -> None:
        pass

    def claim_writer(self) -> None:
        """Nothing to claim: every batch is numbered under the head row's lock, so processes append side by side."""

    def close(self) -> None:
        with self._wlock, self._rlock:
            self._w.close()
            self._r.close()
