"""Hand a decision input to rego-cpp and read its answer back, with as little work per query as possible.

Why this exists (measured with bench/policy.py and perf, rego-cpp 1.5.2 through regopy):
- rego-cpp looks a key up in an object by walking its members in insertion order and serialising each
  key to compare it (`VirtualMachine::dot` calls `to_key`, about 1 µs each). So the order of the input's
  keys decides the cost of every `input.action` or `t.project`: the keys the rules read most go first.
  Objects are unordered in Rego, so the order changes no lookup's answer. It shows only where a rule turns
  an input object into an array by iterating it, an order Rego leaves to the engine (OPA sorts by key,
  rego-cpp keeps insertion order); no rule in policies/ does that, and the regopy/OPA agreement tests
  would flag one that did.
- regopy's `Input(value)` walks the value through generic helpers (an isinstance chain and a fresh
  ctypes buffer per string); the same C calls made directly cost a fraction of it.
- regopy's `Output` fetches the answer's JSON twice; here it is fetched and parsed once.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping, Set
from typing import Any

from regopy import Bundle, Input, Interpreter, RegoError
from regopy import rego_shared as _shared

_lib = _shared.rego
_new_input = _lib.regoNewInput
_free_input = _lib.regoFreeInput
_int = _lib.regoInputInt
_float = _lib.regoInputFloat
_str = _lib.regoInputString
_bool = _lib.regoInputBoolean
_null = _lib.regoInputNull
_item = _lib.regoInputObjectItem
_object = _lib.regoInputObject
_array = _lib.regoInputArray
_set = _lib.regoInputSet
_query_entrypoint = _lib.regoBundleQueryEntrypoint
_output_ok = _lib.regoOutputOk
_output_size = _lib.regoOutputJSONSize
_output_json = _lib.regoOutputJSON
_free_output = _lib.regoFreeOutput

# Keys the rules read, most often read first (counted over policies/*.rego); any other key keeps its
# place after these. A policy that reads other keys stays correct, each such lookup is only slower.
HOT_KEYS = (
    "action", "id", "project", "targets", "actor", "owner", "kind", "creator", "granted", "creator_kind",
    "external_rights", "expired", "gpus", "rights_holder", "by", "approvals", "granularity", "reason",
    "params", "roles", "now", "at", "is_owner_of", "roles_by_project", "ticket", "responsible", "trigger",
)
_RANK = {k: i for i, k in enumerate(HOT_KEYS)}
_LAST = len(HOT_KEYS)


def _rank(key: Any) -> int:
    return _RANK.get(key, _LAST)


class UndefinedResult(Exception):
    """The entrypoint produced no value for this input."""


def _add(p: int, val: Any) -> int:
    """Push `val` onto the input builder `p`; returns a non-zero rego-cpp code on failure."""
    if val is True or val is False:
        return int(_bool(p, val))
    kind = type(val)
    if kind is str:
        return int(_str(p, val.encode("utf-8")))
    if val is None:
        return int(_null(p))
    if kind is int:
        return int(_int(p, val))
    if kind is float:
        return int(_float(p, val))
    if isinstance(val, Mapping):
        # sorted() is stable: keys outside HOT_KEYS keep their order.
        for k in sorted(val, key=_rank):
            rc = _add(p, k) or _add(p, val[k]) or int(_item(p))
            if rc:
                return rc
        return int(_object(p, len(val)))
    if isinstance(val, list | tuple):
        for x in val:
            rc = _add(p, x)
            if rc:
                return rc
        return int(_array(p, len(val)))
    if isinstance(val, Set):
        for x in val:
            rc = _add(p, x)
            if rc:
                return rc
        return int(_set(p, len(val)))
    if isinstance(val, str):
        return int(_str(p, str(val).encode("utf-8")))
    if isinstance(val, int):
        return int(_int(p, int(val)))
    if isinstance(val, float):
        return int(_float(p, float(val)))
    raise ValueError(f"Cannot convert object of type {type(val)} to rego input")


def rego_input(value: Any) -> Input:
    """The same Input as `regopy.Input(value)`, built faster and with HOT_KEYS first in every object.

    Raises RegoError if rego-cpp refuses the value, ValueError for a value JSON cannot hold.
    """
    p = _new_input()
    try:
        rc = _add(p, value)
    except BaseException:
        _free_input(p)
        raise
    if rc:
        _free_input(p)
        raise RegoError("Unable to create input", rc)
    made = Input.__new__(Input)
    made._impl = p  # Input.__del__ frees it
    return made


def query_value(rego: Interpreter, bundle: Bundle, entrypoint: bytes) -> Any:
    """The first value of `entrypoint` for the interpreter's current input.

    Raises RegoError when evaluation fails (the error text is the message), UndefinedResult when the
    entrypoint has no value.
    """
    out = _query_entrypoint(rego._impl, bundle._impl, entrypoint)
    if not out:
        raise RegoError(_shared.rego_get_error(rego._impl))
    try:
        size = _output_size(out)
        buf = ctypes.create_string_buffer(size)
        rc = _output_json(out, buf, size)
        if rc:
            raise RegoError(_shared.rego_get_error(rego._impl), rc)
        text = buf.value.decode("utf-8")
        if not _output_ok(out):
            raise RegoError(text)
    finally:
        _free_output(out)
    if text == "undefined":
        raise UndefinedResult
    parsed = json.loads(text)
    first = parsed[0] if isinstance(parsed, list) else parsed
    if not isinstance(first, dict) or not first.get("expressions"):
        raise UndefinedResult
    return first["expressions"][0]
