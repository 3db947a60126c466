"""Offline ledger verifier (DESIGN.md "Ledger format" → Verifier), over a store or an export bundle.

Steps, in order; the first failure is reported with its seq and problem code:
1. Entries in seq order: no gaps (missing), SHA-256 of the bytes equals the recorded hash
   (modified), fields match the position: seq (reordered / inserted), prev chain (modified), field
   syntax (malformed). A byte-level fast path checks prev/seq/time without parsing JSON; entries
   with blobs, key rotations, anything unusual, and every entry under deep=True are parsed in full.
   The chain alone cannot say which side of a break was changed: an entry edited with its stored
   hash recomputed breaks the prev of the entry after it, and an inserted entry shows as the next
   one claiming its seq. So a problem found here is settled against the signed checkpoints (only
   then, on this failure path): the entry it points at is named if the first signed root the held
   entries no longer give covers it, the entry where the problem showed if a signed root still
   vouches for the one it points at, and the first entry of the first unmatched checkpoint if the
   difference lies before both (_blame).
2. Every referenced blob exists and hashes to its digest (blob_mismatch).
3. The key schedule is rebuilt from the key-rotation entries (ledger/rotation.py); the auditor's
   key must be in it, and each rotation's checkpoint must be signed by the old key and cosigned by
   the new one (unknown_key).
4. The RFC 6962 tree is rebuilt (for a partial bundle: from the compact ranges left and right of
   its entries). Every checkpoint must be signed by the key of its epoch (bad_signature /
   unknown_key); those inside the held range must carry the rebuilt root at their size
   (modified); those outside it must be consistent with the anchor checkpoint by an RFC 9162
   consistency proof (modified). Entries past the anchor checkpoint were never committed by the
   ledger (inserted); an anchor beyond the held entries without the hashes to reach it means
   entries were cut off (truncated), unless a signed root inside the held range no longer matches:
   then entries were removed there and the rest renumbered (missing, at the first unmatched one).
   A held range that does not match its checkpoints and holds more entries than the anchor signed
   had entries inserted (inserted, at the first unmatched one).
5. Optionally the auditor's earlier saved checkpoint: the ledger must still contain it (truncated)
   with the same root (modified) — this catches a history rewritten and re-signed.

The auditor may hold several keys, a key history (verify_with_history): the check is anchored on the one
that signed the latest checkpoint, so a bundle made before a rotation verifies with the history written
after it. A ledger not one of whose checkpoints any key given signs is untrusted_key: not verified, which
is not a finding of tampering (the auditor may lack a key), unlike a checkpoint or rotation signed by a key
the ledger's own history does not account for (unknown_key).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ledger import fastscan
from ledger.compact import Frontier, compact_range
from ledger.entry import ZERO_HASH
from ledger.errors import BadSignature, BundleError, LedgerError, MalformedNote, ProofError, UnknownKey
from ledger.keys import NoteVerifier
from ledger.merkle import MerkleTree, leaf_hash, verify_consistency, verify_inclusion
from ledger.note import Checkpoint, open_checkpoint, peek_checkpoint, signature_key_ids
from ledger.rotation import KeySchedule, Rotation, RotationError, rotation_in
from ledger.store import LedgerStore, ReadSnapshot, Row, open_store

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
    "untrusted_key",  # not verified: signed by none of the keys given (verify_with_history)
)
_PROGRESS_EVERY = 16384


class TrustedCheckpointError(LedgerError):
    """The auditor's saved checkpoint is unusable (malformed, other origin, wrong key, no proof)."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    size: int
    first_bad_seq: int | None
    problem: str | None
    message: str
    checkpoints: int = 0
    origin: str = ""
    start: int = 0
    keys: int = 1
    trusted_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckpointRecord:
    size: int
    note: str
    consistency: list[bytes] | None = None  # to the anchor, for checkpoints outside the held range


@dataclass
class KeyHistoryItem:
    """A rotation entry outside the held range, with its inclusion proof in the anchor tree."""

    seq: int
    raw: bytes
    inclusion: list[bytes]


@dataclass
class Material:
    """Everything the verifier checks, from a store or a bundle."""

    entries: Iterable[Row]
    total: int
    checkpoints: list[CheckpointRecord]
    blob_problem: Callable[[str], str | None]  # None if the blob is present and intact
    start: int = 0
    left: list[bytes] = field(default_factory=list)
    anchor: int | None = None  # tree size of the anchor checkpoint; None = the largest checkpoint
    right: list[bytes] = field(default_factory=list)
    key_history: list[KeyHistoryItem] = field(default_factory=list)
    # A bundle: entry lines are scanned from the file (in parallel); blobs and checkpoints are read
    # by after_entries() once the entries are done.
    bundle_path: str | None = None
    entries_span: tuple[int, int] = (0, 0)
    after_entries: Callable[[], None] | None = None
    workers: int | None = None
    # A bundle whose unsigned header and trailer disagree on how many entries it holds. Reported (as a corrupt
    # bundle) only if the entries themselves verify: entry lines edited together with a count are tampering,
    # and the verdict names the entry.
    miscount: str | None = None


