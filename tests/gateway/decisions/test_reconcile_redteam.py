"""Decisions without an outcome are closed with one (DESIGN, one mutation's path, step 7): a gateway that died
between an allowed decision and its outcome, or a transaction that raised after one, left an `allow` in the
ledger that no entry said was, or was not, carried out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec, ledger_entries, start_api

from gateway.app import create_app
from gateway.decisions import reconcile
from gateway.decisions.reconcile import SETTLE_S, find_open, read_ledger
from gateway.demo import prepare_demo
from gateway.housekeeping import run_all
from gateway.settings import Settings


def reconciled(entries: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        if e["kind"] == "outcome" and e["body"].get("reconciled"):
            out.setdefault(e["body"]["decision_seq"], []).append(e["body"])
    return out


def allowed_decisions(entries: list[dict[str, Any]], action: str) -> list[int]:
    return [
        e["seq"]
        for e in entries
        if e["kind"] == "decision"
        and e["body"]["input"]["action"] == action
        and e["body"]["decision"]["effect"] == "allow"
    ]


def verify_ledger(data_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "ledger", "verify", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("OK"), done.stdout + done.stderr


def test_an_allow_left_by_a_refusal_after_deciding_is_closed_once_by_housekeeping(api: Api) -> None:
    gw = api.gateway
    # Decisions carried out: a submission (its job row is its outcome), a stop, a policy reload, a grant.
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "not needed"}).status_code == 202
    assert api.post("/v1/policy/reload", "sam").status_code == 200
    grant = {"principal": "mallory", "role": "researcher", "project": "vision", "reason": "joins vision"}
    assert api.post("/v1/roles", "erin", json=grant).status_code == 201
    # The same grant again: decided (allowed, ledgered first), then refused as already held; rolled back.
    assert api.post("/v1/roles", "erin", json=grant).status_code == 409
    entries = ledger_entries(api)
    left_open = allowed_decisions(entries, "role.manage")[-1]
    assert not [e for e in entries if e["seq"] > left_open]

    run_all(gw)  # younger than the settle time: it may still be in flight, so it is left
    assert reconciled(ledger_entries(api)) == {}
    now = gw.clock()
    gw.clock = lambda: now + timedelta(seconds=SETTLE_S + 1)
    run_all(gw)
    entries = ledger_entries(api)
    closed = reconciled(entries)
    assert list(closed) == [left_open] and len(closed[left_open]) == 1
    body = closed[left_open][0]
    request_id = next(e for e in entries if e["seq"] == left_open)["body"]["request_id"]
    assert body["request_id"] == request_id and body["action"] == "role.manage"
    assert body["result"] == "not_confirmed" and "rolled back" in body["why"]
    assert body["state_now"] == {"binding_held": True}  # held by the first grant; the second changed nothing

    size = len(entries)
    run_all(gw)  # idempotent
    assert len(ledger_entries(api)) == size


def _one_left_open(api: Api) -> int:
    """An allowed grant refused after deciding (already held), older than the settle time: open, to be closed."""
    grant = {"principal": "mallory", "role": "researcher", "project": "vision", "reason": "joins vision"}
    assert api.post("/v1/roles", "erin", json=grant).status_code == 201
    assert api.post("/v1/roles", "erin", json=grant).status_code == 409
    now = api.gateway.clock()
    api.gateway.clock = lambda: now + timedelta(seconds=SETTLE_S + 1)
    return allowed_decisions(ledger_entries(api), "role.manage")[-1]


@pytest.fixture
def sqlite_api(tmp_path: Path) -> Iterator[Api]:
    yield from start_api(Settings(data_dir=tmp_path))


def test_housekeeping_reads_the_ledger_before_it_takes_the_write_lock(sqlite_api: Api,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass rescans every young decision's range each time; on SQLite, read inside the chore's write transaction,
    that held the one write lock and kept every stop and approval waiting (76-130 ms with 1,750 jobs submitted)."""
    api = sqlite_api
    left_open = _one_left_open(api)
    real, locked = reconcile._read, []

    def reading(*args: Any) -> Any:
        locked.append(api.gateway.db.writer_busy)
        return real(*args)

    monkeypatch.setattr(reconcile, "_read", reading)
    run_all(api.gateway)
    assert locked == [False]
    assert list(reconciled(ledger_entries(api))) == [left_open]


def test_a_pass_whose_watermark_moved_after_it_read_scans_again_and_closes_nothing_twice(api: Api) -> None:
    """Another pass (another replica's) closed what this one read before its transaction: this one must not close it
    a second time."""
    left_open = _one_left_open(api)
    read = read_ledger(api.gateway)
    assert [d.seq for d in read.scan.open] == [left_open]
    run_all(api.gateway)  # the other pass: closes it, moves the watermark
    with api.gateway.transaction() as session:
        assert reconcile.reconcile(api.gateway, session, read=read) == 0
    assert {seq: len(bodies) for seq, bodies in reconciled(ledger_entries(api)).items()} == {left_open: 1}


