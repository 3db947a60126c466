"""The Ledger service: group-committed appends, signed checkpoints, reads and proofs.

Formats: entries per ledger/entry.py (RFC 8785), tree per RFC 6962/9162 (ledger/merkle.py),
checkpoints per C2SP tlog-checkpoint (ledger/note.py).

Group commit: append() enqueues and waits; one writer thread per process drains the queue, assigns
seq/time/prev, writes the whole batch, its blobs and one signed checkpoint in a single transaction (one
fsync), and only then wakes the callers. When commits are slow beside the time its callers take to append
again, the writer holds the next batch open for them for a bounded time (Pacing). A failed write rolls the
in-memory tree back to the store's state.

Two ways of numbering, chosen by the store (ledger/store.py says why):
- One writer (SQLite): seqs are handed out when entries are queued, so Ticket.seq is known at once, and the
  writer numbers, hashes and roots each batch from its own in-memory tree.
- Sequenced in the database (PostgreSQL, any number of processes): a batch is numbered from the head row it
  locks, and its root computed from the head's Merkle frontier, so an entry's seq is known only once its batch
  commits (Ticket.seq waits for that). Reads catch the in-memory tree up with what other processes appended
  (one small query when there is nothing to read), and so does the writer after each commit, before it adds its
  own batch's leaves; every entry read that way must chain onto the last one known, and the root the writer
  signed must be the root of the tree it then holds.
Either way an entry's time is the writer's clock, or the previous entry's time when that clock is behind it
(another replica's clock, or a step back), so that times never go backwards in seq order; the verifier does
not depend on it. Each batch's checkpoint is signed by the process that commits it, with the ledger's key.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import operator
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from ledger.compact import frontier_of
from ledger.entry import ZERO_HASH, PreparedEntry, format_time, prepare
from ledger.errors import (
    EntryNotFound,
    InvalidEntry,
    KeyMismatch,
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerUnavailable,
    ProofError,
)
from ledger.keys import NoteSigner
from ledger.merkle import MerkleTree, leaf_hash
from ledger.note import Checkpoint, cosign, open_note, parse_checkpoint, sign_checkpoint
from ledger.pacing import Pacing
from ledger.proofs import ConsistencyProof, InclusionProof
from ledger.rotation import (
    ROTATION_KIND,
    ROTATION_MARK,
    Rotation,
    RotationError,
    rotation_body,
    rotation_in,
)
from ledger.sequencing import Built, build_batch, entry_time, head_of, head_problem, key_problem, read_appended
from ledger.store import Head, LedgerStore, Row, SequencedBatch, SequencedStore, open_store

MAX_BATCH = 1024
_perf_counter = time.perf_counter
_log = logging.getLogger("jobgate.ledger")
_QUEUED = operator.attrgetter("queued")


@dataclass(frozen=True)
class AppendResult:
    seq: int
    hash: str
    time: str
    blobs: dict[str, str]


@dataclass(frozen=True)
class StoredEntry:
    seq: int
    hash: str
    raw: bytes
    value: dict[str, Any]


@dataclass
class LedgerStats:
    """Counters for the group-commit writer (read them, do not write)."""

    batches: int = 0
    entries: int = 0
    max_batch: int = 0
    failed_batches: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)
    held_open: int = 0  # batches held open for the callers of the one before (see Pacing)
    lingered: int = 0  # of those, held open for entries arriving on their own (Pacing.linger_for)


class _Pending:
    """One queued append. `done` is a raw lock held until the writer settles it: waking a waiter is
    one C-level release, far cheaper than an Event (a Condition) when 64 callers wait per batch."""

    __slots__ = ("alone", "callbacks", "done", "epoch", "error", "hash", "next", "prep", "queued", "rotate", "seq",
                 "time")

    def __init__(self, prep: PreparedEntry, rotate: NoteSigner | None = None, *, alone: bool = False) -> None:
        self.prep = prep
        # Woken on its own rather than by the baton (see _wake): a Ticket's holder may never wait for it.
        self.alone = alone
        self.callbacks: list[Callable[[], object]] | None = None  # see Ticket.add_done_callback
        self.done = _allocate_lock()
        self.done.acquire()
        self.error: LedgerError | None = None
        self.rotate = rotate  # a key-rotation entry: the batch ends here and the signer changes
        # seq and epoch are set when queued (see Ledger.enqueue); hash and time by the writer.
        self.seq = -1
        self.epoch = 0
        self.hash = ""
        self.time = ""
        self.next: _Pending | None = None  # the next caller to wake (see _wake)
        self.queued = 0.0  # perf_counter() when enqueued (see Pacing)


def _settle(p: _Pending) -> None:
    """Release the entry's waiter (not passing on the baton, see _wake), and run its ticket's callback, if any."""
    p.done.release()
    if p.callbacks:
        _run_callback(p)


def _run_callback(p: _Pending) -> None:
    """Run p's callback unless the other side took it: list.pop is atomic, so it runs exactly once (see
    Ticket.add_done_callback). It may run in the writer's thread, which must survive anything it does."""
    try:
        callback = p.callbacks.pop() if p.callbacks else None
    except IndexError:
        return
    if callback is not None:
        try:
            callback()
        except Exception:
            _log.exception("a ledger ticket's done callback failed")