class _Fail(Exception):
    def __init__(self, seq: int | None, problem: str, message: str) -> None:
        super().__init__(message)
        self.seq, self.problem, self.message = seq, problem, message


@dataclass
class _Tail:
    """Kept when the chain scan stops at a problem: the entry the problem points at (see _pointer), and the leaf
    hash of every held entry by position, chain ignored, up to the first checkpoint past that entry."""

    pointer: int
    leaves: bytearray


def verify_store(
    url: str,
    verifier: NoteVerifier | list[NoteVerifier],
    *,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
    trusted: str | None = None,
) -> Verdict:
    """Verify the ledger at url against verifier's public key (or a key history, oldest first: see
    verify_with_history).

    Integrity problems come back as a Verdict with ok=False; only an unusable store or URL, or an
    unusable trusted checkpoint, raises (StoreError, TrustedCheckpointError: LedgerErrors).
    """
    store = open_store(url, create=False)
    try:
        return verify(store, verifier, progress=progress, deep=deep, trusted=trusted)
    finally:
        store.close()


def store_material(store: LedgerStore, snap: ReadSnapshot) -> Material:
    """What to verify of a store: entries and checkpoints from one snapshot (a ledger may be written meanwhile).
    Blobs are read as they are referenced: a batch writes its blobs with its entries, and none is ever removed."""

    def blob_problem(digest: str) -> str | None:
        data = store.get_blob(digest)
        if data is None:
            return "is missing"
        return None if hashlib.sha256(data).hexdigest() == digest else "does not match its digest"

    return Material(
        entries=snap.entries,
        total=snap.total,
        checkpoints=[CheckpointRecord(s, n) for s, n in snap.checkpoints],
        blob_problem=blob_problem,
    )


def verify(
    store: LedgerStore,
    verifier: NoteVerifier | list[NoteVerifier],
    *,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
    trusted: str | None = None,
) -> Verdict:
    """verify_store() over an already open store."""
    snap = store.snapshot()
    try:
        keys = [verifier] if isinstance(verifier, NoteVerifier) else list(verifier)
        return verify_with_history(store_material(store, snap), keys, progress=progress, deep=deep, trusted=trusted)
    finally:
        snap.close()


def verify_material(
    m: Material,
    verifier: NoteVerifier,
    *,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
    trusted: str | None = None,
) -> Verdict:
    """Run steps 1-5 over m. Raises TrustedCheckpointError for an unusable trusted checkpoint."""
    state = _State(m.start)
    try:
        try:
            if m.bundle_path is not None:
                leaves, rotations, blob_refs = _scan_bundle(m, state, progress, deep, verifier)
            else:
                leaves, rotations, blob_refs = _scan_entries(m, state, progress, deep)
        except _Fail as f:
            raise _blame(m, verifier, state, f) from None
        # A bad blob is reported after the checks below, unless they find an earlier bad seq: the verdict
        # names the first bad entry.
        blob_fail = _first_fail(_check_blobs, m, blob_refs)
        try:
            schedule = _schedule(m, verifier, leaves, rotations)
            roots = _Roots(m, leaves, state.end, state.tree, also=_trusted_size(trusted))
            if roots.short is not None:
                _check_short(m, verifier, roots, state)
            n_cp = _check_checkpoints(m, schedule, roots, state)
            if trusted is not None:
                t_size = _check_trusted(trusted, schedule, roots, verifier)
                state.trusted_size = t_size
        except _Fail as f:
            if blob_fail is not None and (f.seq is None or (blob_fail.seq is not None and blob_fail.seq < f.seq)):
                raise blob_fail from f
            raise
        if blob_fail is not None:
            raise blob_fail
        miscount = m.miscount or state.miscount
        if miscount is not None:
            # Every entry verified: only the unsigned counts are wrong, so the file is unusable, not tampered with.
            raise BundleError(f"bundle is corrupt: {miscount}")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, ProofError) as e:
        # Safety net: a verifier must report, never crash, on whatever bytes it is handed.
        return _verdict_fail(state, verifier, None, "malformed", f"unexpected data ({type(e).__name__}: {e})")
    except _Fail as f:
        return _verdict_fail(state, verifier, f.seq, f.problem, f.message)
    span = f"seqs {m.start}..{state.end - 1} of {roots.anchor}" if m.start or state.end != roots.anchor else ""
    what = f"{state.end - m.start} entries" + (f" ({span})" if span else "")
    keys = len(schedule.keys)
    msg = (
        f"{what}, chain and tree intact, {n_cp} checkpoints verified"
        + (f", {keys} keys" if keys > 1 else "")
        + (f", consistent with trusted checkpoint at size {state.trusted_size}" if trusted is not None else "")
        + f" (origin {verifier.name})"
    )
    return Verdict(
        True,
        state.end,
        None,
        None,
        msg,
        checkpoints=n_cp,
        origin=verifier.name,
        start=m.start,
        keys=keys,
        trusted_size=state.trusted_size,
    )


