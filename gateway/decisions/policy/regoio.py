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
- regopy's `Output` fetches the answer's JSON twice; here it is fetched once and parsed with orjson.
- The builders, and the calls that set the input and read the answer back, go through a PyDLL handle:
  they keep the GIL, see below. Only the evaluation itself lets it go.
- rego-cpp's float builder writes the number with 6 decimals (10.0000004 becomes 10), so a rule comparing
  an owner's requested priority with her ceiling let a slightly higher value through. An input holding a
  float that 6 decimals would change goes to rego-cpp as JSON text instead, which keeps every digit (rare:
  decision inputs carry floats only for priorities).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping, Set
from typing import Any, TypeAlias

import orjson
from regopy import Bundle, Input, Interpreter, RegoError
from regopy import rego_shared as _shared

_lib = _shared.rego
# The input builders run for microseconds each, a hundred or more per decision: called through a PyDLL
# handle they keep the GIL (a CDLL call releases and retakes it every time, and under load another
# thread may hold it for a whole switch interval in between). So do the few calls around the query that
# hand over the input and copy the answer out. The query itself goes through regopy's CDLL handle and
# releases the GIL while rego-cpp evaluates, so decisions on other threads' interpreters run meanwhile.
_py = ctypes.PyDLL(_lib._name)


def _builder(name: str, *argtypes: Any, restype: Any = ctypes.c_uint32) -> Any:
    fn = getattr(_py, name)
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn


_P = ctypes.c_void_p
_new_input = _lib.regoNewInput
_free_input = _lib.regoFreeInput
_set_input = _builder("regoSetInput", _P, _P)
_int = _builder("regoInputInt", _P, ctypes.c_int64)
_float = _builder("regoInputFloat", _P, ctypes.c_double)
_str = _builder("regoInputString", _P, ctypes.c_char_p)
_bool = _builder("regoInputBoolean", _P, ctypes.c_bool)
_null = _builder("regoInputNull", _P)
_item = _builder("regoInputObjectItem", _P)
_object = _builder("regoInputObject", _P, ctypes.c_uint32)
_array = _builder("regoInputArray", _P, ctypes.c_uint32)
_set = _builder("regoInputSet", _P, ctypes.c_uint32)
_query_entrypoint = _lib.regoBundleQueryEntrypoint
_output_ok = _builder("regoOutputOk", _P, restype=ctypes.c_bool)
_output_size = _builder("regoOutputJSONSize", _P)
_output_json = _builder("regoOutputJSON", _P, ctypes.POINTER(ctypes.c_char), ctypes.c_uint32)
_free_output = _builder("regoFreeOutput", _P, restype=None)

# Keys the rules read, most often read first (counted over policies/*.rego); any other key keeps its
# place after these. A policy that reads other keys stays correct, each such lookup is only slower.
HOT_KEYS = (
    "action", "id", "project", "targets", "actor", "owner", "kind", "creator", "granted", "creator_kind",
    "external_rights", "expired", "gpus", "rights_holder", "by", "approvals", "granularity", "reason",
    "params", "roles", "now", "at", "is_owner_of", "roles_by_project", "ticket", "responsible", "trigger",
)
_RANK = {k: i for i, k in enumerate(HOT_KEYS)}
_LAST = len(HOT_KEYS)

# The order to send an object's keys in, by the keys as they come: positions into that tuple. Inputs
# repeat a few key sets (request, actor, job, approval), so this is a lookup, not a sort, per object.
# Positions, not keys, are kept: keys that compare equal (1 and True) get the same order either way.
_ORDERS: dict[tuple[Any, ...], tuple[int, ...]] = {}
_ORDERS_MAX = 4096


def _rank(key: Any) -> int:
    return _RANK.get(key, _LAST)


def _order(keys: tuple[Any, ...]) -> tuple[int, ...]:
    # sorted() is stable: keys outside HOT_KEYS keep their order.
    order = tuple(sorted(range(len(keys)), key=lambda i: _rank(keys[i])))
    if len(_ORDERS) >= _ORDERS_MAX:
        _ORDERS.clear()  # key sets are few in practice; a flood of distinct ones only costs sorts
    _ORDERS[keys] = order
    return order


class UndefinedResult(Exception):
    """The entrypoint produced no value for this input."""


class _Inexact(Exception):
    """A float the builder would round (see the module docstring)."""


# What rego_input gives set_input: a built Input, or JSON text when a float needs more than 6 decimals.
PreparedInput: TypeAlias = "Input | str"


def _add(p: int, val: Any) -> int:
    """Push `val` onto the input builder `p`; returns a non-zero rego-cpp code on failure.

    Objects and arrays push their string, null and boolean members inline (most of an input's members):
    a call less per member than recursing."""
    if val is True or val is False:
        return int(_bool(p, val))
    kind = type(val)
    if kind is str:
        return int(_str(p, val.encode("utf-8")))
    if kind is dict:
        keys = tuple(val)
        order = _ORDERS.get(keys)
        if order is None:
            order = _order(keys)
        for i in order:
            k = keys[i]
            v = val[k]
            rc = _str(p, k.encode("utf-8")) if type(k) is str else _add(p, k)
            if not rc:
                if type(v) is str:
                    rc = _str(p, v.encode("utf-8"))
                elif v is None:
                    rc = _null(p)
                elif v is True or v is False:
                    rc = _bool(p, v)
                else:
                    rc = _add(p, v)
            rc = rc or _item(p)
            if rc:
                return int(rc)
        return int(_object(p, len(keys)))
    if kind is list:
        for x in val:
            rc = _str(p, x.encode("utf-8")) if type(x) is str else _add(p, x)
            if rc:
                return int(rc)
        return int(_array(p, len(val)))
    if val is None:
        return int(_null(p))
    if kind is int:
        return int(_int(p, val))
    if kind is float:
        if float(f"{val:.6f}") != val:
            raise _Inexact
        return int(_float(p, val))
    if isinstance(val, Mapping):
        return _add(p, dict(val))
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


def rego_input(value: Any) -> PreparedInput:
    """The same Input as `regopy.Input(value)`, built faster and with HOT_KEYS first in every object; or, for a
    value holding a float that 6 decimals would change, its JSON text. Hand it to set_input.

    Raises RegoError if rego-cpp refuses the value, ValueError for a value JSON cannot hold.
    """
    p = _new_input()
    try:
        rc = _add(p, value)
    except _Inexact:
        _free_input(p)
        return json.dumps(value, allow_nan=False, default=_jsonable)
    except BaseException:
        _free_input(p)
        raise
    if rc:
        _free_input(p)
        raise RegoError("Unable to create input", rc)
    made = Input.__new__(Input)
    made._impl = p  # Input.__del__ frees it
    return made


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    raise ValueError(f"Cannot convert object of type {type(value)} to rego input")


def set_input(rego: Interpreter, prepared: PreparedInput) -> None:
    """Make `prepared` (from rego_input) the interpreter's input. Raises RegoError."""
    if isinstance(prepared, str):
        rego.set_input_term(prepared)
    elif rc := _set_input(rego._impl, prepared._impl):
        raise RegoError(_shared.rego_get_error(rego._impl), rc)


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
        raw = buf.value
        if not _output_ok(out):
            raise RegoError(raw.decode("utf-8"))
    finally:
        _free_output(out)
    if raw == b"undefined":
        raise UndefinedResult
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:  # what orjson refuses (integers beyond 64 bits), the standard parser takes
        parsed = json.loads(raw)
    first = parsed[0] if isinstance(parsed, list) else parsed
    if not isinstance(first, dict) or not first.get("expressions"):
        raise UndefinedResult
    return first["expressions"][0]