def _relay(p: _Pending) -> None:
    """Wait for p's wake-up on behalf of a caller that stopped waiting, and pass it on."""
    p.done.acquire()
    if p.next is not None:
        p.next.done.release()


class Ticket:
    """An entry queued by Ledger.enqueue: its seq (at once, or once committed: see seq), its AppendResult once
    durable."""

    __slots__ = ("_error", "_ledger", "_pending", "_result")

    def __init__(self, ledger: Ledger, pending: _Pending) -> None:
        self._ledger = ledger
        self._pending = pending
        self._result: AppendResult | None = None
        self._error: LedgerError | None = None

    @property
    def seq(self) -> int:
        """The entry's seq. On a ledger with one writer (SQLite; its store is not `sequenced`) known at once, and
        kept if the entry is written; if the write fails, wait() raises. On a ledger sequenced in its database
        (PostgreSQL, several appending processes) known only once the entry's batch commits: this then waits as
        wait() does, and raises what it raises (LedgerUnavailable)."""
        p = self._pending
        if p.seq < 0:
            self.wait()
        return p.seq

    @property
    def waited(self) -> bool:
        """wait() has returned: the entry is durable."""
        return self._result is not None

    def add_done_callback(self, fn: Callable[[], object]) -> None:
        """Call fn() once the entry is settled, durable or failed, so that wait() returns (or raises) without
        blocking: from the ledger's writer thread, or from this one at once if it is settled already. For an
        event loop, which must not block on wait() (fn then hands over with call_soon_threadsafe). fn runs
        exactly once; it must be quick, and whatever it raises is logged, not passed on. One callback per
        ticket."""
        p = self._pending
        p.callbacks = [fn]
        # Settled before the writer could see the callback (or waited for already, which locks `done` again)?
        # Then it is ours to run; if the writer saw it too, whichever of us pops it first runs it.
        if self._result is not None or self._error is not None or not p.done.locked():
            _run_callback(p)

    def wait(self) -> AppendResult:
        """Block until the entry is durable; raises LedgerUnavailable if it could not be written (again on every
        later call)."""
        if self._result is None:
            if self._error is not None:
                raise self._error
            try:
                self._result = self._ledger._await(self._pending)
            except LedgerError as e:
                self._error = e
                raise
        return self._result


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise LedgerCorrupted("stored entry is not JSON") from e
    if not isinstance(value, dict):
        raise LedgerCorrupted("stored entry is not a JSON object")
    return value


