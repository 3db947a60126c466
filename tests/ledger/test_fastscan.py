"""The verifier's fast line scan decides exactly as the full per-entry checks do.

The fast scan skips JSON parsing for ordinary entries (a combined test of line prefix, hash, head and
tail, and a time field already checked earlier in the run); whatever it does not take gets every
check in order. For damage that leaves a stored hash stale, the first problem (seq, code, message),
the entry count and the leaf hashes must equal those of deep=True, which parses every entry.
"""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.entry import ZERO_HASH, encode, prepare
from ledger.fastscan import Part, iter_buffers, scan_buffer, scan_rows
from ledger.merkle import leaf_hash

TIMES = ["2025-01-01T00:00:00.000001Z"] * 4 + ["2025-01-01T00:00:00.000002Z"] * 3 + ["2025-01-01T00:00:01.000000Z"]


def entry_lines(n: int, times: list[str] | None = None, start: int = 0) -> list[bytes]:
    """n well-formed bundle lines '<seq> <hash> <entry>' (a few sharing each time, as a batch does)."""
    prev = ZERO_HASH
    out = []
    for seq in range(start, start + n):
        t = (times or TIMES)[seq % len(times or TIMES)]
        raw = encode(prepare("decision", {"actor": f"user-{seq % 3}", "i": seq, "pad": "x" * 40}, None), seq, t, prev)
        prev = hashlib.sha256(raw).hexdigest()
        out.append(b"%d %s %s" % (seq, prev.encode(), raw))
    return out


def scan(lines: list[bytes], deep: bool, start: int = 0) -> tuple[object, ...]:
    buf = b"".join(line + b"\n" for line in lines)
    part = Part(start)
    scan_buffer(buf, 0, len(buf), part, ZERO_HASH if start == 0 else None, deep)
    return part.problem, part.count, bytes(part.leaves), part.last_hash, part.first_prev


def test_intact_lines_pass_with_the_right_leaves() -> None:
    lines = entry_lines(40)
    problem, count, leaves, last, _ = scan(lines, deep=False)
    assert problem is None and count == 40
    assert leaves == b"".join(leaf_hash(line.split(b" ", 2)[2]) for line in lines)
    assert last == lines[-1].split(b" ")[1].decode()
    assert scan(lines, deep=False) == scan(lines, deep=True)


@settings(max_examples=300, deadline=None)
@given(
    line=st.integers(0, 19),
    where=st.floats(0, 1, exclude_max=True),
    kind=st.sampled_from(["set", "delete", "insert"]),
    byte=st.sampled_from(list(b'0123456789abcdef ":,{}xZT.-\x00\xff')),
    start=st.sampled_from([0, 0, 3]),
)
def test_damage_gets_the_same_verdict_as_full_checks(line: int, where: float, kind: str, byte: int, start: int) -> None:
    lines = entry_lines(20)[start:]
    line = min(line, len(lines) - 1)
    b = bytearray(lines[line])
    i = int(where * len(b))
    if kind == "set":
        b[i] = byte
    elif kind == "delete":
        del b[i]
    else:
        b.insert(i, byte)
    lines[line] = bytes(b)
    assert scan(lines, deep=False, start=start) == scan(lines, deep=True, start=start)


def test_a_bad_time_after_good_ones_is_caught_with_hashes_intact() -> None:
    # The fast path reuses a time it has checked; a different, invalid one must still be refused.
    lines = entry_lines(6, ["2025-01-01T00:00:00.000001Z"] * 3 + ["2025-01-01T00:00:00.00000xZ"] * 3)
    problem, count, *_ = scan(lines, deep=False)
    assert problem is not None and problem[:2] == (3, "malformed") and count == 3


def test_seq_digits_grow_across_a_power_of_ten() -> None:
    lines = entry_lines(25, start=90)
    buf = b"".join(line + b"\n" for line in lines)
    part = Part(90)
    scan_buffer(buf, 0, len(buf), part, None, False)
    assert part.problem is None and part.count == 25