class _State:
    def __init__(self, start: int) -> None:
        self.start = start
        self.end = start
        self.trusted_size: int | None = None
        self.tree: MerkleTree | None = None  # prebuilt by parallel workers
        # Checkpoints opened with the auditor's key while the workers scanned (note -> result).
        self.opened: dict[str, Checkpoint | LedgerError] = {}
        self.opened_by: NoteVerifier | None = None
        self.tail: _Tail | None = None  # set with a scan problem
        self.miscount: str | None = None  # a bundle's trailer count the lines do not bear out


class _Prefetch:
    """While worker processes scan the entries, the otherwise idle parent reads the sections after
    them and checks checkpoint signatures under the auditor's key, a few per call. The results are
    only consulted later, at the step that needs them, so the order of checks and the verdict do
    not change: a read error is re-raised where the read used to happen, and a checkpoint whose
    epoch has another key is opened then as before."""

    def __init__(self, m: Material, state: _State, verifier: NoteVerifier) -> None:
        self.m, self.state, self.verifier = m, state, verifier
        self.read = False
        self.error: BaseException | None = None
        self.todo: list[str] = []

    def __call__(self) -> bool:
        """Do a slice of the work; False once there is none left."""
        if not self.read:
            self.read = True
            if self.m.after_entries is not None:
                try:
                    self.m.after_entries()
                except Exception as e:  # re-raised after the scan, where it used to surface
                    self.error = e
                    return False
            self.todo = [c.note for c in self.m.checkpoints]
            self.todo.reverse()
            self.state.opened_by = self.verifier
            return bool(self.todo)
        opened = self.state.opened
        for _ in range(min(32, len(self.todo))):
            note = self.todo.pop()
            try:
                opened[note] = open_checkpoint(note, self.verifier)
            except LedgerError as e:
                opened[note] = e
        return bool(self.todo)

    def finish(self) -> None:
        """The sections after the entries: read (or their read error raised) as after the scan."""
        if not self.read:
            self.read = True
            if self.m.after_entries is not None:
                self.m.after_entries()
        elif self.error is not None:
            raise self.error


def _verdict_fail(state: _State, v: NoteVerifier, seq: int | None, problem: str, message: str) -> Verdict:
    where = f"seq {seq} " if seq is not None else ""
    return Verdict(False, state.end, seq, problem, f"{where}{problem}: {message}", origin=v.name, start=state.start)


def _scan_entries(
    m: Material, state: _State, progress: Callable[[int, int], None] | None, deep: bool
) -> tuple[bytearray, list[Rotation], list[tuple[int, str, str]]]:
    """The fast scan over a store's rows, in slices so progress can be reported."""
    part = fastscan.Part(m.start)
    prev: str | None = ZERO_HASH if m.start == 0 else None
    it = iter(m.entries)
    rest: Iterator[Row] = iter(())
    while True:
        block = list(itertools.islice(it, _PROGRESS_EVERY))
        if not block:
            break
        done = part.count
        prev = fastscan.scan_rows(block, part, prev, deep)
        if part.problem is not None:
            rest = itertools.chain(block[part.count - done :], it)  # from the row the problem is in
            break
        if progress is not None:
            progress(part.count, m.total)
    rotations: list[Rotation] = []
    for seq, raw in part.rotations:
        try:
            rot = rotation_in(seq, raw)
        except RotationError as e:
            raise _Fail(seq, "malformed", e.diagnostics()) from e
        if rot is not None:
            rotations.append(rot)
    if part.problem is not None:
        seq, code, message = part.problem
        state.end = seq
        with contextlib.suppress(LedgerError):  # rows after the problem unreadable: it is reported as found
            state.tail = _tail(m, part.leaves, seq, code, rest)
        raise _Fail(seq, code, message)
    state.end = m.start + part.count
    if progress is not None:
        progress(part.count, m.total)
    return part.leaves, rotations, part.blob_refs


