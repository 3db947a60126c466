"""Ledger entry encoding: RFC 8785 (JCS) canonical JSON of
{"seq", "time", "prev", "kind", "body", "blobs"}; hash = hex SHA-256 of the stored bytes.

JCS orders members by UTF-16 code units, which for these six keys is always
blobs, body, kind, prev, seq, time. So the writer canonicalises the caller's parts once (in the
caller's thread) and assembles the entry by concatenation, which is byte-identical to
rfc8785.dumps(whole object) — the tests check exactly that.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
    """True when json.dumps(sort_keys) output equals JCS for obj.

    They agree on strings (same escapes, lowercase \\u00xx), booleans, null and integers within the
    I-JSON range; they differ on floats (ES6 number formatting) and may differ on key order when a
    key leaves ASCII (UTF-16 vs code-point order). Anything unusual takes the rfc8785 path.
    """
    stack: list[Any] = [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is str or t is bool or o is None:
            continue
        if t is int:
            if not -_MAX_SAFE_INT <= o <= _MAX_SAFE_INT:
                return False
        elif t is dict:
            for k, v in o.items():
                if type(k) is not str or not k.isascii():
                    return False
                stack.append(v)
        elif t is list:
            stack.extend(o)
        else:
            return False
    return True


# One encoder built once: json.dumps() with non-default options constructs a new one per call.
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_ENCODE_STR: Any = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of obj; raises InvalidEntry if obj is not I-JSON."""
    if _json_fast_ok(obj):
        try:
            return _ENCODE(obj).encode()
        except UnicodeEncodeError as e:
            raise InvalidEntry("entry contains a lone surrogate") from e
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


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    """The caller-owned parts of an entry, already canonical; seq/time/prev come at commit."""

    head: bytes  # b'{"blobs":{...},"body":{...},"kind":"..."'
    blob_refs: dict[str, str]
    blob_data: dict[str, bytes]


def prepare(kind: str, body: Mapping[str, Any], blobs: Mapping[str, bytes] | None) -> PreparedEntry:
    """Validate and canonicalise kind/body/blobs; raises InvalidEntry."""
    if not isinstance(kind, str) or not kind:
        raise InvalidEntry("kind must be a non-empty string")
    if not isinstance(body, Mapping):
        raise InvalidEntry("body must be a mapping")
    refs: dict[str, str] = {}
    data: dict[str, bytes] = {}
    for name, payload in (blobs or {}).items():
        if not isinstance(name, str) or not name:
            raise InvalidEntry("blob names must be non-empty strings")
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidEntry(f"blob {name!r} must be bytes")
        b = bytes(payload)
        digest = hashlib.sha256(b).hexdigest()
        refs[name] = digest
        data[digest] = b
    try:
        kind_json = _ENCODE_STR(kind).encode()
    except UnicodeEncodeError as e:
        raise InvalidEntry("kind contains a lone surrogate") from e
    body_json = canonical(body if type(body) is dict else _plain(body))
    head = b'{"blobs":' + (canonical(refs) if refs else b"{}") + b',"body":' + body_json + b',"kind":' + kind_json
    return PreparedEntry(head, refs, data)


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
    return b"%s,\"prev\":\"%s\",\"seq\":%d,\"time\":\"%s\"}" % (prep.head, prev.encode(), seq, time)


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
