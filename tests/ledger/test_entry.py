"""Entry encoding is exactly RFC 8785 over the six fields, whichever encoder path is taken."""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.entry import encode, field_problem, format_time, prepare
from ledger.errors import InvalidEntry

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text() | st.floats(-1e15, 1e15),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(st.text(max_size=8), json_values, max_size=6), kind=st.text(min_size=1, max_size=10))
def test_encoding_equals_rfc8785_of_the_whole_entry(body: dict[str, object], kind: str) -> None:
    try:
        prep = prepare(kind, body, {"snap": b"abc"})
    except InvalidEntry:
        # Lone surrogates are not encodable as UTF-8; rfc8785 refuses them too.
        with pytest.raises(Exception):  # noqa: B017
            rfc8785.dumps({"k": kind, "b": body})
        return
    raw = encode(prep, 3, "2024-05-01T12:00:00.000001Z", "ab" * 32)
    value = json.loads(raw)
    assert raw == rfc8785.dumps(value)
    assert value["body"] == json.loads(rfc8785.dumps(body))
    assert field_problem(value, 3, "ab" * 32) is None


@pytest.mark.parametrize(
    "kind, body",
    [("", {}), ("k", {"x": float("nan")}), ("k", {"x": 2**60}), ("k", {"x": object()}), ("k", [1])],
    ids=["empty-kind", "nan", "big-int", "object", "not-mapping"],
)
def test_invalid_entries_raise_invalid_entry(kind: str, body: object) -> None:
    with pytest.raises(InvalidEntry):
        prepare(kind, body, None)  # type: ignore[arg-type]


def test_naive_time_is_refused() -> None:
    from datetime import datetime

    with pytest.raises(InvalidEntry):
        format_time(datetime(2024, 1, 1))
