"""Ledger entry encoding: RFC 8785 (JCS) canonical JSON of
{"seq", "time", "prev", "kind", "body", "blobs"}; hash = hex SHA-256 of the stored bytes.

JCS orders members by UTF-16 code units, which for these six keys is always
blobs, body, kind, prev, seq, time. So the writer canonicalises the caller's parts once (in the
caller's thread) and assembles the entry by concatenation, which is byte-identical to
rfc8785.dumps(whole object) — the tests check exactly that. The caller's thread also feeds the
head (everything before "prev") to the entry hash and the RFC 6962 leaf hash, so the writer only
hashes the short tail it appends.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import rfc8785

from ledger.errors import InvalidEntry

ZERO_HASH = "0" * 64
FIELDS = frozenset({"seq", "time", "prev", "kind", "body", "blobs"})
TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
HEX64_RE = re.compile(r"[0-9a-f]{64}")
_MAX_SAFE_INT = 2**53 - 1


def format_time(dt: datetime) -> str:
    """RFC 3339 UTC with microseconds and Z; raises InvalidEntry for a naive datetime."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise InvalidEntry("ledger clock returned a naive datetime; it must be timezone-aware")
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_fast_ok(obj: Any) -> bool:
    """True when orjson's sorted-keys output equals JCS for obj.

    They agree on strings (UTF-8, escapes only for '"', '\\' and controls, short forms for
    \\b \\t \\n \\f \\r and lowercase \\u00xx otherwise), booleans, null and integers within the
    I-JSON range; they differ on floats (ES6 number formatting) and may differ on key order when a
    key leaves ASCII (UTF-16 vs code-point order). Exact built-in types only: orjson would also
    serialise subclasses, dataclasses, datetimes... Anything unusual takes the rfc8785 path.
    """
    # Scalars are checked in place; only containers go on the stack (most values are scalars).
    lo, hi = -_MAX_SAFE_INT, _MAX_SAFE_INT
    stack: list[Any] = [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is dict:
            for k, v in o.items():
                if type(k) is not str or not k.isascii():
                    return False
                tv = type(v)
                if tv is str or tv is bool or v is None:
                    continue
                if tv is int:
                    if not lo <= v <= hi:
                        return False
                elif tv is dict or tv is list:
                    stack.append(v)
                else:
                    return False
        elif t is list:
            for v in o:
                tv = type(v)
                if tv is str or tv is bool or v is None:
                    continue
                if tv is int:
                    if not lo <= v <= hi:
                        return False
                elif tv is dict or tv is list:
                    stack.append(v)
                else:
                    return False
        elif t is str or t is bool or o is None:
            continue
        elif t is int:
            if not lo <= o <= hi:
                return False
        else:
            return False
    return True


_SORTED = orjson.OPT_SORT_KEYS


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of obj; raises InvalidEntry if obj is not I-JSON."""
    if _json_fast_ok(obj):
        try:
            return orjson.dumps(obj, option=_SORTED)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate, nesting deeper than orjson's limit...: the reference encoder decides
    try:
        return rfc8785.dumps(_plain(obj))
    except (rfc8785.CanonicalizationError, TypeError, ValueError, UnicodeEncodeError) as e:
        raise InvalidEntry(f"entry is not canonical-JSON encodable: {e}") from e


def _plain(obj: Any) -> Any:
    """Copy Mappings/tuples into dicts/lists so the encoders see plain JSON types."""
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


_LEAF_PREFIX = hashlib.sha256(b"\x00")


@dataclass(slots=True)
class PreparedEntry:
    """The caller-owned parts of an entry, already canonical; seq/time/prev come at commit.

    Treat as immutable (not frozen only because a frozen dataclass is slower to build, per append)."""

    head: bytes  # b'{"blobs":{...},"body":{...},"kind":"..."'
    blob_refs: dict[str, str]
    blob_data: dict[str, bytes]
    # SHA-256 states after the head, and after 0x00 || head (RFC 6962 leaf): the writer copies
    # them and feeds only the tail. Never updated in place.
    head_hash: hashlib._Hash
    head_leaf: hashlib._Hash

    def hashes(self, tail: bytes) -> tuple[str, bytes]:
        """(hex SHA-256, RFC 6962 leaf hash) of head + tail, the stored bytes of the entry."""
        e = self.head_hash.copy()
        e.update(tail)
        lf = self.head_leaf.copy()
        lf.update(tail)
        return e.hexdigest(), lf.digest()


def prepare(kind: str, body: Mapping[str, Any], blobs: Mapping[str, bytes] | None) -> PreparedEntry:
    """Validate and canonicalise kind/body/blobs; raises InvalidEntry."""
    if not isinstance(kind, str) or not kind:
        raise InvalidEntry("kind must be a non-empty string")
    if type(body) is not dict and not isinstance(body, Mapping):
        raise InvalidEntry("body must be a mapping")
    refs: dict[str, str] = {}
    data: dict[str, bytes] = {}
    for name, payload in blobs.items() if blobs else ():
        if not isinstance(name, str) or not name:
            raise InvalidEntry("blob names must be non-empty strings")
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidEntry(f"blob {name!r} must be bytes")
        b = bytes(payload)
        digest = hashlib.sha256(b).hexdigest()
        refs[name] = digest
        data[digest] = b
    try:
        kind_json = orjson.dumps(kind)
    except orjson.JSONEncodeError as e:
        raise InvalidEntry("kind contains a lone surrogate") from e
    body_json = canonical(body if type(body) is dict else _plain(body))
    head = b'{"blobs":%s,"body":%s,"kind":%s' % (canonical(refs) if refs else b"{}", body_json, kind_json)
    leaf = _LEAF_PREFIX.copy()
    leaf.update(head)
    return PreparedEntry(head, refs, data, hashlib.sha256(head), leaf)


def encode(prep: PreparedEntry, seq: int, time: str, prev: str) -> bytes:
    """The stored bytes of an entry (JCS member order: blobs, body, kind, prev, seq, time)."""
    return b"".join(
        (
            prep.head,
            b',"prev":"',
            prev.encode(),
            b'","seq":',
            str(seq).encode(),
            b',"time":"',
            time.encode(),
            b'"}',
        )
    )


def encode_bytes(prep: PreparedEntry, seq: int, time: bytes, prev: str) -> bytes:
    """encode() with the time already as bytes (the writer formats one time per batch)."""
    return prep.head + tail_bytes(seq, time, prev.encode())


def tail_bytes(seq: int, time: bytes, prev: bytes) -> bytes:
    """The part of an entry after the head: ,"prev":"<hex>","seq":<n>,"time":"<time>"}."""
    return b',"prev":"%s","seq":%d,"time":"%s"}' % (prev, seq, time)


def field_problem(value: object, seq: int, prev: str) -> tuple[str, str] | None:
    """Check a parsed entry against its position; returns (problem code, message) or None."""
    if not isinstance(value, dict) or set(value) != FIELDS:
        return "malformed", "entry is not an object with exactly seq, time, prev, kind, body, blobs"
    s = value["seq"]
    if type(s) is not int:
        return "malformed", "seq is not an integer"
    if s != seq:
        if s < seq:
            return "inserted", f"entry at position {seq} claims seq {s}"
        return "reordered", f"entry at position {seq} claims seq {s}"
    t, p, k, b, bl = value["time"], value["prev"], value["kind"], value["body"], value["blobs"]
    if not isinstance(t, str) or not TIME_RE.fullmatch(t):
        return "malformed", "time is not RFC 3339 UTC with microseconds"
    if not isinstance(p, str) or not HEX64_RE.fullmatch(p):
        return "malformed", "prev is not a hex SHA-256"
    if p != prev:
        return "modified", "prev does not match the hash of the previous entry"
    if not isinstance(k, str) or not k:
        return "malformed", "kind is not a non-empty string"
    if not isinstance(b, dict):
        return "malformed", "body is not an object"
    if not isinstance(bl, dict) or not all(
        isinstance(n, str) and isinstance(d, str) and HEX64_RE.fullmatch(d) for n, d in bl.items()
    ):
        return "malformed", "blobs is not an object of hex SHA-256 digests"
    return None
