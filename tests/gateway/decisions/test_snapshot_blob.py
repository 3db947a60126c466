"""The queue snapshot's fast encoding is byte-identical to RFC 8785 (H3 blobs are content-addressed)."""

from __future__ import annotations

from collections import Counter

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.decisions.queue_snapshot import SNAPSHOT_COLUMNS, snapshot_bytes

text = st.text(max_size=12)  # any Unicode: escapes, controls, astral characters, lone surrogates
priority = st.one_of(st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
                     st.floats(allow_nan=False, allow_infinity=False))
row = st.tuples(text, text, text, priority, st.integers(0, 4096)).map(list)  # in SNAPSHOT_COLUMNS order


def snapshot_of(pending: list[list[object]]) -> dict[str, object]:
    return {"columns": list(SNAPSHOT_COLUMNS), "pending": pending,
            "pending_by_queue": dict(sorted(Counter(str(r[2]) for r in pending).items()))}


@settings(max_examples=300, deadline=None)
@given(st.lists(row, max_size=8))
def test_fast_snapshot_encoding_equals_rfc8785(pending: list[list[object]]) -> None:
    snapshot = snapshot_of(pending)
    try:
        expected = rfc8785.dumps(snapshot)
    except rfc8785.CanonicalizationError:
        return  # not I-JSON (a lone surrogate): the ledger refuses it on either path
    assert snapshot_bytes(snapshot) == expected


def test_queue_names_past_the_basic_plane_keep_rfc8785_key_order() -> None:
    # UTF-16 puts U+1F600 (a surrogate pair, 0xD83D...) before U+FB01; code-point order puts it after.
    snapshot = snapshot_of([["j1", "p", q, 0, 1] for q in ("\U0001f600", "\ufb01")])
    assert snapshot_bytes(snapshot) == rfc8785.dumps(snapshot)
