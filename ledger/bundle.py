"""Export bundles: one self-contained file an auditor verifies offline with a public key.

Format ``jobgate-ledger-bundle/1`` — UTF-8 lines, each ending in LF, in this order:

1. header (JSON): ``{"format", "origin", "from_seq", "to_seq", "tree_size", "keys", "exported_at"}``;
   ``tree_size`` is the size S of the anchor checkpoint (the latest at export time), ``keys`` the
   key history (vkeys, oldest first) — informational: trust comes from the auditor's own key.
2. one line per entry, seq ``from_seq``..``to_seq``: ``<seq> <hex sha256> <entry bytes>``. RFC 8785
   bytes never contain a raw LF, so the stored bytes appear verbatim.
3. one line per blob referenced by those entries: ``{"blob": <hex sha256>, "data": <base64>}``.
4. one line per checkpoint: ``{"checkpoint": <size>, "note": <signed note>, "consistency": [b64…]|null}``
   — every checkpoint for a full export; for a partial one those inside the range, the anchor, the
   key-rotation checkpoints and the last one before the range. Those outside the range carry an
   RFC 9162 consistency proof to the anchor.
5. trailer (JSON): ``{"end": "jobgate-ledger-bundle/1", "entries", "blobs", "checkpoints", "left",
   "right", "key_history"}``: counts, the compact ranges [0, from_seq) and [to_seq+1, S) as base64
   hashes (ledger/compact.py), and the key-rotation entries outside the range, each with its
   inclusion proof in the anchor tree. A file without this last line is truncated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ledger.compact import compact_range
from ledger.errors import BundleError
from ledger.merkle import HASH_SIZE, MerkleTree
from ledger.note import peek_checkpoint
from ledger.rotation import ROTATION_MARK, Rotation, rotation_in
from ledger.store import LedgerStore
from ledger.verify import CheckpointRecord, KeyHistoryItem, Material

FORMAT = "jobgate-ledger-bundle/1"
_CHUNK = 8 << 20
_TRAILER_MAX = 64 << 20
_ANCHOR_LINE_MAX = 64 << 10  # a checkpoint line: a note of a few signatures and a consistency proof


@dataclass(frozen=True)
class BundleHeader:
    origin: str
    from_seq: int
    to_seq: int  # inclusive; from_seq - 1 for an empty bundle
    tree_size: int
    keys: list[str]
    exported_at: str


@dataclass(frozen=True)
class ExportSummary:
    path: str
    origin: str
    from_seq: int
    to_seq: int
    tree_size: int
    entries: int
    blobs: int
    checkpoints: int
    keys: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _b64(hashes: list[bytes]) -> list[str]:
    return [base64.b64encode(h).decode() for h in hashes]


def export_bundle(
    store: LedgerStore,
    out: Path,
    *,
    from_seq: int = 0,
    to_seq: int | None = None,
    keys: list[str] | None = None,
    exported_at: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Write a bundle of entries from_seq..to_seq (default: all) to out, atomically.

    Raises BundleError for an out-of-range request or an unwritable file, StoreError on read errors.
    """
    cps = store.checkpoints()
    anchor = cps[-1][0] if cps else 0
    origin = peek_checkpoint(cps[-1][1]).origin if cps else ""
    end = anchor if to_seq is None else to_seq + 1
    if from_seq < 0 or (to_seq is not None and to_seq < from_seq) or end > anchor or from_seq > max(end - 1, 0):
        raise BundleError(
            f"range {from_seq}..{'end' if to_seq is None else to_seq} is outside the ledger's"
            f" signed entries 0..{anchor - 1}"
        )
    partial = from_seq > 0 or end < anchor
    leaves = bytearray()
    rotations: list[Rotation] = []
    raws: dict[int, bytes] = {}
    digests: set[str] = set()
    sha = hashlib.sha256
    tmp = out.with_name(out.name + ".tmp")
    n = 0
    try:
        with open(tmp, "wb") as f:
            header = {
                "format": FORMAT,
                "origin": origin,
                "from_seq": from_seq,
                "to_seq": end - 1,
                "tree_size": anchor,
                "keys": [],
                "exported_at": exported_at,
            }
            # Entries go to a scratch file first: the header's key list is known only after the scan.
            body = open(tmp.with_name(tmp.name + ".entries"), "w+b")  # noqa: SIM115
            try:
                for expect, (seq, h, data) in enumerate(store.iter_entries(0)):
                    if seq != expect or seq >= anchor:
                        break
                    if partial:
                        leaves += sha(b"\x00" + data).digest()
                    if ROTATION_MARK in data:
                        rot = rotation_in(seq, data)
                        if rot is not None:
                            rotations.append(rot)
                            raws[seq] = data
                    if from_seq <= seq < end:
                        body.write(b"%d %s %s\n" % (seq, h.encode(), data))
                        if not data.startswith(b'{"blobs":{}'):
                            _collect_digests(data, digests)
                        n += 1
                        if progress is not None and n % 16384 == 0:
                            progress(n, end - from_seq)
                if partial and len(leaves) // HASH_SIZE < anchor:
                    raise BundleError(f"the store holds fewer entries than its checkpoint of size {anchor}")
                if keys is None or rotations:
                    keys = ([rotations[0].previous.vkey] if rotations else []) + [r.new.vkey for r in rotations]
                header["keys"] = keys
                f.write(json.dumps(header).encode() + b"\n")
                entries_start = f.tell()
                body.seek(0)
                while chunk := body.read(_CHUNK):
                    f.write(chunk)
                entries_end = f.tell()
            finally:
                body.close()
                os.unlink(body.name)
            n_blobs = 0
            for d in sorted(digests):
                blob = store.get_blob(d)
                if blob is not None:
                    f.write(json.dumps({"blob": d, "data": base64.b64encode(blob).decode()}).encode() + b"\n")
                    n_blobs += 1
            tree = MerkleTree.from_leaf_hashes(leaves) if partial else None
            chosen = _choose_checkpoints(cps, from_seq, end, anchor, rotations, partial)
            for size, note in chosen:
                proof = None
                if tree is not None and not from_seq <= size <= end and size != anchor:
                    proof = _b64(tree.consistency_proof(size, anchor))
                f.write(json.dumps({"checkpoint": size, "note": note, "consistency": proof}).encode() + b"\n")
            history = []
            if tree is not None:
                for r in rotations:
                    if not from_seq <= r.seq < end:
                        raw = raws[r.seq]
                        history.append(
                            {
                                "seq": r.seq,
                                "entry": raw.decode("utf-8", "surrogateescape"),
                                "inclusion": _b64(tree.inclusion_proof(r.seq, anchor)),
                            }
                        )
            trailer = {
                "end": FORMAT,
                "entries": n,
                "entries_bytes": [entries_start, entries_end],
                "blobs": n_blobs,
                "checkpoints": len(chosen),
                "left": _b64(compact_range(tree, 0, from_seq)) if tree is not None else [],
                "right": _b64(compact_range(tree, end, anchor)) if tree is not None else [],
                "key_history": history,
            }
            f.write(json.dumps(trailer).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write bundle {out}: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if progress is not None:
        progress(n, n)
    return ExportSummary(str(out), origin, from_seq, end - 1, anchor, n, n_blobs, len(chosen), len(keys))


def _collect_digests(data: bytes, into: set[str]) -> None:
    try:
        blobs = json.loads(data).get("blobs")
    except (ValueError, AttributeError):
        return
    if isinstance(blobs, dict):
        into.update(d for d in blobs.values() if isinstance(d, str))


def _choose_checkpoints(
    cps: list[tuple[int, str]], lo: int, hi: int, anchor: int, rotations: list[Rotation], partial: bool
) -> list[tuple[int, str]]:
    if not partial:
        return cps
    needed = {r.seq + 1 for r in rotations} | {anchor}
    before = [s for s, _ in cps if s < lo]
    if before:
        needed.add(before[-1])
    return [(s, note) for s, note in cps if lo <= s <= hi or s in needed]


# -- reading ----------------------------------------------------------------------------------


def _json_line(line: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise BundleError(f"bundle is corrupt: {what} is not JSON") from e
    if not isinstance(value, dict):
        raise BundleError(f"bundle is corrupt: {what} is not a JSON object")
    return value


def _hashes(value: Any, what: str) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise BundleError(f"bundle is corrupt: {what} is not a list of base64 hashes")
    try:
        out = [base64.b64decode(h, validate=True) for h in value]
    except (binascii.Error, ValueError) as e:
        raise BundleError(f"bundle is corrupt: {what} holds bad base64") from e
    if any(len(h) != HASH_SIZE for h in out):
        raise BundleError(f"bundle is corrupt: {what} holds a hash that is not 32 bytes")
    return out


def _int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise BundleError(f"bundle is corrupt: {what} is not a non-negative integer")
    return value


def _read_trailer(f: IO[bytes]) -> tuple[bytes, int]:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
        raise BundleError("bundle is empty")
    want = 1 << 16
    while True:
        start = max(0, size - want)
        f.seek(start)
        tail = f.read(size - start)
        if not tail.endswith(b"\n"):
            raise BundleError("bundle is truncated (it does not end with its trailer line)")
        cut = tail.rfind(b"\n", 0, len(tail) - 1)
        if cut >= 0:
            return tail[cut + 1 : -1], start + cut + 1
        if start == 0:
            return tail[:-1], 0
        if want >= _TRAILER_MAX:
            raise BundleError("bundle trailer is too large")
        want *= 4


def open_bundle(path: Path) -> tuple[BundleHeader, Material, IO[bytes]]:
    """Parse header and trailer; the Material streams entries, blobs and checkpoints from the file.

    The caller closes the returned file. Raises BundleError for anything that is not a well-formed
    bundle (integrity problems inside well-formed lines are the verifier's job).
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the caller after verification
    except OSError as e:
        raise BundleError(f"cannot read bundle {path}: {e.strerror or e}") from e
    try:
        return _open(f)
    except BaseException:
        f.close()
        raise


def _open(f: IO[bytes]) -> tuple[BundleHeader, Material, IO[bytes]]:
    try:
        last, trailer_at = _read_trailer(f)
        try:
            trailer = _json_line(last, "trailer")
        except BundleError as e:
            raise BundleError("bundle is truncated or corrupt (its last line is not the trailer)") from e
        f.seek(0)
        first = f.readline(1 << 20)
    except OSError as e:
        raise BundleError(f"cannot read bundle: {e.strerror or e}") from e
    if not first.endswith(b"\n"):
        raise BundleError("not a jobgate ledger bundle (no header line)")
    head = _json_line(first, "header")
    if head.get("format") != FORMAT:
        raise BundleError(f"not a jobgate ledger bundle (format {str(head.get('format'))[:40]!r}, expected {FORMAT})")
    if trailer.get("end") != FORMAT:
        raise BundleError("bundle is truncated or corrupt (its last line is not the trailer)")
    origin = head.get("origin")
    keys = head.get("keys")
    if not isinstance(origin, str) or not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise BundleError("bundle is corrupt: header lacks origin or keys")
    header = BundleHeader(
        origin,
        _int(head.get("from_seq"), "from_seq"),
        head["to_seq"] if type(head.get("to_seq")) is int else -2,
        _int(head.get("tree_size"), "tree_size"),
        keys,
        str(head.get("exported_at", "")),
    )
    if header.to_seq < header.from_seq - 1:
        raise BundleError("bundle is corrupt: to_seq is before from_seq")
    n_entries = _int(trailer.get("entries"), "entry count")
    n_blobs = _int(trailer.get("blobs"), "blob count")
    n_cps = _int(trailer.get("checkpoints"), "checkpoint count")
    miscount = None
    if n_entries != header.to_seq - header.from_seq + 1:
        # Said only if the entry lines verify: lines edited with the trailer's count are tampering (verify.py).
        miscount = (
            f"the header's range holds {header.to_seq - header.from_seq + 1} entries, the trailer says {n_entries}"
        )
    history = []
    items = trailer.get("key_history")
    if not isinstance(items, list):
        raise BundleError("bundle is corrupt: key_history is not a list")
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("entry"), str):
            raise BundleError("bundle is corrupt: bad key_history item")
        try:
            # The exporter escapes non-UTF-8 bytes as U+DC80..U+DCFF; any other lone surrogate is junk.
            raw = it["entry"].encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as e:
            raise BundleError("bundle is corrupt: a key_history entry is not UTF-8 text") from e
        history.append(
            KeyHistoryItem(
                _int(it.get("seq"), "key_history seq"),
                raw,
                _hashes(it.get("inclusion"), "key_history inclusion proof"),
            )
        )
    blobs: dict[str, str | None] = {}
    checkpoints: list[CheckpointRecord] = []

    def rest() -> None:
        """Read the blob and checkpoint sections, then insist on the trailer and end of file."""
        for i in range(n_blobs):
            line = _next_line(f, f"blob {i + 1} of {n_blobs}")
            b = _json_line(line, "blob line")
            d, data = b.get("blob"), b.get("data")
            if not isinstance(d, str) or not isinstance(data, str):
                raise BundleError("bundle is corrupt: blob line lacks blob/data")
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError) as e:
                raise BundleError("bundle is corrupt: blob data is not base64") from e
            blobs[d] = None if hashlib.sha256(raw).hexdigest() == d else "does not match its digest"
        for i in range(n_cps):
            c = _json_line(_next_line(f, f"checkpoint {i + 1} of {n_cps}"), "checkpoint line")
            note = c.get("note")
            if not isinstance(note, str):
                raise BundleError("bundle is corrupt: checkpoint line lacks note")
            proof = c.get("consistency")
            checkpoints.append(
                CheckpointRecord(
                    _int(c.get("checkpoint"), "checkpoint size"),
                    note,
                    None if proof is None else _hashes(proof, "consistency proof"),
                )
            )
        _next_line(f, "trailer")
        if f.read(1):
            raise BundleError("bundle is corrupt: data after the trailer")

    span = trailer.get("entries_bytes")
    if not (isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span)):
        raise BundleError("bundle is corrupt: trailer lacks the entries' byte range")
    start, end = span
    if start != len(first) or not start <= end <= trailer_at or (n_entries == 0) != (start == end):
        raise BundleError("bundle is corrupt: the entries' byte range does not fit the file")
    if end > start:
        f.seek(end - 1)
        if f.read(1) != b"\n":
            raise BundleError("bundle is corrupt: the entries' byte range does not end at a line end")

    def after_entries() -> None:
        f.seek(end)
        rest()

    material = Material(
        entries=(),
        total=n_entries,
        bundle_path=str(Path(f.name)),
        entries_span=(start, end),
        after_entries=after_entries,
        checkpoints=checkpoints,
        blob_problem=lambda d: blobs.get(d, "is missing"),
        start=header.from_seq,
        left=_hashes(trailer.get("left"), "left hashes"),
        anchor=header.tree_size,
        right=_hashes(trailer.get("right"), "right hashes"),
        key_history=history,
        miscount=miscount,
    )
    return header, material, f


def _next_line(f: IO[bytes], what: str) -> bytes:
    line = f.readline(_TRAILER_MAX)
    if not line.endswith(b"\n"):
        raise BundleError(f"bundle is truncated: {what} is missing")
    return line[:-1]


def anchor_note(path: Path) -> str | None:
    """The note of a bundle's last checkpoint line (its anchor: the latest signed, written just before the
    trailer), read from the end of the file; None where there is none to read. Unchecked: it only chooses which
    of the auditor's keys the verification starts from, and the verifier checks every signature."""
    try:
        with open(path, "rb") as f:
            _, trailer_at = _read_trailer(f)
            f.seek(max(0, trailer_at - _ANCHOR_LINE_MAX))
            before = f.read(trailer_at - f.tell())
    except (OSError, BundleError):
        return None
    line = before[before.rfind(b"\n", 0, len(before) - 1) + 1 : -1]
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    note = value.get("note") if isinstance(value, dict) and "checkpoint" in value else None
    return note if isinstance(note, str) else None