class Ledger:
    """Append-only signed ledger over a LedgerStore. All public methods are thread-safe."""

    def __init__(self, store: LedgerStore, signer: NoteSigner, clock: Callable[[], datetime]) -> None:
        self._store = store
        # Set when the database numbers the entries (PostgreSQL): see the module docstring.
        self._sequenced: SequencedStore | None = cast("SequencedStore", store) if store.sequenced else None
        self._signer = signer
        self._clock = clock
        self._tree = MerkleTree()
        self._size = 0
        self._last_hash = ZERO_HASH
        self._last_time = ""  # the last entry's time: no later one is stamped earlier
        self._checkpoint: str | None = None
        self.stats = LedgerStats()
        self.last_write_error: str | None = None  # why the latest batch failed, until one commits (readiness)
        # _state guards tree/size/last hash/checkpoint; the writer never holds it across I/O.
        self._state = threading.Lock()
        # Sequenced: one catch-up with other processes' appends at a time (it reads the store, then extends the tree).
        self._syncing = threading.Lock()
        self._corrupt: LedgerCorrupted | None = None  # sequenced: the store no longer chains onto what we hold
        # The queue: a raw lock, and a raw lock the idle writer blocks on (released once by the
        # first submitter that finds it idle) — much cheaper per append than a Condition.
        self._qlock = _allocate_lock()
        self._queue: list[_Pending] = []
        self._next_seq = 0  # the seq the next queued entry gets (under _qlock; one writer only)
        self._epoch = 0  # how many times numbering started again after a failed write (under _qlock)
        self._idle = False
        self._until = 0  # while the writer holds a batch open: the queue length that ends the wait
        self._kick = _allocate_lock()
        self._kick.acquire()
        self._closed = False
        self._writer: threading.Thread | None = None
        self._rotating = threading.Lock()
        self._unwoken: list[_Pending] = []  # committed, callers not yet woken (writer thread only)
        self.pacing = Pacing()  # the writer thread's; read it, do not write
        self._woke_at = 0.0  # when the writer last woke callers (writer thread only)

    @classmethod
    def open(cls, url: str, *, signer: NoteSigner, clock: Callable[[], datetime] | None = None) -> Ledger:
        """Open (creating tables if missing), rebuild the tree and check the tail.

        Raises StoreError if the store cannot be opened, LedgerCorrupted if its tail (or its head row) is broken,
        KeyMismatch if signer is not the ledger's current key.
        """
        store = open_store(url)
        try:
            return cls.from_store(store, signer=signer, clock=clock)
        except BaseException:
            store.close()
            raise

    @classmethod
    def from_store(
        cls, store: LedgerStore, *, signer: NoteSigner, clock: Callable[[], datetime] | None = None
    ) -> Ledger:
        """Like open() over an already open store (which the Ledger then owns and closes).

        Raises StoreError if another Ledger writes a store with one writer (SQLite), LedgerCorrupted if its tail or
        head row is broken, KeyMismatch."""
        store.claim_writer()
        led = cls(store, signer, clock or _utcnow)
        led._load()
        led._writer = threading.Thread(target=led._run_writer, name="ledger-writer", daemon=True)
        led._writer.start()
        return led

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> None:
        if self._sequenced is not None:
            self._load_sequenced(self._sequenced)
            return
        tree, last = self._scan(self._store.iter_entries(0))
        self._check_loaded(tree, last, self._store.latest_checkpoint())
        self._adopt_loaded(tree, last)
        self._next_seq = tree.size

    def _scan(self, rows: Iterable[Row]) -> tuple[MerkleTree, Row | None]:
        """The tree of rows (from seq 0) and the last row; raises LedgerCorrupted (a gap, a bad rotation),
        KeyMismatch (the last rotation announced another key than the signer's)."""
        leaves = bytearray()
        last: Row | None = None
        rotation: Rotation | None = None
        sha = hashlib.sha256
        for expect, row in enumerate(rows):
            if row[0] != expect:
                raise LedgerCorrupted(f"ledger store has a gap at seq {expect}")
            leaves += sha(b"\x00" + row[2]).digest()
            if ROTATION_MARK in row[2]:
                try:
                    rotation = rotation_in(row[0], row[2]) or rotation
                except RotationError as e:
                    raise LedgerCorrupted(e.diagnostics()) from e
            last = row
        if rotation is not None and rotation.new.vkey != self._signer.vkey:
            # Signing on under another key would make every later checkpoint fail verification.
            raise KeyMismatch(
                f"the ledger announced signing key {rotation.new.key_id.hex()} at seq {rotation.seq}, but the"
                f" signer is {self._signer.key_id.hex()}; finish the rotation with `jobgate ledger rotate-key`"
            )
        return MerkleTree.from_leaf_hashes(leaves), last

    def _check_loaded(self, tree: MerkleTree, last: Row | None, cp: tuple[int, str] | None) -> None:
        """Check the loaded tail against the latest checkpoint, which the signer must have signed; keep the
        checkpoint. Raises LedgerCorrupted, KeyMismatch."""
        if last is not None and hashlib.sha256(last[2]).hexdigest() != last[1]:
            raise LedgerCorrupted(f"seq {last[0]}: stored hash does not match its bytes")
        if cp is not None:
            size, note = cp
            try:
                checkpoint = parse_checkpoint(note[: note.rfind("\n\n") + 1])
            except LedgerError as e:
                raise LedgerCorrupted(f"latest checkpoint is malformed: {e.diagnostics()}") from e
            if size != tree.size or checkpoint.size != size:
                raise LedgerCorrupted(f"latest checkpoint is for size {size} but the store holds {tree.size}")
            if checkpoint.root != tree.root(size):
                raise LedgerCorrupted(f"latest checkpoint root does not match the entries (size {size})")
            try:
                open_note(note, self._signer.verifier())
            except LedgerError as e:
                # Signing on with a key nobody announced would fail every verification (unknown_key).
                raise KeyMismatch(
                    f"the latest checkpoint is not signed by key {self._signer.key_id.hex()}: restore the ledger's"
                    " signing key (keys/ledger.key) or finish a rotation with `jobgate ledger rotate-key`"
                ) from e
            self._checkpoint = note
        elif tree.size:
            raise LedgerCorrupted("ledger has entries but no checkpoint")

    def _adopt_loaded(self, tree: MerkleTree, last: Row | None) -> None:
        with self._state:
            self._tree = tree
            self._size = tree.size
            self._last_hash = last[1] if last is not None else ZERO_HASH
            self._last_time = entry_time(last[2]) if last is not None else ""

    def _load_sequenced(self, store: SequencedStore, *, again: bool = True) -> None:
        """_load for a ledger sequenced in its database: entries, latest checkpoint and head from one snapshot, as
        other processes may be appending. A ledger without a head row (written before it existed) gets the head
        its entries give, unless another process opening it wrote one first; either way the head is then checked
        like any other. Raises LedgerCorrupted (with the head's problem), KeyMismatch, StoreError."""
        view = store.head_view()
        try:
            tree, last = self._scan(view.entries)
            latest, head = view.latest, view.head
        finally:
            view.close()
        self._check_loaded(tree, last, latest)
        expected = head_of(tree, last[1] if last else ZERO_HASH, entry_time(last[2]) if last else "",
                           self._signer.vkey)
        if head is None:
            if not again:
                raise LedgerCorrupted("the ledger has no head row (ledger_head), and writing one did not take")
            # The latest checkpoint verified under our key, so ours is the key the head announces.
            store.init_head(expected)
            self._load_sequenced(store, again=False)
            return
        problem = head_problem(head, expected)
        if problem is not None:
            raise LedgerCorrupted(f"the ledger's head row (ledger_head) disagrees with its entries: {problem}")
        if (mismatch := key_problem(head, self._signer)) is not None:
            raise mismatch
        self._adopt_loaded(tree, last)

    # -- appending -----------------------------------------------------------------------------

    def append(self, kind: str, body: Mapping[str, Any], *, blobs: Mapping[str, bytes] | None = None) -> AppendResult:
        """Append one entry; returns once it is durable and covered by a signed checkpoint.

        Raises InvalidEntry for a body that is not I-JSON, LedgerUnavailable if the write failed.
        """
        if kind == ROTATION_KIND:
            raise InvalidEntry("key rotations are appended by rotate_key() only")
        return self._submit(_Pending(prepare(kind, body, blobs)))

    def append_many(
        self, entries: Sequence[tuple[str, Mapping[str, Any], Mapping[str, bytes] | None]]
    ) -> list[AppendResult]:
        """Append (kind, body, blobs) entries in this order with one wait: they join the same group
        commit (or consecutive ones), so a caller with several entries pays for one fsync, not one each.

        Every entry is validated before any is queued. Not atomic: if a write fails, entries in earlier
        batches stay. Raises InvalidEntry, LedgerUnavailable (after all of them are settled).
        """
        if any(kind == ROTATION_KIND for kind, _, _ in entries):
            raise InvalidEntry("key rotations are appended by rotate_key() only")
        pending = [_Pending(prepare(kind, body, blobs)) for kind, body, blobs in entries]
        if not pending:
            return []
        self._enqueue(pending)
        results: list[AppendResult] = []
        error: LedgerError | None = None
        for p in pending:  # each in turn: a woken entry passes the wake-up on to the next (see _wake)
            try:
                results.append(self._await(p))
            except LedgerError as e:
                error = error or e
        if error is not None:
            raise error
        return results

    def enqueue(self, kind: str, body: Mapping[str, Any], *, blobs: Mapping[str, bytes] | None = None) -> Ticket:
        """Queue one entry and return at once (see enqueue_many)."""
        return self.enqueue_many([(kind, body, blobs)])[0]

    def enqueue_many(
        self,
        entries: Sequence[tuple[str, Mapping[str, Any], Mapping[str, bytes] | None]],
        *,
        after: Sequence[Ticket] = (),
    ) -> list[Ticket]:
        """Queue (kind, body, blobs) entries in this order and return at once; ticket.wait() returns once the
        entry is durable. For a caller with more to do before it needs them durable (entries that cite these
        seqs, a transaction to commit only after them), so that the fsync overlaps that work. With one writer
        (SQLite) each ticket knows its entry's seq now; on a ledger sequenced in its database (PostgreSQL),
        ticket.seq waits for the entry's batch to commit.

        Every entry is validated before any is queued. Entries queued after one whose write fails fail too
        (with one writer, their seqs counted on it). So entries that cite `after` (an outcome citing its
        decision) can be queued without waiting for it: they are refused if one of `after` has already
        failed, or was queued before numbering started again and not written; otherwise they are written
        after it, or fail with it. A ticket nobody waits for holds up no one; its entry is written all the
        same. Raises InvalidEntry, LedgerUnavailable (an entry of `after` was not written), LedgerClosed.
        """
        if any(kind == ROTATION_KIND for kind, _, _ in entries):
            raise InvalidEntry("key rotations are appended by rotate_key() only")
        pending = [_Pending(prepare(kind, body, blobs), alone=True) for kind, body, blobs in entries]
        if pending:
            self._enqueue(pending, [t._pending for t in after])
        return [Ticket(self, p) for p in pending]

    def rotate_key(self, new: NoteSigner) -> AppendResult:
        """Announce new as the signing key in an entry signed under the current key, then switch.

        The announcement ends its batch; that checkpoint is signed by the old key and cosigned by
        the new one; later checkpoints by the new key only. Raises RotationError, LedgerUnavailable.
        """
        with self._rotating:
            body = rotation_body(self._signer.verifier(), new.verifier())
            return self._submit(_Pending(prepare(ROTATION_KIND, body, None), rotate=new))

    @property
    def vkey(self) -> str:
        """The current signing key's verifier key."""
        return self._signer.vkey

    def _submit(self, p: _Pending) -> AppendResult:
        self._enqueue([p])
        return self._await(p)

    def _enqueue(self, pending: list[_Pending], after: Sequence[_Pending] = ()) -> None:
        now = _perf_counter()
        for p in pending:
            p.queued = now
        with self._qlock:
            if self._closed:
                raise LedgerClosed("ledger is closed")
            epoch = self._epoch
            sequenced = self._sequenced is not None
            for a in after:
                # A failed write bumps the epoch before its entries (and those queued behind them) learn that
                # they failed. One writer: written entries lie below the durable size, and numbering starts again
                # at that size. Sequenced: an entry gets its seq once written, and from no one else.
                if a.error is not None or (a.epoch != epoch and (a.seq < 0 if sequenced else a.seq >= self._size)):
                    raise LedgerUnavailable(f"ledger write refused: entry {a.seq}, which these follow, was not written"
                                            if not sequenced else
                                            "ledger write refused: an entry these follow was not written")
            if sequenced:
                for p in pending:
                    p.epoch = epoch
            else:
                seq = self._next_seq
                for p in pending:
                    p.seq = seq
                    p.epoch = epoch
                    seq += 1
                self._next_seq = seq
            queue = self._queue
            queue.extend(pending)
            if self._idle:
                self._idle = False
                self._kick.release()
            elif self._until and len(queue) >= self._until:
                self._until = 0
                self._kick.release()

    def _await(self, p: _Pending) -> AppendResult:
        try:
            p.done.acquire()
        except BaseException:
            # Interrupted before being woken (KeyboardInterrupt in the main thread): the baton will
            # still come to p, so a stand-in waits for it and passes it on.
            threading.Thread(target=_relay, args=(p,), name="ledger-relay", daemon=True).start()
            raise
        nxt = p.next
        if nxt is not None:
            nxt.done.release()
        if p.error is not None:
            raise p.error
        return AppendResult(p.seq, p.hash, p.time, p.prep.blob_refs)

    def _run_writer(self) -> None:
        queue = self._queue
        store = self._store
        pacing = self.pacing
        last_take, idle = _perf_counter(), True
        while True:
            if store.maintenance_due():
                self._wake()  # the last batch is durable: its callers need not wait for this too
                store.maintain()
            held = False
            if self._unwoken:
                wait = pacing.wait_for(len(self._unwoken), len(queue))
                if wait > 0:
                    self._hold_open(wait, len(self._unwoken))
                    held = True
            # Entries that came in while the last batch committed, from callers on their own schedules, may
            # be followed by more (Pacing.linger_for). After an idle spell the writer knows no such thing.
            if not held and not idle and (linger := pacing.linger_for(len(queue))) > 0:
                self._hold_open(linger, pacing.LINGER_BATCH - len(queue), returns=False)
            with self._qlock:
                if queue:
                    n = min(len(queue), MAX_BATCH)
                    for i in range(n):
                        if queue[i].rotate is not None:
                            n = i + 1
                            break
                    batch: list[_Pending] | None = queue[:n]
                    del queue[:n]
                elif self._closed:
                    break
                else:
                    batch = None
                    self._idle = True
            if batch is None:
                # Nothing to overlap with: wake the last batch's callers now, then sleep.
                self._wake()
                self._kick.acquire()
                idle = True
                continue
            taken = _perf_counter()
            pacing.saw_take(taken - last_take, len(batch))  # idle spells included: the rate entries come at
            last_take, idle = taken, False
            if not held:  # (a hold measured its own)
                i = bisect.bisect_left(batch, self._woke_at, key=_QUEUED)  # the first enqueued since
                if len(batch) - i > 1:  # from the first return, not the wake: the writer may have slept
                    pacing.saw_returns(batch[-1].queued - batch[i].queued, len(batch) - i - 1, held=False)
            if self._commit_sequenced(batch) if self._sequenced is not None else self._commit(batch):
                pacing.saw_cycle(_perf_counter() - taken)
        self._wake()

    def _hold_open(self, wait: float, k: int, *, returns: bool = True) -> None:
        """Wake the last batch's callers and wait up to `wait` seconds for k more entries: the callers just
        woken appending again (`returns`, measured for Pacing), or others arriving (Pacing.linger_for)."""
        self._wake()
        with self._qlock:
            if self._closed:
                return
            before = len(self._queue)
            self._until = before + k
        self.stats.held_open += 1
        self.stats.lingered += not returns
        if not self._kick.acquire(timeout=wait):
            with self._qlock:
                timed_out = self._until != 0
                self._until = 0
            if not timed_out:
                self._kick.acquire()  # released after the timeout, before we looked: take that release
        if returns:
            self.pacing.saw_returns(_perf_counter() - self._woke_at, len(self._queue) - before, held=True)

    def _wake(self) -> None:
        """Release the callers of the last committed batch (their entries are already durable).

        Only the first is released here; each woken caller releases the next one (a baton). Woken
        all at once, 30-60 threads would pile onto the GIL, each waking twice (its lock, then the
        GIL), and the writer would queue behind them for the GIL after every SQLite call; passed
        on, about one caller at a time is runnable, which halves the context switches per append.
        Entries queued by enqueue_many are released on their own: their holders may never wait.
        """
        unwoken, self._unwoken = self._unwoken, []
        if unwoken:
            self._woke_at = _perf_counter()
            if any(p.alone for p in unwoken):
                for p in unwoken:
                    if p.alone:
                        _settle(p)
                unwoken = [p for p in unwoken if not p.alone]
                if not unwoken:
                    return
            for a, b in itertools.pairwise(unwoken):
                a.next = b
            unwoken[0].done.release()

    def _commit(self, batch: list[_Pending]) -> bool:
        """Write batch as one transaction, numbered from the in-memory tree (one writer); True if it was written
        (its callers are woken later)."""
        with self._state:
            start, prev = self._size, self._last_hash
        if batch[0].seq != start:  # seqs are handed out when queued; a gap here would misnumber the batch
            self._recover(
                start,
                [],
                batch,
                LedgerUnavailable(
                    f"ledger write refused: queued seq {batch[0].seq} does not follow the stored {start} entries"
                ),
            )
            return False
        rows: list[Row] = []
        leaves: list[bytes] = []
        blobs: dict[str, bytes] = {}
        try:
            # One timestamp per batch: the entries commit together, and formatting is not free.
            t = max(format_time(self._clock()), self._last_time)
            tb = t.encode()
            prev_b = prev.encode()
            seq = start
            for p in batch:
                prep = p.prep
                # The caller's thread hashed the head; only the tail is hashed here.
                tail = b',"prev":"%s","seq":%d,"time":"%s"}' % (prev_b, seq, tb)
                e = prep.head_hash.copy()
                e.update(tail)
                prev = e.hexdigest()
                lf = prep.head_leaf.copy()
                lf.update(tail)
                leaves.append(lf.digest())
                rows.append((seq, prev, prep.head + tail))
                p.hash, p.time = prev, t
                if prep.blob_data:
                    blobs.update(prep.blob_data)
                prev_b = prev.encode()
                seq += 1
            end = seq
            with self._state:
                self._tree.extend(leaves)
                root = self._tree.root(end)
            note = sign_checkpoint(Checkpoint(self._signer.name, end, root), self._signer)
            new_signer = batch[-1].rotate
            if new_signer is not None:
                note = cosign(note, new_signer)
            # The previous batch's callers are woken just before the step that makes this batch durable
            # (SQLite: its one INSERT statement; PostgreSQL: COMMIT): their Python work then overlaps our
            # write and fsync instead of delaying this batch's inserts while we wait for the GIL.
            self._store.write_batch(rows, blobs, (end, note), before_commit=self._wake)
        except Exception as e:  # the writer must survive anything; callers get a LedgerError
            self._wake()
            err = LedgerUnavailable(f"ledger write failed: {e}")
            err.__cause__ = e
            self._recover(start, rows, batch, err)
            return False
        with self._state:
            self._size, self._last_hash, self._last_time, self._checkpoint = end, prev, t, note
            if new_signer is not None:
                self._signer = new_signer
        self._record(len(batch))
        self._unwoken = batch
        return True

    def _commit_sequenced(self, batch: list[_Pending]) -> bool:
        """Write batch as one transaction numbered from the head row it locks (sequenced in the database); True if
        it was written (its callers are woken later)."""
        store = self._sequenced
        assert store is not None
        built: list[Built] = []
        try:
            if self._corrupt is not None:
                raise self._corrupt
            now = format_time(self._clock())  # before the head is locked: the lock is held for as little as can be
            signer, rotate = self._signer, batch[-1].rotate
            preps = [p.prep for p in batch]

            def build(head: Head) -> SequencedBatch:
                self._check_head(head)
                b = build_batch(head, preps, now, signer, rotate)
                built.append(b)
                return b.batch

            store.write_sequenced(build, before_commit=self._wake)
        except Exception as e:  # the writer must survive anything; callers get a LedgerError
            self._wake()
            # Refused: this process would not build on the head (or the head announced another key); failed: the
            # store did not take the batch.
            if isinstance(e, LedgerCorrupted | KeyMismatch):
                err = LedgerUnavailable(f"ledger write refused: {e.diagnostics()}")
            else:
                err = LedgerUnavailable(f"ledger write failed: {e}")
            err.__cause__ = e
            if built and self._written_after_all(built[-1]):
                self._committed(built[-1], batch)
                return True
            self._fail(batch, err)
            return False
        self._committed(built[-1], batch)
        return True

    def _check_head(self, head: Head) -> None:
        """Refuse to build on a head that disagrees with what this process holds, where it can tell cheaply: when
        it holds the same number of entries (otherwise its next catch-up checks what it reads). Raises
        LedgerCorrupted."""
        with self._state:
            size = self._size
            if head.size < size:
                raise LedgerCorrupted(f"the ledger's head row (ledger_head) counts {head.size} entries, but this"
                                      f" process has read {size}")
            if head.size > size:
                return
            mine = Head(size, self._last_hash, frontier_of(self._tree, size), head.signer, self._last_time)
        problem = head_problem(head, mine)
        if problem is not None:
            raise LedgerCorrupted(f"the ledger's head row (ledger_head) disagrees with its entries: {problem}")

    def _written_after_all(self, built: Built) -> bool:
        """A COMMIT can fail after the database made it durable (e.g. a lost connection on COMMIT): True if the
        store holds the batch's first and last entries as built."""
        rows = built.batch.rows
        try:
            got = self._store.get_entries(rows[0][0], len(rows))
        except LedgerError:
            return False
        return len(got) == len(rows) and got[0] == rows[0] and got[-1] == rows[-1]

    def _committed(self, built: Built, batch: list[_Pending]) -> None:
        """Tell batch's entries what they became, and add the batch to the in-memory tree after catching up with
        what other processes appended before it."""
        t = built.time
        for p, r in zip(batch, built.batch.rows, strict=True):
            p.seq, p.hash, p.time = r[0], r[1], t
        try:
            with self._syncing:
                if self._size < built.start:
                    self._catch_up(built.start)
                with self._state:
                    size = self._size
                    if size == built.start:
                        self._tree.extend(built.leaves)
                        if self._tree.root(built.end) != built.root:
                            self._tree.truncate(size)
                            raise LedgerCorrupted(
                                f"the root signed at size {built.end} from the ledger's head row is not the root of"
                                " its entries (ledger_head was changed)")
                        self._size, self._last_hash, self._last_time = built.end, built.batch.head.last_hash, t
                        self._checkpoint = built.batch.checkpoint[1]
                    elif size < built.end:
                        raise LedgerCorrupted(f"read {size} entries, inside the batch just written at"
                                              f" {built.start}..{built.end - 1}")
                    # (size >= end: a reader read this batch back before the writer got here)
        except LedgerCorrupted as e:
            # The batch is durable, its callers are told so; this process appends no more.
            self._corrupt = e
            _log.error("ledger: no more appends from this process: %s", e.diagnostics())
        except LedgerError as e:
            # Not read (the store did not answer): the tree stays behind, and the next catch-up reads this batch too.
            _log.warning("ledger: could not read what other processes appended before batch %d: %s", built.start,
                         e.diagnostics())
        rotate = batch[-1].rotate
        if rotate is not None:
            with self._state:
                self._signer = rotate
        self._record(len(batch))
        self._unwoken = batch

    def _catch_up(self, target: int) -> None:
        """Read into the tree the entries other processes appended up to target (under _syncing). Raises
        LedgerCorrupted (what it read does not chain onto what this process holds), StoreError."""
        with self._state:
            start, prev = self._size, self._last_hash
        if target <= start:
            return
        try:
            leaves, last = read_appended(self._store, start, target, prev)
        except LedgerCorrupted as e:
            self._corrupt = e
            raise
        with self._state:
            self._tree.extend(leaves)
            self._size, self._last_hash, self._last_time = target, last[1], entry_time(last[2])
            self._checkpoint = None  # another process's: latest_checkpoint() reads it from the store

    def _sync(self, need: int | None = None) -> None:
        """Sequenced: catch up with what other processes appended, if need is None or beyond what this process
        holds. One small query when there is nothing to read. Raises LedgerCorrupted, StoreError."""
        if self._sequenced is None or (need is not None and need <= self._size):
            return
        target = self._sequenced.head_size()
        if target is None or target <= self._size:
            return
        with self._syncing:
            self._catch_up(target)

    def _fail(self, batch: list[_Pending], err: LedgerUnavailable) -> None:
        """Fail batch and every entry queued behind it (they may cite its entries, or with one writer their
        seqs), and number again from the store's size."""
        self.stats.failed_batches += 1
        self.last_write_error = err.diagnostics()
        with self._qlock:
            stranded = self._queue[:]
            self._queue.clear()
            self._next_seq = self._size
            self._epoch += 1
        for p in (*batch, *stranded):
            p.error = err
            _settle(p)

    def _recover(self, start: int, rows: list[Row], batch: list[_Pending], err: LedgerUnavailable) -> None:
        """After a failed write, make memory match the store again, then fail the batch.

        A commit can fail after the database made it durable (e.g. a lost connection on COMMIT);
        then the store is the truth and the batch succeeded after all.
        """
        with self._state:
            self._tree.truncate(start)
        try:
            stored = self._store.count()
        except LedgerError:
            stored = -1
        if rows and stored == start + len(rows):
            got = self._store.get_entries(rows[-1][0], 1)
            if got and got[0][1] == rows[-1][1] and got[0][2] == rows[-1][2]:
                cp = self._store.latest_checkpoint()
                with self._state:
                    for r in rows:
                        self._tree.append(leaf_hash(r[2]))
                    self._size, self._last_hash = start + len(rows), rows[-1][1]
                    self._last_time = entry_time(rows[-1][2])
                    self._checkpoint = cp[1] if cp else self._checkpoint
                    rotated = batch[-1].rotate
                    if rotated is not None:
                        self._signer = rotated
                self._record(len(batch))
                for p, r in zip(batch, rows, strict=True):
                    p.seq, p.hash, p.time = r[0], r[1], json.loads(r[2])["time"]
                    _settle(p)
                return
        # Entries queued behind the batch were numbered after it and may be cited by seq (an outcome naming its
        # decision): they fail with it, and numbering starts again at the store's size.
        self._fail(batch, err)

    def _record(self, n: int) -> None:
        self.last_write_error = None
        s = self.stats
        s.batches += 1
        s.entries += n
        s.max_batch = max(s.max_batch, n)
        s.batch_sizes[n] = s.batch_sizes.get(n, 0) + 1

    def write_problem(self) -> str | None:
        """Why an append would fail now, as far as can be told without writing (None: none known): the store's
        own answer (PostgreSQL: privileges, a read-only server), else why the latest batch failed, if no batch
        committed since. Raises StoreError when the store cannot be asked."""
        probe = getattr(self._store, "write_problem", None)
        problem = probe() if probe is not None else None
        return problem or self.last_write_error

    # -- reading -------------------------------------------------------------------------------

    def size(self) -> int:
        """Number of durable entries (sequenced: those other processes appended included). Raises StoreError,
        LedgerCorrupted (sequenced: what others appended does not chain onto what this process holds)."""
        self._sync()
        with self._state:
            return self._size

    def entry(self, seq: int) -> StoredEntry:
        """The entry at seq; raises EntryNotFound (or StoreError, LedgerCorrupted)."""
        if seq < 0:
            raise EntryNotFound(seq)
        self._sync(seq + 1)
        if seq >= self._size:
            raise EntryNotFound(seq)
        rows = self._store.get_entries(seq, 1)
        if not rows or rows[0][0] != seq:
            raise EntryNotFound(seq)
        s, h, raw = rows[0]
        return StoredEntry(s, h, raw, _parse(raw))

    def entries(self, start: int = 0, limit: int = 100) -> list[StoredEntry]:
        """Up to limit entries from start, in seq order; raises StoreError, LedgerCorrupted."""
        limit = min(max(limit, 0), self.size() - max(start, 0))
        if limit <= 0:
            return []
        return [StoredEntry(s, h, raw, _parse(raw)) for s, h, raw in self._store.get_entries(max(start, 0), limit)]

    def blob(self, digest: str) -> bytes | None:
        return self._store.get_blob(digest)

    def root(self, size: int | None = None) -> bytes:
        """Merkle tree hash at size (default: current); raises ProofError (StoreError, LedgerCorrupted)."""
        self._sync(size)
        with self._state:
            return self._tree.root(self._size if size is None else self._bounded(size))

    def latest_checkpoint(self) -> str:
        """Signed checkpoint note for the current size (signed on the fly for an empty ledger). Sequenced: the
        store's latest, which may be another process's, once its root is that of the entries this process then
        holds. Raises StoreError, LedgerCorrupted."""
        if self._sequenced is not None:
            cp = self._sequenced.latest_checkpoint()
            if cp is not None:
                self._sync(cp[0])
                return self._checked(*cp)
        with self._state:
            note = self._checkpoint
            root = self._tree.root(self._size)
            size = self._size
        if note is None:
            note = sign_checkpoint(Checkpoint(self._signer.name, size, root), self._signer)
        return note

    def _checked(self, size: int, note: str) -> str:
        """note, a checkpoint of size read from the store, if it signs the root of the entries held; raises
        LedgerCorrupted."""
        try:
            cp = parse_checkpoint(note[: note.rfind("\n\n") + 1])
        except LedgerError as e:
            raise LedgerCorrupted(f"latest checkpoint is malformed: {e.diagnostics()}") from e
        with self._state:
            ok = cp.size == size <= self._size and cp.root == self._tree.root(size)
        if not ok:
            raise LedgerCorrupted(f"the latest checkpoint (size {size}) does not sign the root of the entries")
        return note

    def _bounded(self, size: int) -> int:
        if not 0 <= size <= self._size:
            raise ProofError(f"tree size {size} is beyond the ledger's {self._size} entries")
        return size

    def inclusion_proof(self, seq: int, size: int | None = None) -> InclusionProof:
        """RFC 9162 inclusion proof of entry seq in the tree of size; raises ProofError (StoreError,
        LedgerCorrupted)."""
        self._sync(size)
        with self._state:
            n = self._size if size is None else self._bounded(size)
            hashes = self._tree.inclusion_proof(seq, n)
            return InclusionProof(seq, n, self._tree.leaf(seq), hashes)

    def consistency_proof(self, old: int, new: int | None = None) -> ConsistencyProof:
        """RFC 9162 consistency proof between tree sizes old and new; raises ProofError (StoreError,
        LedgerCorrupted)."""
        self._sync(new)
        with self._state:
            n = self._size if new is None else self._bounded(new)
            return ConsistencyProof(old, n, self._tree.consistency_proof(old, n))

    def close(self) -> None:
        """Finish queued appends, stop the writer and close the store. Idempotent."""
        with self._qlock:
            if self._closed:
                return
            self._closed = True
            if self._idle or self._until:
                self._idle = False
                self._until = 0
                self._kick.release()
        if self._writer is not None:
            self._writer.join()
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
