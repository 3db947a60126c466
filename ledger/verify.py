"""Offline ledger verifier (DESIGN.md "Ledger format" → Verifier).

Steps, in order; the first failure is reported with its seq and problem code:
1. Entries in seq order: no gaps (missing), SHA-256 of the bytes equals the stored hash (modified),
   fields match the position: seq (reordered / inserted), prev chain (modified), field syntax
   (malformed). A byte-level fast path checks prev/seq/time without parsing JSON; entries with
   blobs, anything unusual, and every entry under deep=True are parsed and checked in full.
2. Every referenced blob exists and hashes to its digest (blob_mismatch).
3. The RFC 6962 tree is rebuilt; every stored checkpoint must be signed by the verifier's key
   (bad_signature / unknown_key), be no larger than the log (truncated) and carry the root of the
   rebuilt tree at its size (modified). Entries past the last checkpoint were never committed
   by the ledger (inserted).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import rfc8785

from ledger.entry import ZERO_HASH, field_problem
from ledger.errors import BadSignature, LedgerError, MalformedNote, UnknownKey
from ledger.keys import NoteVerifier
from ledger.merkle import MerkleTree
from ledger.note import open_checkpoint
from ledger.store import LedgerStore, open_store

PROBLEMS = (
    "modified",
    "missing",
    "reordered",
    "inserted",
    "truncated",
    "bad_signature",
    "unknown_key",
    "blob_mismatch",
    "malformed",
)
_TIME = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
_TIME_LEN = 27
_PROGRESS_EVERY = 8192


@dataclass(frozen=True)
class Verdict:
    ok: bool
    size: int
    first_bad_seq: int | None
    problem: str | None
    message: str
    checkpoints: int = 0
    origin: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Fail(Exception):
    def __init__(self, seq: int | None, problem: str, message: str) -> None:
        super().__init__(message)
        self.seq, self.problem, self.message = seq, problem, message


def verify_store(
    url: str,
    verifier: NoteVerifier,
    *,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
) -> Verdict:
    """Verify the ledger at url against verifier's public key.

    Integrity problems come back as a Verdict with ok=False; only an unusable store or URL raises
    (StoreError, a LedgerError).
    """
    store = open_store(url, create=False)
    try:
        return verify(store, verifier, progress=progress, deep=deep)
    finally:
        store.close()


def verify(
    store: LedgerStore,
    verifier: NoteVerifier,
    *,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
) -> Verdict:
    """verify_store() over an already open store."""
    size = 0
    try:
        total = store.count()
        leaves, size, blob_refs = _scan_entries(store, total, progress, deep)
        _check_blobs(store, blob_refs)
        tree = MerkleTree.from_leaf_hashes(leaves)
        n_cp = _check_checkpoints(store, verifier, tree)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        # Safety net: a verifier must report, never crash, on whatever bytes it is handed.
        return Verdict(
            False,
            size,
            None,
            "malformed",
            f"malformed: unexpected data ({type(e).__name__}: {e})",
            origin=verifier.name,
        )
    except _Fail as f:
        where = f"seq {f.seq} " if f.seq is not None else ""
        return Verdict(False, size, f.seq, f.problem, f"{where}{f.problem}: {f.message}", origin=verifier.name)
    msg = f"{size} entries, chain and tree intact, {n_cp} checkpoints verified (origin {verifier.name})"
    return Verdict(True, size, None, None, msg, checkpoints=n_cp, origin=verifier.name)


def _parse(data: bytes, seq: int) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _Fail(seq, "malformed", f"entry is not valid JSON ({type(e).__name__})") from e


def _scan_entries(
    store: LedgerStore, total: int, progress: Callable[[int, int], None] | None, deep: bool
) -> tuple[bytearray, int, list[tuple[int, str, str]]]:
    sha = hashlib.sha256
    time_re = _TIME
    leaves = bytearray()
    blob_refs: list[tuple[int, str, str]] = []
    prev = ZERO_HASH
    prev_b = prev.encode()
    n = 0
    for seq, stored_hash, data in store.iter_entries(0):
        if seq != n:
            raise _Fail(n, "missing", f"entry {n} is missing (the next stored entry is {seq})")
        digest = sha(data).hexdigest()
        if digest != stored_hash:
            raise _Fail(seq, "modified", "stored hash does not match its bytes")
        # Fast path: the canonical tail is ,"prev":"<64 hex>","seq":<n>,"time":"<27 chars>"}
        tail = b',"prev":"' + prev_b + b'","seq":' + str(seq).encode() + b',"time":"'
        end = len(data) - _TIME_LEN - 2
        fast = (
            data.startswith(b'{"blobs":{},"body":{')
            and data[end - len(tail) : end] == tail
            and data.endswith(b'"}')
            and time_re.fullmatch(data, end, end + _TIME_LEN) is not None
        )
        if not fast or deep:
            value = _parse(data, seq)
            problem = field_problem(value, seq, prev)
            if problem is not None:
                raise _Fail(seq, *problem)
            try:
                canonical = rfc8785.dumps(value)
            except (rfc8785.CanonicalizationError, ValueError, TypeError) as e:
                raise _Fail(seq, "malformed", "entry is not I-JSON") from e
            if canonical != data:
                raise _Fail(seq, "malformed", "entry bytes are not RFC 8785 canonical JSON")
            blob_refs.extend((seq, name, d) for name, d in sorted(value["blobs"].items()))
        lh = sha(b"\x00")
        lh.update(data)
        leaves += lh.digest()
        prev, prev_b = digest, digest.encode()
        n += 1
        if progress is not None and n % _PROGRESS_EVERY == 0:
            progress(n, total)
    if progress is not None:
        progress(n, total)
    return leaves, n, blob_refs


def _check_blobs(store: LedgerStore, refs: list[tuple[int, str, str]]) -> None:
    for seq, name, digest in refs:
        data = store.get_blob(digest)
        if data is None:
            raise _Fail(seq, "blob_mismatch", f"blob {name!r} ({digest[:12]}…) is missing")
        if hashlib.sha256(data).hexdigest() != digest:
            raise _Fail(seq, "blob_mismatch", f"blob {name!r} ({digest[:12]}…) does not match its digest")


def _check_checkpoints(store: LedgerStore, verifier: NoteVerifier, tree: MerkleTree) -> int:
    n = tree.size
    good = 0  # size of the last checkpoint that verified
    count = 0
    for size, note in store.checkpoints():
        try:
            cp = open_checkpoint(note, verifier)
        except BadSignature as e:
            raise _Fail(None, "bad_signature", f"checkpoint at size {size}: {e.diagnostics()}") from e
        except UnknownKey as e:
            raise _Fail(None, "unknown_key", f"checkpoint at size {size}: {e.diagnostics()}") from e
        except MalformedNote as e:
            raise _Fail(None, "malformed", f"checkpoint at size {size}: {e.diagnostics()}") from e
        except LedgerError as e:
            raise _Fail(None, "malformed", f"checkpoint at size {size}: {e.diagnostics()}") from e
        if cp.size != size:
            raise _Fail(None, "malformed", f"checkpoint stored under size {size} is for size {cp.size}")
        if size > n:
            raise _Fail(n, "truncated", f"a signed checkpoint covers {size} entries but only {n} are stored")
        if cp.root != tree.root(size):
            raise _Fail(
                good if good < n else None,
                "modified",
                f"entries after seq {good - 1} do not match the signed checkpoint at size {size}",
            )
        good = size
        count += 1
    if good < n:
        raise _Fail(good, "inserted", f"entries from seq {good} on are not covered by any signed checkpoint")
    return count
