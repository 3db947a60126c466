"""Refused attempts in the ledger (README, H3; gateway/decisions/refusals.py): repeats counted per window, a ledger that
cannot take the entry leaves the refusal as it was, and callers without an identity never reach the ledger.
Every route's refused call being one entry is tests/gateway/api/test_route_guard.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from gateway_testkit import Api, assert_problem, ledger_entries
from stop_helpers import shift_clock

from gateway.decisions import refusal_counts
from gateway.housekeeping import run_all
from ledger.errors import StoreError

FOR_ALICE = {"principal": "alice", "purpose": "not mine to make", "projects": ["vision"], "actions": ["job.view"],
             "expires_in_days": 1}


def _mint_for_alice(api: Api, **body: Any) -> dict[str, Any]:
    return assert_problem(api.post("/v1/tokens", "mallory", json={**FOR_ALICE, **body}), 403, "forbidden",
                          "may not create tokens for alice")


def _refusals(api: Api) -> list[dict[str, Any]]:
    return [e for e in ledger_entries(api) if e["kind"] == "refusal"]


def test_identical_refusals_are_counted_into_one_entry_per_window(api: Api) -> None:
    window = api.gateway.settings.refusal_window_s
    first = _mint_for_alice(api)["ledger_seq"]
    (entry,) = _refusals(api)
    assert entry["seq"] == first and entry["body"]["count"] == 1 and entry["body"]["window_s"] == window
    assert f"next {window:g} s are counted" in entry["body"]["repeats"]
    assert [_mint_for_alice(api)["ledger_seq"] for _ in range(3)] == [first] * 3  # counted, not written
    other = _mint_for_alice(api, purpose="another purpose")["ledger_seq"]  # not identical: its own entry
    assert [e["seq"] for e in _refusals(api)] == [first, other]

    shift_clock(api, window + 1)
    run_all(api.gateway)  # the housekeeping loop writes the counts of the windows that closed
    counted = [e["body"] for e in _refusals(api) if "repeats_of" in e["body"]]
    assert [(c["repeats_of"], c["count"]) for c in counted] == [(first, 3)]
    assert counted[0]["actor"]["id"] == "mallory" and counted[0]["asked"] == entry["body"]["asked"]
    assert counted[0]["first_at"] <= counted[0]["last_at"]
    again = _mint_for_alice(api)["ledger_seq"]  # a new window: an entry of its own
    assert again > other and _refusals(api)[-1]["body"]["count"] == 1


def _closed(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    api.gateway.ledger.close()


def _write_fails(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(*args: object, **kwargs: object) -> None:
        raise StoreError("disk full")

    store = api.gateway.ledger._store
    # SQLite numbers a batch in this process (write_batch); PostgreSQL numbers it from the head row it locks.
    for write in ("write_batch", "write_sequenced"):
        if hasattr(store, write):
            monkeypatch.setattr(store, write, disk_full)


@pytest.mark.parametrize("break_ledger", [_closed, _write_fails], ids=["ledger closed", "ledger write fails"])
def test_a_refusal_the_ledger_cannot_take_is_still_the_refusal(
        api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        break_ledger: Callable[[Api, pytest.MonkeyPatch], None]) -> None:
    size = api.gateway.ledger.size()
    with monkeypatch.context() as m:
        break_ledger(api, m)
        with caplog.at_level(logging.ERROR, logger="jobgate.refusals"):
            problem = _mint_for_alice(api)  # a 403 as ever, not a 500 or a 503
        assert "ledger_seq" not in problem
    (logged,) = [r for r in caplog.records if r.name == "jobgate.refusals"]
    assert "refusal not in the ledger" in logged.getMessage() and "POST /v1/tokens by mallory" in logged.getMessage()
    if break_ledger is _write_fails:
        assert api.gateway.ledger.size() == size
        # Written again once it can be: the same refusal is not taken as counted into the entry that failed.
        seq = _mint_for_alice(api)["ledger_seq"]
        assert _refusals(api)[-1]["seq"] == seq


def test_calls_without_an_identity_never_reach_the_ledger(api: Api) -> None:
    """No token, a malformed one, an unknown one, a revoked one: 401, and nothing to name in the ledger, so a
    flood of them cannot fill it."""
    token = api.post("/v1/tokens", "alice", json={**FOR_ALICE, "purpose": "to revoke"}).json()
    assert api.post(f"/v1/tokens/{token['id']}/revoke", "alice", json={"reason": "leaked"}).status_code == 200
    size = api.gateway.ledger.size()
    for authorization in (None, "Basic YWxpY2U6cHc=", "Bearer jg_" + "0" * 43, f"Bearer {token['token']}"):
        for _ in range(25):
            headers = {"Authorization": authorization} if authorization else {}
            r = api.client.post("/v1/tokens", json=FOR_ALICE, headers=headers)
            assert_problem(r, 401, "unauthenticated")
    assert api.gateway.ledger.size() == size


def test_windows_closed_early_to_make_room_still_have_their_counts_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open windows are bounded (each keeps its entry's body): past the bound the oldest closes at once, and its
    repeats are handed back to be written like a window that ran out."""
    monkeypatch.setattr(refusal_counts, "MAX_OPEN", 2)
    counts, now = refusal_counts.RefusalCounts(), datetime(2026, 12, 1, tzinfo=UTC)
    for seq, key in enumerate(("a", "b")):
        counts.open(key, seq, {"key": key}, now, 60)
    assert counts.counted("a", now, 60) == 0 and counts.counted("a", now, 60) == 0  # two repeats of "a"
    closed = counts.take_closed(now, 60, room_for=1)  # a third kind of refusal comes
    assert [(w.key, w.seq, w.repeats) for w in closed] == [("a", 0, 2)]
    assert counts.counted("a", now, 60) is None and counts.counted("b", now, 60) == 1  # "a" is written anew
