"""The verifier's hot loop over bundle entry lines (``<seq> <hex sha256> <entry bytes>``), optionally
split across processes.

Per entry the format forces two SHA-256 passes over the bytes (the entry hash for the chain and
the RFC 6962 leaf hash), so the rest is kept to a few slice comparisons: the canonical tail
``,"prev":"<64 hex>","seq":<n>,"time":"<27 chars>"}`` sits at a fixed distance from the end. Entries
that do not take this fast path (blobs, key rotations, anything unusual, or all under deep=True)
are parsed and checked in full, exactly as for a store. A bundle's entries section is split at
line boundaries into byte ranges, many more than worker processes, that the workers take in turn
and scan independently (hashlib holds the GIL for inputs this small, so threads would not help);
the parent stitches them: each range's first ``prev`` must be the previous range's last hash, and a
range that does not join cleanly is scanned again in the parent (ledger/verify.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import rfc8785

from ledger.entry import HEX64_RE, ZERO_HASH, field_problem
from ledger.merkle import subtree_levels
from ledger.rotation import ROTATION_KIND

_EMPTY_HEAD = b'{"blobs":{},"body":{'
_ROTATION_TAIL = b',"kind":"' + ROTATION_KIND.encode() + b'"'
_HEAD_FMT = b"%d %s " + _EMPTY_HEAD
_TAIL_FMT = b',"prev":"%s","seq":%d,"time":"%s'
_TIME_END = re.compile(rb'[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z"\}')
_CHUNK = 8 << 20
PARALLEL_MIN_ENTRIES = 20_000
TASKS_PER_WORKER = 16
TASK_MIN_BYTES = 4 << 20


@dataclass
class Part:
    """What one scan of a run of entry lines found."""

    first_seq: int
    count: int = 0
    first_prev: str | None = None  # the first entry's own prev field (for stitching)
    last_hash: str = ""
    leaves: bytearray = field(default_factory=bytearray)
    problem: tuple[int, str, str] | None = None  # (seq, code, message); code "corrupt" = not a bundle line
    rotations: list[tuple[int, bytes]] = field(default_factory=list)
    blob_refs: list[tuple[int, str, str]] = field(default_factory=list)
    levels: list[tuple[int, int, bytes]] = field(default_factory=list)  # subtree_levels, from workers


class _Stop(Exception):
    pass


def _slow(raw: bytes, seq: int, prev: str | None, part: Part) -> None:
    """Full checks of one entry (parse, fields, RFC 8785 bytes); records blobs and rotations."""
    try:
        value: Any = json.loads(raw)
    except (ValueError, RecursionError) as e:
        part.problem = (seq, "malformed", f"entry is not valid JSON ({type(e).__name__})")
        raise _Stop from e
    if prev is None:
        p = value.get("prev") if isinstance(value, dict) else None
        prev = p if isinstance(p, str) and HEX64_RE.fullmatch(p) else ZERO_HASH
        part.first_prev = prev
    problem = field_problem(value, seq, prev)
    if problem is not None:
        part.problem = (seq, *problem)
        raise _Stop
    try:
        canonical = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as e:
        part.problem = (seq, "malformed", "entry is not I-JSON")
        raise _Stop from e
    if canonical != raw:
        part.problem = (seq, "malformed", "entry bytes are not RFC 8785 canonical JSON")
        raise _Stop
    part.blob_refs.extend((seq, name, d) for name, d in sorted(value["blobs"].items()))
    if value["kind"] == ROTATION_KIND:
        part.rotations.append((seq, raw))


def scan_lines(lines: Iterable[bytes], part: Part, prev: str | None, deep: bool) -> str | None:
    """scan_buffer() over separate lines (without their LF)."""
    buf = b"".join(line + b"\n" for line in lines)
    return scan_buffer(buf, 0, len(buf), part, prev, deep)


def scan_buffer(buf: bytes | bytearray, pos: int, end: int, part: Part, prev: str | None, deep: bool) -> str | None:
    """Check the entry lines in buf[pos:end] (each ending in LF) continuing part (seq
    part.first_seq + part.count, after the entry hashed prev).

    Works on offsets into the read buffer: no per-line copies, only the hashes are new objects.
    prev None means the previous entry is not held (a range's first line): the first entry's own
    prev is taken and recorded for stitching. Returns the last entry's hash; sets part.problem and
    stops at the first problem.
    """
    sha = hashlib.sha256
    new_entry = sha().copy
    new_leaf = sha(b"\x00").copy
    find = buf.find
    startswith = buf.startswith
    mv = memoryview(buf)
    seq = part.first_seq + part.count
    prev_b = prev.encode() if prev is not None else None
    leaves: list[bytes] = []
    append = leaves.append
    # The last time field (with its closing '"}') seen valid; a batch shares one. At first none: an
    # LF, which no line holds, so the first line's time is checked in full.
    last_time = b"\n"
    head_n = len(_EMPTY_HEAD)
    ndig = len(str(seq))  # digits of seq, kept up to date below
    next_pow = 10**ndig
    # A line this long has room for head, rotation tail and tail apart: 2 * ndig + 234 bytes.
    fast_len = 2 * ndig + 214 + head_n
    try:
        while pos < end:
            nl = find(b"\n", pos, end)
            if nl < 0:
                nl = end
            if seq >= next_pow:
                ndig += 1
                next_pow *= 10
                fast_len += 2
            rs = pos + ndig + 66
            raw = mv[rs:nl]
            h = new_entry()
            h.update(raw)
            digest_b = h.hexdigest().encode()
            # One test for the usual entry: "<seq> <its hash> " then the empty-blobs head, and the
            # tail ,"prev":"<previous hash>","seq":<seq>,"time":"<a time already checked>"} at the
            # line end; not a key rotation; head and tail apart. Anything else gets every check
            # below, in order, so the verdict (first problem) is the same either way.
            if (
                deep
                or nl - pos < fast_len
                or prev_b is None
                or not startswith(_HEAD_FMT % (seq, digest_b), pos)
                or not startswith(_TAIL_FMT % (prev_b, seq, last_time), nl - ndig - 119)
                or startswith(_ROTATION_TAIL, nl - ndig - 148)
            ):
                last_time = _check_line(buf, pos, nl, seq, ndig, digest_b, prev_b, last_time, deep, part)
            h = new_leaf()
            h.update(raw)
            append(h.digest())
            prev_b = digest_b
            seq += 1
            pos = nl + 1
    except _Stop:
        pass
    finally:
        mv.release()
    part.leaves += b"".join(leaves)
    part.count += len(leaves)
    if prev_b is not None:
        part.last_hash = prev_b.decode()
    return part.last_hash or None


def _check_line(
    buf: bytes | bytearray,
    pos: int,
    nl: int,
    seq: int,
    ndig: int,
    digest_b: bytes,
    prev_b: bytes | None,
    last_time: bytes,
    deep: bool,
    part: Part,
) -> bytes:
    """Every check of one entry line, in order (the line digest_b hashes its entry bytes to);
    returns the time field to reuse, or sets part.problem and raises _Stop."""
    startswith = buf.startswith
    hs = pos + ndig + 1
    rs = hs + 65
    if not startswith(b"%d " % seq, pos):
        sp = buf.find(b" ", pos, min(pos + 21, nl))
        got = bytes(buf[pos:sp])
        if sp <= pos or not got.isdigit():
            part.problem = (seq, "corrupt", f"entry line for seq {seq} is not '<seq> <hash> <entry>'")
        elif int(got) < seq:
            part.problem = (seq, "inserted", f"a line for seq {int(got)} appears again where entry {seq} belongs")
        elif buf.find(b"\n%d " % seq, nl) >= 0:  # (only on this failure path: a search of the rest of the lines)
            part.problem = (seq, "reordered", f"entry {seq} comes after entry {int(got)}")
        else:
            part.problem = (seq, "missing", f"entry {seq} is missing (the next stored entry is {int(got)})")
        raise _Stop
    if rs > nl or buf[rs - 1] != 32:
        part.problem = (seq, "corrupt", f"entry line for seq {seq} is not '<seq> <hash> <entry>'")
        raise _Stop
    if not startswith(digest_b, hs):
        part.problem = (seq, "modified", "stored hash does not match its bytes")
        raise _Stop
    t0 = nl - 29
    p0 = t0 - ndig - 90
    if (
        deep
        or prev_b is None
        or p0 - 29 < rs + len(_EMPTY_HEAD)
        or not startswith(_EMPTY_HEAD, rs)
        or not startswith(b',"prev":"%s","seq":%d,"time":"' % (prev_b, seq), p0)
        or _TIME_END.fullmatch(buf, t0, nl) is None
        or startswith(_ROTATION_TAIL, p0 - 29)
    ):
        _slow(bytes(buf[rs:nl]), seq, None if prev_b is None else prev_b.decode(), part)
        return last_time
    return bytes(buf[t0:nl])


def scan_rows(rows: Iterable[tuple[int, str, bytes]], part: Part, prev: str | None, deep: bool) -> str | None:
    """scan_lines() over a store's (seq, hash, bytes) rows."""
    sha = hashlib.sha256
    zero = sha(b"\x00")
    init = sha()
    time_end = _TIME_END.fullmatch
    seq = part.first_seq + part.count
    prev_b = prev.encode() if prev is not None else None
    leaves = bytearray()
    n = 0
    try:
        for got, stored, raw in rows:
            if got != seq:
                part.problem = (seq, "missing", f"entry {seq} is missing (the next stored entry is {got})")
                raise _Stop
            h = init.copy()
            h.update(raw)
            digest = h.hexdigest()
            if digest != stored:
                part.problem = (seq, "modified", "stored hash does not match its bytes")
                raise _Stop
            digest_b = digest.encode()
            digits = b"%d" % seq
            t0 = len(raw) - 29
            p0 = t0 - len(digits) - 90
            if (
                deep
                or prev_b is None
                or not raw.startswith(_EMPTY_HEAD)
                or raw[p0:t0] != b',"prev":"%s","seq":%s,"time":"' % (prev_b, digits)
                or time_end(raw, t0) is None
                or raw[p0 - 29 : p0] == _ROTATION_TAIL
            ):
                _slow(raw, seq, None if prev_b is None else prev_b.decode(), part)
            h = zero.copy()
            h.update(raw)
            leaves += h.digest()
            prev_b = digest_b
            seq += 1
            n += 1
    except _Stop:
        pass
    part.leaves += leaves
    part.count += n
    if prev_b is not None:
        part.last_hash = prev_b.decode()
    return part.last_hash or None


# -- ranges of a bundle file ------------------------------------------------------------------

_counter: Any = None


def _init(counter: Any) -> None:
    global _counter
    _counter = counter


def iter_buffers(f: Any, start: int, end: int) -> Iterable[tuple[bytearray, int, int]]:
    """The byte range [start, end) of file f as (buffer, a, b): buffer[a:b] holds whole lines, each
    ending in LF (a last line without one gets it added).

    One buffer is read into again and again (fresh memory for every chunk costs page faults), so
    it is only valid until the next step: the caller keeps copies, never views."""
    f.seek(start)
    left = end - start
    buf = bytearray(max(1, min(_CHUNK, left)))
    have = 0  # the start of a line carried over from the last read, at buf[:have]
    while left > 0:
        if have == len(buf):
            buf.extend(bytes(len(buf)))  # a line longer than the buffer
        with memoryview(buf) as mv:
            n = f.readinto(mv[have : have + min(len(buf) - have, left)])
        if not n:
            break
        left -= n
        stop = have + n
        cut = buf.rfind(b"\n", have, stop) + 1
        if cut:
            yield buf, 0, cut
            buf[: stop - cut] = buf[cut:stop]
            have = stop - cut
        else:
            have = stop
    if have:
        yield buf[:have] + b"\n", 0, have + 1


def scan_range(path: str, start: int, end: int, first_seq: int | None, prev: str | None, deep: bool) -> Part:
    """Scan the entry lines in bytes [start, end) of the bundle at path (run in a worker process)."""
    with open(path, "rb") as f:
        if first_seq is None:
            f.seek(start)
            head = f.read(min(32, end - start)) if end > start else b""
            sp = head.find(b" ")
            first_seq = int(head[:sp]) if sp > 0 and head[:sp].isdigit() else -1
        part = Part(first_seq)
        if first_seq < 0:
            part.problem = (0, "corrupt", "entry line does not start with a seq")
            return part

        for buf, a, b in iter_buffers(f, start, end):
            done = part.count
            prev = scan_buffer(buf, a, b, part, prev, deep)
            if _counter is not None:
                with _counter.get_lock():
                    _counter.value += part.count - done
            if part.problem is not None:
                break
    if part.problem is None:
        # The tree's interior, for this range's aligned subtrees: the parent only stitches.
        part.levels = subtree_levels(part.leaves, part.first_seq)
    return part


def split_points(path: str, start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """Cut [start, end) into about equal byte ranges at line boundaries."""
    cuts = [start]
    with open(path, "rb") as f:
        for i in range(1, parts):
            pos = start + (end - start) * i // parts
            if pos <= cuts[-1]:
                continue
            f.seek(pos)
            rest = f.read(1 << 20)
            nl = rest.find(b"\n")
            if nl < 0 or pos + nl + 1 >= end:
                break
            cuts.append(pos + nl + 1)
    cuts.append(end)
    return list(itertools.pairwise(cuts))


def workers_for(total: int) -> int:
    """How many processes to verify total entries with (JOBGATE_VERIFY_WORKERS overrides)."""
    env = os.environ.get("JOBGATE_VERIFY_WORKERS")
    if env is not None and env.isdigit():
        return max(1, int(env))
    if total < PARALLEL_MIN_ENTRIES or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return min(os.cpu_count() or 1, 8)


def tasks_for(workers: int, nbytes: int) -> int:
    """How many byte ranges to cut nbytes of entry lines into for workers processes: many more than
    workers for a large bundle, so a worker slowed by other load does not hold up the end (each
    takes the next range when it is free); one each for a small one."""
    return max(workers, min(workers * TASKS_PER_WORKER, nbytes // TASK_MIN_BYTES))


def scan_parallel(
    path: str,
    ranges: list[tuple[int, int]],
    workers: int,
    start_seq: int,
    prev: str | None,
    deep: bool,
    progress: Callable[[int, int], None] | None,
    total: int,
    idle: Callable[[], bool] | None = None,
) -> list[Part | None]:
    """scan_range over each range in a pool of worker processes; parts in range order.

    The first range is scanned from start_seq after prev; each later one from its own first line
    (the caller stitches). Once a range reports a problem, ranges after it that have not started
    are not scanned: None in their place. idle, if given, is called while the workers run, until it
    returns False (work for the parent)."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("q", 0)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=(counter,)) as pool:
        futures = [
            pool.submit(scan_range, path, a, b, start_seq if i == 0 else None, prev if i == 0 else None, deep)
            for i, (a, b) in enumerate(ranges)
        ]
        index = {f: i for i, f in enumerate(futures)}
        pending = set(futures)
        busy = idle is not None
        shown = 0.0
        while pending:
            if busy:
                assert idle is not None
                busy = idle()
            done, pending = wait(pending, timeout=0 if busy else 0.2)
            for f in done:
                if not f.cancelled() and f.exception() is None and f.result().problem is not None:
                    for later in futures[index[f] + 1 :]:
                        if later.cancel():
                            pending.discard(later)
            if progress is not None and (not busy or time.monotonic() - shown >= 0.2):
                shown = time.monotonic()
                progress(min(int(counter.value), total), total)
        return [None if f.cancelled() else f.result() for f in futures]
