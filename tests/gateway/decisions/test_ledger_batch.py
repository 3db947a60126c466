"""Outcome entries of one decided action reach the ledger together, in order, before the commit."""

from __future__ import annotations

import pytest
from approval_testkit import ask_stop, job_state, running_job
from gateway_testkit import Api, job_spec, ledger_entries
from sqlalchemy.orm import Session

from gateway.decisions.pipeline import decide, ledger_batch, record
from gateway.decisions.transaction import QUEUED_ENTRIES
from gateway.errors import LedgerUnavailable
from gateway.identity.auth import Caller, authenticate
from gateway.jobs.records import load_job
from ledger.errors import StoreError


def gw_caller(api: Api, session: Session, who: str) -> Caller:
    return authenticate(session, f"Bearer {api.tokens[who]}", trigger=None, source={}, now=api.gateway.clock())



@pytest.fixture
def api(inproc_api: Api) -> Api:
    """Jobs here run on the in-process executor: what is tested is the decision, not the node agents."""
    return inproc_api

def test_entries_wait_for_the_end_of_the_block_and_go_in_one_group_commit(api: Api) -> None:
    gw = api.gateway
    size, batches = gw.ledger.size(), gw.ledger.stats.batches
    with gw.transaction() as session, ledger_batch(gw, session):
        assert record(gw, session, "outcome", {"step": 1}) == -1
        assert record(gw, session, "outcome", {"step": 2}) == -1
        assert gw.ledger.size() == size  # nothing yet
    assert gw.ledger.size() == size + 2
    assert gw.ledger.stats.batches == batches + 1
    assert [gw.ledger.entry(size + i).value["body"]["step"] for i in (0, 1)] == [1, 2]


def test_a_block_that_raises_appends_nothing(api: Api) -> None:
    gw = api.gateway
    size = gw.ledger.size()
    with pytest.raises(RuntimeError), gw.transaction() as session, ledger_batch(gw, session):
        record(gw, session, "outcome", {"result": "executed"})
        raise RuntimeError("the change failed; its outcome must not claim otherwise")
    assert gw.ledger.size() == size


class Unwritten:
    """What Ledger.enqueue hands back for an entry whose write then fails."""

    seq = -1
    waited = False

    def wait(self) -> None:
        raise StoreError("disk full")


def test_a_ledger_that_cannot_write_refuses_the_block(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = api.gateway
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    monkeypatch.setattr(gw.ledger, "enqueue_many", lambda entries, after=(): [Unwritten() for _ in entries])
    with pytest.raises(LedgerUnavailable, match="disk full"), gw.transaction() as session, \
            ledger_batch(gw, session):
        load_job(session, job_id).state = "stopped"
        record(gw, session, "outcome", {"result": "executed"})
    assert job_state(api, job_id) == "pending"


def test_outside_a_gateway_transaction_the_block_waits_for_its_entries(api: Api,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    gw = api.gateway

    def broken(entries: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(gw.ledger, "append_many", broken)
    with pytest.raises(LedgerUnavailable, match="disk full"), gw.db.transaction() as session, \
            ledger_batch(gw, session):
        record(gw, session, "outcome", {"result": "executed"})


def test_an_approved_stop_records_its_outcomes_after_the_decision_in_one_commit(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    gw = api.gateway
    size, batches = gw.ledger.size(), gw.ledger.stats.batches
    assert api.post(f"/v1/approvals/{approval_id}/approve", "alice").status_code == 200
    new = ledger_entries(api)[size:]
    kinds = [(e["kind"], e["body"].get("action") or e["body"].get("state_after")) for e in new]
    assert kinds == [("decision", None), ("transition", "stop_requested"), ("outcome", "job.stop"),
                     ("outcome", "job.stop")], kinds
    assert new[-1]["body"]["result"] == "executed" and new[-1]["body"]["approval_id"] == approval_id
    # The outcomes are queued behind the re-decision without waiting for it: they share its batch, or
    # follow it together in the next.
    assert gw.ledger.stats.batches - batches in (1, 2)


def test_a_decision_is_queued_until_the_transaction_needs_it_durable(api: Api) -> None:
    gw = api.gateway
    job_id = running_job(api)
    size = gw.ledger.size()
    with gw.transaction() as session:
        job = load_job(session, job_id)
        rec = decide(gw, session, gw_caller(api, session, "carol"), "job.stop", targets=[job], project="vision",
                     reason="queued, not waited for", durable_by_commit=True)
        assert rec.seq == size
        assert [t.seq for t in session.info[QUEUED_ENTRIES]] == [size]  # nobody has waited for it yet
        record(gw, session, "outcome", {"decision_seq": rec.seq})  # cites it: waits for it first
        assert session.info[QUEUED_ENTRIES] == []
    assert [e["kind"] for e in ledger_entries(api)[size:]] == ["decision", "outcome"]


def test_outcomes_are_queued_behind_their_decision_without_waiting_for_it(api: Api) -> None:
    gw = api.gateway
    job_id = running_job(api)
    size = gw.ledger.size()
    with gw.transaction() as session:
        job = load_job(session, job_id)
        rec = decide(gw, session, gw_caller(api, session, "carol"), "job.stop", targets=[job], project="vision",
                     reason="outcomes follow at once", durable_by_commit=True)
        with ledger_batch(gw, session):
            record(gw, session, "outcome", {"decision_seq": rec.seq})
        # Nothing has been waited for yet: the transaction waits for both before it commits.
        assert [t.seq for t in session.info[QUEUED_ENTRIES]] == [size, size + 1]
    entries = ledger_entries(api)[size:]
    assert [e["kind"] for e in entries] == ["decision", "outcome"]
    assert entries[1]["body"]["decision_seq"] == entries[0]["seq"] == size


def test_a_stop_whose_queued_decision_is_not_written_changes_nothing(api: Api,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    gw = api.gateway
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    size = gw.ledger.size()

    monkeypatch.setattr(gw.ledger, "enqueue_many", lambda entries, after=(): [Unwritten() for _ in entries])
    r = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "wrong config"})
    assert r.status_code == 503 and "disk full" in r.json()["detail"], r.text
    assert job_state(api, job_id) == "pending"
    assert gw.ledger.size() == size  # no transition or outcome citing a decision that is not there