def test_buffers_split_at_line_ends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import ledger.fastscan as fastscan

    lines = entry_lines(50)
    path = tmp_path / "lines"
    path.write_bytes(b"head\n" + b"".join(line + b"\n" for line in lines))
    old = fastscan._CHUNK
    fastscan._CHUNK = 700  # smaller than one line: lines straddle reads
    try:
        with open(path, "rb") as f:
            got = [buf[a:b] for buf, a, b in iter_buffers(f, 5, path.stat().st_size)]
    finally:
        fastscan._CHUNK = old
    assert b"".join(got) == b"".join(line + b"\n" for line in lines)
    assert all(g.endswith(b"\n") for g in got)


@settings(max_examples=200, deadline=None)
@given(line=st.integers(0, 19), where=st.floats(0, 1, exclude_max=True), byte=st.sampled_from(list(b'0"{,x\x00')))
def test_store_rows_damage_gets_the_same_verdict_as_full_checks(line: int, where: float, byte: int) -> None:
    rows = []
    for text in entry_lines(20):
        seq, h, raw = text.split(b" ", 2)
        rows.append((int(seq), h.decode(), raw))
    seq, h, raw = rows[line]
    b = bytearray(raw)
    b[int(where * len(b))] = byte
    rows[line] = (seq, h, bytes(b))
    got = []
    for deep in (False, True):
        part = Part(0)
        scan_rows(rows, part, ZERO_HASH, deep)
        got.append((part.problem, part.count, bytes(part.leaves), part.last_hash))
    assert got[0] == got[1]


def rechained(lines: list[bytes], at: int, raw: bytes) -> list[bytes]:
    """lines with entry at replaced by raw, its stored hash and every later prev and hash recomputed:
    the chain holds, so only the field checks can find what changed."""
    out = list(lines)
    old = new = lines[at].split(b" ", 2)[1]
    for i in range(at, len(lines)):
        seq, h, body = out[i].split(b" ", 2)
        if i == at:
            body = raw
        else:
            body = body.replace(b'"prev":"%s"' % old, b'"prev":"%s"' % new)
            old = h
        new = hashlib.sha256(body).hexdigest().encode()
        out[i] = b"%s %s %s" % (seq, new, body)
    return out


@settings(max_examples=400, deadline=None)
@given(
    line=st.integers(0, 19),
    tail=st.booleans(),
    where=st.integers(0, 200),
    kind=st.sampled_from(["set", "delete", "insert"]),
    byte=st.sampled_from(list(b'0123456789abcdef ":,{}xZT.-\x00\xff\n')),
    start=st.sampled_from([0, 0, 3]),
)
def test_damage_with_hashes_recomputed_gets_the_same_verdict_as_full_checks(
    line: int, tail: bool, where: int, kind: str, byte: int, start: int
) -> None:
    # The hashes agree, so the byte-level checks alone must find what the full field checks find in
    # what they cover: the empty-blobs head and the tail from ,"prev" on. The body and kind between
    # are covered by the hashes and the signed tree, not re-parsed on this path.
    lines = entry_lines(20)
    raw = bytearray(lines[line].split(b" ", 2)[2])
    head_n, tail_n = len(b'{"blobs":{},"body":{'), len(b',"prev":"","seq":,"time":"2025-01-01T00:00:00.000001Z"}') + 64
    tail_n += len(str(line))
    # An insertion goes before raw[i]; one before the tail's first byte would land in the kind, and
    # one before the head's last byte ('{') might only add to the body.
    insert = kind == "insert"
    i = len(raw) - (not insert) - where % tail_n if tail else where % (head_n - insert)
    if kind == "set":
        raw[i] = byte
    elif kind == "delete":
        del raw[i]
    else:
        raw.insert(i, byte)
    lines = rechained(lines, line, bytes(raw))[start:]
    assert scan(lines, deep=False, start=start) == scan(lines, deep=True, start=start)


def test_a_first_time_field_is_checked_whatever_its_first_byte() -> None:
    # Nothing is taken as already checked at the start of a run, not even an unusual byte.
    lines = entry_lines(3)
    raw = lines[0].split(b" ", 2)[2]
    lines = rechained(lines, 0, raw[:-29] + b"\xff" + raw[-28:])
    problem, count, *_ = scan(lines, deep=False)
    assert problem is not None and problem[0] == 0 and count == 0
    assert scan(lines, deep=False) == scan(lines, deep=True)