def _scan_bundle(
    m: Material, state: _State, progress: Callable[[int, int], None] | None, deep: bool, verifier: NoteVerifier
) -> tuple[bytearray, list[Rotation], list[tuple[int, str, str]]]:
    """The fast scan of a bundle's entry lines, split over worker processes for large bundles.

    Worker ranges after the first start without the previous entry; the parent stitches them. A
    range that does not join its predecessor cleanly (a problem anywhere in it, another first seq,
    another prev) is scanned again here from the entry and hash where its predecessor ended, as one
    sequential scan would reach it, so the first problem and its wording do not depend on the split.
    """
    assert m.bundle_path is not None
    path = m.bundle_path
    a, b = m.entries_span
    workers = m.workers if m.workers is not None else fastscan.workers_for(m.total)
    prev0 = ZERO_HASH if m.start == 0 else None
    ranges = [(a, b)]
    if workers > 1 and b > a:
        ranges = fastscan.split_points(path, a, b, fastscan.tasks_for(workers, b - a))
    prefetch = _Prefetch(m, state, verifier)
    found: list[fastscan.Part | None] = [None]
    if len(ranges) > 1:
        found = fastscan.scan_parallel(path, ranges, workers, m.start, prev0, deep, progress, m.total, prefetch)
    parts: list[fastscan.Part] = []
    leaves = bytearray()
    rotations: list[Rotation] = []
    refs: list[tuple[int, str, str]] = []
    expect = m.start
    last: str | None = prev0
    for i, ((lo, hi), p) in enumerate(zip(ranges, found, strict=True)):
        if p is None or (i > 0 and (p.problem is not None or p.first_seq != expect or p.first_prev != last)):
            p = _scan_here(path, lo, hi, expect, last, deep, progress if len(ranges) == 1 else None, m.total)
        parts.append(p)
        leaves += p.leaves
        refs += p.blob_refs
        for seq, raw in p.rotations:
            try:
                rot = rotation_in(seq, raw)
            except RotationError as e:
                raise _Fail(seq, "malformed", e.diagnostics()) from e
            if rot is not None:
                rotations.append(rot)
        if p.problem is not None:
            seq, code, message = p.problem
            state.end = seq
            if code == "corrupt":
                raise BundleError(f"bundle is corrupt: {message}")
            lines = _lines(path, lo, m.entries_span[1], p.count)
            try:
                prefetch.finish()  # the checkpoints, to settle the problem against (_blame)
                state.tail = _tail(m, leaves, seq, code, lines)
            except LedgerError:
                pass  # a bad section after the entries is reported after this problem, as before: no blame
            finally:
                lines.close()
            raise _Fail(seq, code, message)
        expect = p.first_seq + p.count
        last = p.last_hash or last
    state.end = expect
    if m.start == 0 and len(parts) > 1:
        state.tree = MerkleTree.from_parts(expect, [(p.leaves, p.levels) for p in parts])
    if expect - m.start != m.total:
        state.miscount = f"the trailer says {m.total} entries, the file holds {expect - m.start}"
    prefetch.finish()
    return leaves, rotations, refs


def _lines(path: str, lo: int, hi: int, skip: int) -> Generator[Row, None, None]:
    """The bundle's entry lines in bytes [lo, hi) after the first skip, as rows (seq -1 for a line that does not
    start with one). Raises BundleError if the file cannot be read."""
    try:
        with open(path, "rb") as f:
            for buf, a, b in fastscan.iter_buffers(f, lo, hi):
                pos = a
                while pos < b:
                    nl = buf.find(b"\n", pos, b)
                    if skip:
                        skip -= 1
                    else:
                        head, _, rest = bytes(buf[pos:nl]).partition(b" ")
                        h, _, raw = rest.partition(b" ")
                        seq = int(head) if head.isdigit() and len(head) < 20 else -1
                        yield seq, h.decode("ascii", "replace"), raw
                    pos = nl + 1
    except OSError as e:
        raise BundleError(f"cannot read bundle: {e.strerror or e}") from e


def _scan_here(
    path: str,
    lo: int,
    hi: int,
    first_seq: int,
    prev: str | None,
    deep: bool,
    progress: Callable[[int, int], None] | None,
    total: int,
) -> fastscan.Part:
    """Scan the entry lines in bytes [lo, hi) of the bundle in this process, seq first_seq on."""
    part = fastscan.Part(first_seq)
    try:
        with open(path, "rb") as f:
            for buf, x, y in fastscan.iter_buffers(f, lo, hi):
                prev = fastscan.scan_buffer(buf, x, y, part, prev, deep)
                if progress is not None:
                    progress(min(part.count, total), total)
                if part.problem is not None:
                    break
    except OSError as e:
        raise BundleError(f"cannot read bundle: {e.strerror or e}") from e
    return part


def _pointer(start: int, s: int, code: str, row: Row) -> int:
    """The entry a scan problem (code) at seq s, in row, points at; the signed checkpoints then confirm or clear it.

    An entry that claims an earlier seq (inserted): that seq, the entry signed there having been pushed down
    to s by entries put in before it. An entry whose bytes match its stored hash but whose prev is not the hash
    of the entry before (modified): the entry before, which is what editing an entry and recomputing its stored
    hash leaves. Anything else: s itself.
    """
    line_seq, stored, raw = row
    if code == "inserted":
        claimed = line_seq if line_seq != s else _claimed_seq(raw)
        return claimed if claimed is not None and start <= claimed < s else s
    if code == "modified" and s > start and hashlib.sha256(raw).hexdigest() == stored:
        return s - 1
    return s