DIES_AFTER_DECIDING = textwrap.dedent("""
    import os, sys
    from gateway.identity.auth import Caller
    from gateway.bootstrap import open_gateway
    from gateway.jobs.records import load_job
    from gateway.decisions.pipeline import decide
    from gateway.settings import Settings

    gw = open_gateway(Settings())
    alice = Caller(id="alice", kind="person", token_id="t", token_projects=("*",), token_actions=("*",))
    with gw.transaction() as session:
        job = load_job(session, sys.argv[1], for_update=True)
        rec = decide(gw, session, alice, "job.stop", targets=[job], project=job.project, reason="dies now")
        print(rec.decision.effect, rec.seq, flush=True)
        os._exit(9)  # the process dies between the decision and its outcome
""")


def test_a_gateway_that_died_after_deciding_closes_the_decision_at_start_up(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    prepare_demo(settings)
    tokens = json.loads((tmp_path / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"}).status_code == 202
        other = api.post("/v1/jobs", "alice", json=job_spec(name="train-b")).json()["id"]
    died = subprocess.run(
        [sys.executable, "-c", DIES_AFTER_DECIDING, other],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JOBGATE_DATA_DIR": str(tmp_path)},
    )
    assert died.returncode == 9, died.stderr
    effect, seq = died.stdout.split()
    assert effect == "allow"

    with TestClient(create_app(settings, run_scheduler=False)) as client:  # start-up, nothing in flight
        api = Api(client, tokens, settings)
        entries = ledger_entries(api)
        closed = reconciled(entries)
        assert list(closed) == [int(seq)] and len(closed[int(seq)]) == 1
        assert closed[int(seq)][0]["state_now"] == {"jobs": {other: "pending"}}  # the stop never happened
        assert api.get(f"/v1/jobs/{other}", "alice").json()["state"] == "pending"
    with TestClient(create_app(settings, run_scheduler=False)) as client:  # a second start-up adds nothing
        assert reconciled(ledger_entries(Api(client, tokens, settings))) == closed
    verify_ledger(tmp_path)


def _decision(seq: int, action: str, effect: str, request_id: str, at: str = "2025-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "seq": seq,
        "time": at,
        "kind": "decision",
        "body": {"request_id": request_id, "input": {"action": action}, "decision": {"effect": effect}},
    }


def test_which_decisions_are_open() -> None:
    """Cited by decision_seq or by request_id (a transition), or expecting nothing (deny, needs_approval, a
    read): not open. Too young: left, and the next scan resumes there."""
    from datetime import UTC, datetime

    entries = [
        _decision(0, "job.stop", "allow", "r0"),
        {"seq": 1, "time": "2025-01-01T00:00:00Z", "kind": "transition", "body": {"request_id": "r0"}},
        _decision(2, "quota.change", "allow", "r2"),
        {"seq": 3, "time": "2025-01-01T00:00:00Z", "kind": "outcome", "body": {"decision_seq": 2}},
        _decision(4, "job.stop", "deny", "r4"),
        _decision(5, "job.stop", "needs_approval", "r5"),
        _decision(6, "ledger.read", "allow", "r6"),
        _decision(7, "job.pause", "allow", "r7"),
        _decision(8, "job.resume", "allow", "r8", at="2025-01-01T00:10:00Z"),
    ]
    scan = find_open(entries, settled_before=datetime(2025, 1, 1, 0, 5, tzinfo=UTC))
    assert [d.seq for d in scan.open] == [7] and scan.resume_at == 8


def _entry(seq: int, kind: str, **body: Any) -> dict[str, Any]:
    return {"seq": seq, "time": "2025-01-01T00:00:00Z", "kind": kind, "body": body}


def test_a_decision_whose_outcome_was_retracted_is_open_again() -> None:
    """An outcome retracted by a `rolled_back` entry says nothing was done: the decision it closed is open again,
    unless another entry citing it stands. A young decision holds the watermark even once closed: the
    retraction of its outcome may still come."""
    from datetime import UTC, datetime

    entries = [
        _decision(0, "job.stop", "allow", "r0"),
        _entry(1, "outcome", decision_seq=0, request_id="r0", result="stop_requested"),
        _entry(2, "transition", request_id="r0"),
        _entry(3, "outcome", result="rolled_back", retracts=[1, 2]),
        _decision(4, "quota.change", "allow", "r4"),
        _entry(5, "outcome", decision_seq=4),
        _entry(6, "outcome", decision_seq=4, result="notified"),
        _entry(7, "outcome", result="rolled_back", retracts=[6]),  # one of two retracted: 4 stays closed
        _decision(8, "job.pause", "allow", "r8", at="2025-01-01T00:10:00Z"),
        _entry(9, "outcome", decision_seq=8),
    ]
    scan = find_open(entries, settled_before=datetime(2025, 1, 1, 0, 5, tzinfo=UTC))
    assert [(d.seq, d.retracted_by) for d in scan.open] == [(0, 3)] and scan.resume_at == 8
    assert "retracted (seq 3)" in scan.open[0].why
    # Once closed again (as the pass does), it stays closed.
    closed = [*entries, _entry(10, "outcome", decision_seq=0, result="not_confirmed")]
    assert find_open(closed, settled_before=datetime(2025, 1, 1, 0, 5, tzinfo=UTC)).open == []
