"""The engine's fast regopy input/output path gives rego-cpp exactly what regopy's own Input would, and what-if
parses every ledger entry the standard parser does."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from regopy import Input, Interpreter, LogLevel

from gateway.decisions.policy.regoio import HOT_KEYS, UndefinedResult, query_value, rego_input, set_input
from gateway.decisions.policy.whatif import records_from_entries

ECHO = "package t\n\nimport rego.v1\n\necho := input\n"


@pytest.fixture()
def echo() -> tuple[Interpreter, Any]:
    rego = Interpreter()
    rego.log_level = LogLevel.NONE
    rego.add_module("t.rego", ECHO)
    return rego, rego.build(None, ["t/echo"])


def _echo(rego: Interpreter, bundle: Any, inp: Input) -> Any:
    rego.set_input(inp)
    return query_value(rego, bundle, b"t/echo")


VALUES: list[Any] = [
    {"z": 1, "action": "job.stop", "a": [True, False, None, 1.5, -3, "é"], "targets": [{"gpus": 8, "id": "j-1"}]},
    {"nested": {"x": {"y": [[], {}, ""]}}, "t": (1, 2)},
    [],
    "text",
    12,
]


@pytest.mark.parametrize("value", VALUES)
def test_same_value_as_regopy_input(echo: tuple[Interpreter, Any], value: Any) -> None:
    rego, bundle = echo
    assert _echo(rego, bundle, rego_input(value)) == _echo(rego, bundle, Input(value))


def test_floats_keep_every_digit() -> None:
    """rego-cpp's float builder (and regopy's Input) write a float with 6 decimals: 10.0000004 arrived as 10, so
    `requested <= ceiling` held for a value above the ceiling (an owner's own priority, A2)."""
    rego = Interpreter()
    rego.log_level = LogLevel.NONE
    rego.add_module("t.rego", "package t\n\nimport rego.v1\n\nabove := input.want > input.most\n"
                              "echo := input\n")
    bundle = rego.build(None, ["t/above", "t/echo"])
    for want, most, above in [(10.0000004, 10, True), (10.0000004, 10.0000005, False), (1e-7, 0, True),
                              (0.3, 0.3, False), (10.5, 10.25, True)]:
        set_input(rego, rego_input({"want": want, "most": most, "job": {"id": "j-1", "gpus": [8, (1, 2)]}}))
        assert (query_value(rego, bundle, b"t/above") is True) is above, (want, most)
        assert query_value(rego, bundle, b"t/echo") == {"want": want, "most": most,
                                                        "job": {"id": "j-1", "gpus": [8, [1, 2]]}}


def test_hot_keys_come_first_other_keys_keep_their_order() -> None:
    rego = Interpreter()
    rego.log_level = LogLevel.NONE
    rego.add_module("t.rego", "package t\n\nimport rego.v1\n\nkeys := [k | input[k]]\n")
    bundle = rego.build(None, ["t/keys"])
    rego.set_input(rego_input({"zeta": 1, "beta": 2, "targets": [], "action": "x"}))
    keys = query_value(rego, bundle, b"t/keys")
    assert set(keys) == {"zeta", "beta", "targets", "action"}
    # rego-cpp iterates objects in insertion order; the order is only a lookup cost, never a meaning.
    assert keys[:2] == ["action", "targets"] and HOT_KEYS.index("action") < HOT_KEYS.index("targets")
    assert keys[2:] == ["zeta", "beta"]


def test_undefined_and_errors_are_told_apart() -> None:
    rego = Interpreter()
    rego.log_level = LogLevel.NONE
    rego.add_module("t.rego", "package t\n\nimport rego.v1\n\nmaybe := 1 if input.x == 1\n\nboom := 1 / input.zero\n")
    bundle = rego.build(None, ["t/maybe", "t/boom"])
    rego.set_input(rego_input({"x": 2, "zero": 0}))
    with pytest.raises(UndefinedResult):
        query_value(rego, bundle, b"t/maybe")
    rego.set_input(rego_input({"x": 1, "zero": 0}))
    assert query_value(rego, bundle, b"t/maybe") == 1


def test_unconvertible_input_is_refused() -> None:
    with pytest.raises(ValueError):
        rego_input({"when": object()})


def test_whatif_parses_entries_orjson_refuses() -> None:
    # Integers beyond 64 bits and NaN are valid for Python's parser; the fast parser falls back to it.
    entry = {"seq": 7, "time": "2026-11-29T10:00:00.000000Z", "kind": "decision",
             "body": {"input": {"action": "job.view", "big": 2**70, "odd": float("nan")},
                      "decision": {"effect": "allow", "approvals_required": {"count": 0}, "rules": []}}}
    raw = json.dumps(entry).encode()
    (record,) = records_from_entries([raw])
    assert record.seq == 7 and record.input["big"] == 2**70 and math.isnan(record.input["odd"])
    plain = json.dumps({**entry, "body": {**entry["body"], "input": {"action": "job.view"}}}).encode()
    assert next(records_from_entries([plain])).input == {"action": "job.view"}
