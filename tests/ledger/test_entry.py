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


# Values of the kinds the fast path takes (exact built-in types, ASCII keys, safe integers), with
# strings over all of Unicode (controls, U+2028, U+007F, astral planes...).
fast_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(st.characters(max_codepoint=0x7F), max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(value=st.dictionaries(st.text(st.characters(max_codepoint=0x7F), max_size=8), fast_values, max_size=6))
def test_fast_path_is_byte_identical_to_rfc8785(value: dict[str, object]) -> None:
    from ledger.entry import _json_fast_ok, canonical

    assert _json_fast_ok(value)
    assert canonical(value) == rfc8785.dumps(value)


@pytest.mark.parametrize(
    "value",
    [{"k": 1.5}, {"é": 1}, {"k": 2**53}, {"k": [True, (1, 2)]}, {"k": {1: 2}}, {"k": b"x"}],
    ids=["float", "non-ascii-key", "unsafe-int", "tuple", "int-key", "bytes"],
)
def test_fast_path_declines_what_it_cannot_encode_exactly(value: dict[str, object]) -> None:
    from ledger.entry import _json_fast_ok

    assert not _json_fast_ok(value)


def test_lone_surrogates_are_refused_on_the_fast_path() -> None:
    with pytest.raises(InvalidEntry):
        prepare("k", {"x": "\ud800"}, None)
    with pytest.raises(InvalidEntry):
        prepare("\udfff", {}, None)


def test_prepared_hashes_equal_hashes_of_the_stored_bytes() -> None:
    import hashlib

    from ledger.merkle import leaf_hash

    prep = prepare("k", {"a": "b" * 3000}, {"snap": b"\x00" * 10})
    raw = encode(prep, 7, "2024-05-01T12:00:00.000001Z", "cd" * 32)
    assert prep.hashes(raw[len(prep.head) :]) == (hashlib.sha256(raw).hexdigest(), leaf_hash(raw))