def _claimed_seq(raw: bytes) -> int | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    seq = value.get("seq") if isinstance(value, dict) else None
    return seq if type(seq) is int else None


def _tail(m: Material, leaves: bytes | bytearray, s: int, code: str, rows: Iterator[Row]) -> _Tail | None:
    """What _blame needs after a scan problem at seq s: leaves holds seqs m.start..s-1, rows the held rows from
    the one at s on. None if no checkpoint covers the entry the problem points at. Raises LedgerError if the
    rows cannot be read."""
    first = next(rows, None)
    if first is None:
        return None
    pointer = _pointer(m.start, s, code, first)
    # A signed root past the entry pointed at says whether it is still the entry signed; none later is needed.
    stop = min((c.size for c in m.checkpoints if c.size > pointer), default=None)
    if stop is None:
        return None
    out = bytearray(leaves)
    n = s
    sha = hashlib.sha256
    for _, _, raw in itertools.chain((first,), rows):
        if n >= stop:
            break
        out += sha(b"\x00" + raw).digest()
        n += 1
    return _Tail(pointer, out)


def _first_mismatch(m: Material, v: NoteVerifier, roots: _Roots, state: _State) -> tuple[int, int | None]:
    """Where the held entries first leave what was signed: (good, size), size the smallest checkpoint size in the
    held range whose signed root they no longer give (None if they give every one), good the largest checkpoint
    size below it whose root they still give (the range's start if none).

    Found by bisecting over the checkpoint sizes: a root at a size commits to every leaf below it, so the sizes
    whose roots match are a prefix. Only checkpoints the auditor's own key opens are evidence here (others are
    left out, and reported by the checks that need them): this runs before the key history is checked.
    """
    cands = sorted({c.size: c.note for c in m.checkpoints if roots.held(c.size)}.items())

    def agrees(i: int) -> bool | None:
        size, note = cands[i]
        try:
            cp = _open(note, v, size, state)
        except _Fail:
            return None
        return cp.root == roots.at(size) if cp.size == size else None

    lo, hi = 0, len(cands)
    while lo < hi:
        mid = (lo + hi) // 2
        agree = agrees(mid)
        if agree is None:
            del cands[mid]
            hi -= 1
        elif agree:
            lo = mid + 1
        else:
            hi = mid
    return (cands[lo - 1][0] if lo else roots.start), (cands[lo][0] if lo < len(cands) else None)


