"""Batches numbered in the ledger database (PostgreSQL): building one from the head row it locked, checking a
head against the entries, and reading back the entries other processes appended.

The head (ledger/store.py, ledger_head) carries what a batch needs and nothing it could not be checked against:
next_seq, the last entry's hash and time, the RFC 6962 frontier of the tree (ledger/compact.py) and the key that
signs. A batch built on it gets seqs next_seq.., prev chained from the last hash, a time no earlier than the last
time, and a root folded from the frontier and its own leaves; its checkpoint is signed by the process that
commits it (C2SP tlog-checkpoint, ledger/note.py), so entry and checkpoint formats are those of a ledger with one
writer. Pure, but for read_appended's reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ledger.compact import compact_append, compact_root, frontier_of
from ledger.entry import ZERO_HASH, PreparedEntry, tail_bytes
from ledger.errors import KeyMismatch, LedgerCorrupted, LedgerError
from ledger.keys import NoteSigner
from ledger.merkle import MerkleTree
from ledger.note import Checkpoint, cosign, sign_checkpoint
from ledger.store import Head, LedgerStore, Row, SequencedBatch

_sha256 = hashlib.sha256


@dataclass(frozen=True)
class Built:
    """A batch built on a head: what the store writes, and what the process adds to its own tree once committed."""

    batch: SequencedBatch
    leaves: list[bytes]
    root: bytes
    time: str

    @property
    def start(self) -> int:
        return self.batch.rows[0][0]

    @property
    def end(self) -> int:
        return self.batch.head.size


def entry_time(raw: bytes) -> str:
    """The time of stored entry bytes: canonical JSON ends ,"time":"<27 characters>"}."""
    return raw[-29:-2].decode("ascii", "replace")


def head_of(tree: MerkleTree, last_hash: str, last_time: str, signer: str) -> Head:
    """The head a ledger of these entries has (tree, the last entry's hash and time); raises ProofError."""
    return Head(tree.size, last_hash, frontier_of(tree), signer, last_time)


def head_problem(head: Head, expected: Head) -> str | None:
    """Why head is not the head of the entries that give `expected` (signers aside), in a few words; None if it is."""
    if head.size < expected.size:
        return f"it counts {head.size} entries but the store holds {expected.size} (the head is behind)"
    if head.size > expected.size:
        return f"it counts {head.size} entries but the store holds {expected.size} (entries are missing)"
    last = f"seq {head.size - 1}" if head.size else "no entry"
    if head.last_hash != expected.last_hash:
        return f"its last hash is not the hash of {last}"
    if head.frontier != expected.frontier:
        return f"its Merkle frontier is not that of the {head.size} entries"
    if head.last_time != expected.last_time:
        return f"its last time is not the time of {last}"
    return None


def key_problem(head: Head, signer: NoteSigner) -> KeyMismatch | None:
    """KeyMismatch if the head announces another signing key than signer's (none announced yet: the first batch
    announces its own)."""
    if not head.signer or head.signer == signer.vkey:
        return None
    try:
        announced = head.signer.split("+", 2)[1]
    except IndexError:
        announced = repr(head.signer[:40])
    return KeyMismatch(
        f"the ledger's head announces signing key {announced} but this process signs with {signer.key_id.hex()}"
        " (the key was rotated since it started, or it was given another ledger's key); restart it with the"
        " ledger's current key"
    )


def build_batch(
    head: Head, preps: Sequence[PreparedEntry], now: str, signer: NoteSigner, rotate: NoteSigner | None = None
) -> Built:
    """Number preps from head, chain, hash and root them, and sign the checkpoint (cosigned by `rotate` for a batch
    that ends with a key rotation, which the new head then announces). `now` is the writer's clock (ledger/entry.py
    format_time); entries get max(now, head.last_time). Raises KeyMismatch if the head announces another key,
    LedgerCorrupted if its frontier does not fit its size."""
    if (mismatch := key_problem(head, signer)) is not None:
        raise mismatch
    t = max(now, head.last_time)
    tb = t.encode()
    prev = head.last_hash
    prev_b = prev.encode()
    seq = head.size
    rows: list[Row] = []
    leaves: list[bytes] = []
    blobs: dict[str, bytes] = {}
    for prep in preps:
        # The caller's thread hashed the head of the JSON; only the tail is hashed here.
        tail = b',"prev":"%s","seq":%d,"time":"%s"}' % (prev_b, seq, tb)
        e = prep.head_hash.copy()
        e.update(tail)
        prev = e.hexdigest()
        lf = prep.head_leaf.copy()
        lf.update(tail)
        leaves.append(lf.digest())
        rows.append((seq, prev, prep.head + tail))
        if prep.blob_data:
            blobs.update(prep.blob_data)
        prev_b = prev.encode()
        seq += 1
    try:
        frontier = compact_append(head.size, head.frontier, leaves)
        root = compact_root(seq, frontier)
    except LedgerError as e:
        raise LedgerCorrupted(f"the ledger's head row is damaged: {e.diagnostics()}") from e
    note = sign_checkpoint(Checkpoint(signer.name, seq, root), signer)
    if rotate is not None:
        note = cosign(note, rotate)
    new = Head(seq, prev, frontier, (rotate or signer).vkey, t)
    return Built(SequencedBatch(rows, blobs, (seq, note), new), leaves, root, t)


def read_appended(store: LedgerStore, start: int, target: int, prev: str) -> tuple[list[bytes], Row]:
    """Read entries [start, target) that other processes appended, each checked against its stored hash and
    chained onto prev (the hash of entry start - 1); returns their leaf hashes and the last row. Raises
    LedgerCorrupted (a gap, a changed entry, a broken chain) or StoreError."""
    leaves: list[bytes] = []
    prev_b = (prev or ZERO_HASH).encode()
    last: Row | None = None
    seq = start
    while seq < target:
        rows = store.get_entries(seq, min(4096, target - seq))
        if not rows:
            raise LedgerCorrupted(f"the ledger counts {target} entries but the store holds {seq}")
        for row in _chained(rows, seq, prev_b):
            leaves.append(_sha256(b"\x00" + row[2]).digest())
            prev_b = row[1].encode()
            last = row
            seq += 1
    assert last is not None
    return leaves, last


def _chained(rows: Iterable[Row], seq: int, prev_b: bytes) -> Iterable[Row]:
    for row in rows:
        s, h, raw = row
        if s != seq:
            raise LedgerCorrupted(f"ledger store has a gap at seq {seq}")
        if _sha256(raw).hexdigest() != h:
            raise LedgerCorrupted(f"seq {s}: stored hash does not match its bytes")
        if not raw.endswith(tail_bytes(s, raw[-29:-2], prev_b)):
            raise LedgerCorrupted(f"seq {s}: prev does not match the hash of the previous entry")
        yield row
        prev_b = h.encode()
        seq += 1