def _blame(m: Material, v: NoteVerifier, state: _State, f: _Fail) -> _Fail:
    """The scan problem f, settled against the signed checkpoints (module docstring, step 1). Never raises: without
    usable evidence f stands as found."""
    tail = state.tail
    if tail is None or f.seq is None:
        return f
    try:
        roots = _Roots(m, tail.leaves, m.start + len(tail.leaves) // 32)
        found = _first_mismatch(m, v, roots, state)
    except (_Fail, LedgerError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f
    good, size = found
    if size is None:
        return f  # the signed roots still vouch for the entry pointed at
    s, p = f.seq, tail.pointer
    if size <= p:
        # Signed entries before the one pointed at differ already (rewritten, and the chain re-linked up to s).
        state.end = min(state.end, good)
        return _Fail(good, "modified", f"entries after seq {good - 1} do not match the signed checkpoint at size"
                     f" {size} (further on, seq {s} {f.problem}: {f.message})")
    if good > p or p == s:
        return f
    state.end = min(state.end, p)
    if f.problem == "inserted":
        k = s - p
        return _Fail(p, "inserted", f"not the entry signed as seq {p} (the checkpoint at size {size} no longer"
                     f" matches): that entry now sits at seq {s}, pushed down by {k} entr{'y' if k == 1 else 'ies'}"
                     f" inserted from seq {p}")
    return _Fail(p, "modified", f"its bytes were changed and its stored hash recomputed: seq {s}'s prev is not"
                 f" its hash, and the checkpoint at size {size} no longer matches")


def _check_short(m: Material, v: NoteVerifier, roots: _Roots, state: _State) -> None:
    """The anchor lies beyond the held entries and cannot be reached: raise missing at the first entry a signed
    root in the held range no longer matches (some were removed and the rest renumbered; modified in a partial
    bundle, where they may as well have been inserted), else truncated at the first entry no signed root held
    covers."""
    assert roots.short is not None
    good, size = _first_mismatch(m, v, roots, state)
    if size is None:
        if good < roots.end:
            # Cut inside a batch: the entries of it still held are vouched for by no signature either.
            raise _Fail(good, "truncated", f"a signed checkpoint covers {roots.anchor} entries but only {roots.end}"
                        f" are present, and none held covers those from seq {good} on")
        raise roots.short
    if m.right:
        # The hashes after a partial range were cut for its end as exported: fewer entries or more, nothing says.
        code, held, what = "modified", "the held entries with the hashes after them", "removed or inserted"
    else:
        code, held, what = "missing", "the held entries", "removed"
    raise _Fail(good, code, f"entries after seq {good - 1} do not match the signed checkpoint at size {size}, and"
                f" {held} do not reach the latest one (size {roots.anchor}): entries were {what} at or after seq"
                f" {good} and the rest renumbered")


def _first_fail(check: Callable[..., None], *args: Any) -> _Fail | None:
    try:
        check(*args)
    except _Fail as f:
        return f
    return None


def _trusted_size(note: str | None) -> int | None:
    """The size of a trusted checkpoint, if it parses (its checks come later, with their own errors)."""
    try:
        return peek_checkpoint(note).size if note is not None else None
    except LedgerError:
        return None


def _check_blobs(m: Material, refs: list[tuple[int, str, str]]) -> None:
    for seq, name, digest in refs:
        problem = m.blob_problem(digest)
        if problem is not None:
            raise _Fail(seq, "blob_mismatch", f"blob {name!r} ({digest[:12]}…) {problem}")


class _Roots:
    """Tree roots at the sizes the checks need: inside the held range, and at the anchor."""

    def __init__(self, m: Material, leaves: bytearray, end: int, tree: MerkleTree | None = None,
                 also: int | None = None) -> None:
        """`also`: one more size to hold the root of (a trusted checkpoint's, which the bundle may not carry)."""
        self.start, self.end = m.start, end
        sizes = sorted({c.size for c in m.checkpoints if m.start <= c.size <= end}
                       | ({also} if also is not None and m.start <= also <= end else set()))
        largest = max((c.size for c in m.checkpoints), default=0)
        self.anchor = m.anchor if m.anchor is not None else largest
        self._at: dict[int, bytes] = {}
        self._tree: MerkleTree | None = None
        if m.start == 0:
            self._tree = tree if tree is not None else MerkleTree.from_leaf_hashes(leaves)
            frontier: Frontier | None = None
        else:
            frontier = Frontier(m.start, m.left)
            want = iter(sizes)
            nxt = next(want, None)
            if nxt == m.start:
                self._at[nxt] = frontier.root()
                nxt = next(want, None)
            mv = memoryview(leaves)
            for i in range(0, len(leaves), 32):
                frontier.append_leaf(bytes(mv[i : i + 32]))
                if frontier.size == nxt:
                    self._at[nxt] = frontier.root()
                    nxt = next(want, None)
            mv.release()
        self.anchor_root: bytes | None = None
        self.short: _Fail | None = None  # the anchor lies beyond the held entries and cannot be reached
        if self.anchor <= end:
            return
        # The anchor lies beyond the held entries: the right compact range must bridge the gap.
        if frontier is None:
            assert self._tree is not None
            frontier = Frontier(end, _prefix_nodes(self._tree, end))
        try:
            frontier.extend(end, self.anchor, m.right)
        except ProofError:
            # Raised by _check_short, after the roots inside the held range had their say.
            self.short = _Fail(
                end, "truncated", f"a signed checkpoint covers {self.anchor} entries but only {end} are present"
            )
            return
        self.anchor_root = frontier.root()

    def held(self, size: int) -> bool:
        return self.start <= size <= self.end

    def at(self, size: int) -> bytes:
        if self._tree is not None:
            return self._tree.root(size)
        return self._at[size]


def _prefix_nodes(tree: MerkleTree, size: int) -> list[bytes]:
    return compact_range(tree, 0, size)


def _schedule(m: Material, anchor_key: NoteVerifier, leaves: bytearray, held: list[Rotation]) -> KeySchedule:
    rotations = list(held)
    for item in m.key_history:
        try:
            rot = rotation_in(item.seq, item.raw)
        except RotationError as e:
            raise _Fail(item.seq, "malformed", e.diagnostics()) from e
        if rot is None:
            raise _Fail(item.seq, "malformed", "key history item is not a key rotation entry")
        if m.start <= item.seq < m.start + len(leaves) // 32:
            # Inside the held range it must be the held entry itself.
            i = (item.seq - m.start) * 32
            if leaf_hash(item.raw) != bytes(leaves[i : i + 32]):
                raise _Fail(item.seq, "modified", "key history entry differs from the held entry")
            continue
        rotations.append(rot)
    rotations.sort(key=lambda r: r.seq)
    try:
        schedule = KeySchedule.build(anchor_key, rotations)
    except RotationError as e:
        raise _Fail(None, "unknown_key", e.diagnostics()) from e
    if not schedule.holds(anchor_key):
        raise _Fail(None, "unknown_key", f"public key {anchor_key.key_id.hex()} is not in this ledger's key history")
    return schedule


def _open(note: str, key: NoteVerifier, size: int, state: _State | None = None) -> Checkpoint:
    try:
        by = state.opened_by if state is not None else None
        # The same key: name and public key (the key id follows from them), without formatting vkeys.
        if state is not None and by is not None and (key.name, key.public_key) == (by.name, by.public_key):
            got = state.opened.get(note)
            if isinstance(got, Checkpoint):
                return got
            if got is not None:
                raise got
        return open_checkpoint(note, key)
    except BadSignature as e:
        raise _Fail(None, "bad_signature", f"checkpoint at size {size}: {e.diagnostics()}") from e
    except UnknownKey as e:
        raise _Fail(None, "unknown_key", f"checkpoint at size {size}: {e.diagnostics()}") from e
    except (MalformedNote, LedgerError) as e:
        raise _Fail(None, "malformed", f"checkpoint at size {size}: {e.diagnostics()}") from e


def _check_checkpoints(m: Material, schedule: KeySchedule, roots: _Roots, state: _State | None = None) -> int:
    end, anchor = roots.end, roots.anchor
    # 1. Signatures, each under the key of its epoch.
    opened: list[tuple[int, Checkpoint, list[bytes] | None]] = []
    for rec in sorted(m.checkpoints, key=lambda c: c.size):
        cp = _open(rec.note, schedule.key_for(rec.size), rec.size, state)
        if cp.size != rec.size:
            raise _Fail(None, "malformed", f"checkpoint stored under size {rec.size} is for size {cp.size}")
        opened.append((rec.size, cp, rec.consistency))
    sizes = {s for s, _, _ in opened}
    notes = {rec.size: rec.note for rec in m.checkpoints}
    # 2. Every rotation is endorsed by the previous key at exactly seq + 1, and that checkpoint is
    # cosigned by the announced key: otherwise anyone could end a ledger of their own with an entry
    # "rotating" to the auditor's public key and pass without one signature of it.
    for i, b in enumerate(schedule.bounds):
        if b not in sizes:
            raise _Fail(b - 1, "unknown_key", "key rotation is not covered by a checkpoint of the previous key")
        try:
            _open(notes[b], schedule.keys[i + 1], b, state)
        except _Fail as f:
            raise _Fail(b - 1, f.problem, f"key rotation is not cosigned by the key it announces: {f.message}") from f
    if anchor and anchor not in sizes:
        raise _Fail(None, "malformed", f"no checkpoint at the anchor size {anchor}")
    if anchor < roots.start:
        # A partial bundle whose anchor lies before its entries: not one of them is signed, and
        # there is no root at the anchor to check the other checkpoints against.
        raise _Fail(
            roots.start, "inserted", f"entries from seq {roots.start} on are not covered by any signed checkpoint"
        )
    anchor_root = roots.anchor_root
    if anchor_root is None:
        anchor_root = roots.at(anchor)  # at 0 the empty root, which no checkpoint past 0 is consistent with
    # 3. Roots: rebuilt inside the held range, by consistency proof outside it. Those inside first, in order:
    # they name the first entry that differs; the ones outside only say that something in the range does.
    def outside(size: int) -> bool:
        return not roots.held(size) or (size == anchor and roots.anchor_root is not None)

    good = roots.start
    for size, cp, proof in sorted(opened, key=lambda o: (outside(o[0]), o[0])):
        if size == anchor and roots.anchor_root is not None:
            if cp.root != anchor_root:
                raise _Fail(good if good < end else None, "modified", f"the held entries from seq {good} on, or the"
                            f" hashes beside them, do not give the root signed at size {size}")
        elif roots.held(size):
            if cp.root != roots.at(size):
                if end > anchor:
                    # More entries than were ever signed, and from here on not those signed: the insertion
                    # is here, not at the anchor where the surplus shows.
                    raise _Fail(good, "inserted", f"entries after seq {good - 1} do not match the signed checkpoint"
                                f" at size {size}, and the ledger holds {end - anchor} more than the latest checkpoint"
                                f" signed: entries were inserted at or after seq {good} and the rest renumbered")
                raise _Fail(
                    good if good < end else None,
                    "modified",
                    f"entries after seq {good - 1} do not match the signed checkpoint at size {size}",
                )
            good = size
        else:
            if proof is None or not verify_consistency(size, anchor, proof, cp.root, anchor_root):
                raise _Fail(good if good < end else None, "modified", f"checkpoint at size {size} is not consistent"
                            f" with size {anchor}: the held entries from seq {good} on, or the hashes beside them,"
                            " differ from those signed")
    if end > anchor:
        raise _Fail(anchor, "inserted", f"entries from seq {anchor} on are not covered by any signed checkpoint")
    # 4. Key history items outside the range are leaves of the anchor tree.
    for item in m.key_history:
        if roots.held(item.seq) and item.seq < end:
            continue
        if not verify_inclusion(item.seq, anchor, leaf_hash(item.raw), item.inclusion, anchor_root):
            raise _Fail(item.seq, "modified", "key rotation entry is not in the signed tree")
    return len(opened)


def _check_trusted(note: str, schedule: KeySchedule, roots: _Roots, v: NoteVerifier) -> int:
    try:
        cp = peek_checkpoint(note)
    except LedgerError as e:
        raise TrustedCheckpointError(f"trusted checkpoint is malformed: {e.diagnostics()}") from e
    if cp.origin != v.name:
        raise TrustedCheckpointError(f"trusted checkpoint is from ledger {cp.origin!r}, not {v.name!r}")
    key = schedule.key_for(cp.size)
    try:
        open_checkpoint(note, key)
    except LedgerError as e:
        if key.vkey != v.vkey and _signed_by(note, v):
            # Genuine under the auditor's own key, yet the ledger now names another key for that
            # size: its key history was rewritten (e.g. a rotation inserted before it and re-signed).
            raise _Fail(
                None,
                "modified",
                f"history rewritten: the trusted checkpoint at size {cp.size} is signed by the auditor's key,"
                f" but this ledger's key history assigns that size to key {key.key_id.hex()}",
            ) from e
        raise TrustedCheckpointError(
            f"trusted checkpoint at size {cp.size} is not signed by this ledger's key for that size: {e.diagnostics()}"
        ) from e
    anchor = roots.anchor
    if cp.size > anchor:
        raise _Fail(
            anchor, "truncated", f"the trusted checkpoint covers {cp.size} entries but the ledger now has {anchor}"
        )
    if cp.size == anchor:
        have = roots.anchor_root if roots.anchor_root is not None else roots.at(anchor)
    elif roots.held(cp.size):
        have = roots.at(cp.size)
    elif cp.size == 0:
        have = cp.root
    elif cp.size < roots.start:
        raise TrustedCheckpointError(
            f"trusted checkpoint (size {cp.size}) lies before this bundle's entries (from seq {roots.start});"
            f" export from --from-seq {max(cp.size - 1, 0)} or earlier"
        )
    else:
        raise TrustedCheckpointError(
            f"trusted checkpoint (size {cp.size}) lies after this bundle's entries (up to seq {roots.end - 1});"
            f" export up to --to-seq {cp.size - 1} or later"
        )
    if have != cp.root:
        raise _Fail(
            None, "modified", f"history rewritten: the tree at size {cp.size} differs from the trusted checkpoint"
        )
    return cp.size


def _signed_by(note: str, v: NoteVerifier) -> bool:
    try:
        open_checkpoint(note, v)
    except LedgerError:
        return False
    return True


# -- a key history given by the auditor ---------------------------------------------------------------------


def verify_with_history(
    m: Material,
    keys: list[NoteVerifier],
    *,
    anchor_note: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    deep: bool = False,
    trusted: str | None = None,
) -> Verdict:
    """verify_material under the auditor's keys, oldest first (one vkey, or a key history such as ledger.vkeys).

    1. The check is anchored on the newest of keys that signs the ledger's latest checkpoint (anchor_note,
       else m's largest: a bundle's checkpoints are read only after its entries), else on the newest of keys;
       steps 3-4 then follow the ledger's own rotations from it, as with one key.
    2. A verdict of unknown_key that names no entry, where not one checkpoint of m carries a valid signature
       of any of keys, comes back as untrusted_key: signed by a key not in the history given.
    Raises ValueError for no keys, TrustedCheckpointError as verify_material does.
    """
    if not keys:
        raise ValueError("no verifier key given")
    if anchor_note is None and m.checkpoints:
        anchor_note = max(m.checkpoints, key=lambda c: c.size).note
    key = next((k for k in reversed(keys) if anchor_note is not None and _signed_by(anchor_note, k)), keys[-1])
    verdict = verify_material(m, key, progress=progress, deep=deep, trusted=trusted)
    if verdict.problem != "unknown_key" or verdict.first_bad_seq is not None:
        return verdict
    if any(_signed_by(c.note, k) for c in m.checkpoints for k in keys):
        return verdict  # a key given signs part of it: the rest is signed by a key the ledger does not account for
    signers = sorted({i for c in m.checkpoints for i in signature_key_ids(c.note)})
    given = ", ".join(k.key_id.hex() for k in keys)
    return Verdict(
        False, verdict.size, None, "untrusted_key",
        f"untrusted_key: signed by a key not in the history you gave (its checkpoints carry key"
        f" {', '.join(signers) or 'none'}; you gave {given}). Not a finding of tampering: after a rotate-key, give"
        " the ledger's key history (<data-dir>/keys/ledger.vkeys); otherwise ask its operators which key signs it",
        origin=verdict.origin, start=verdict.start,
    )
