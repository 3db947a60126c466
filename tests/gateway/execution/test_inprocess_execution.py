"""The in-process implementation of the execution port (gateway/execution/inprocess.py) carries a job through its
whole life behind the real API, with no node agent and nothing patched: placed and started, stopped with its
prepare signal and a graceful exit that names its checkpoint, paused and resumed, deleted and its files removed,
ended on its own; and it is whole where the port asks for it (a gang placed whole or not at all, what runs, where
a job's files are)."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_testkit import Api, job_spec, ledger_entries
from stop_helpers import shift_clock

from gateway.demo import DEMO_NODES
from gateway.execution.inprocess import InProcessExecution
from gateway.jobs import lifecycle
from gateway.store.models import Allocation, Job


@pytest.fixture
def api(inproc_api: Api) -> Api:
    return inproc_api


def executor(api: Api) -> InProcessExecution:
    execution = api.gateway.execution
    assert isinstance(execution, InProcessExecution)
    return execution


def runs(api: Api) -> list[tuple[str, str, int]]:
    """What the executor says runs: (job, node, GPUs) per part."""
    with api.gateway.transaction(immediate=False) as session:
        return [(p.job_id, p.node, len(p.gpus)) for p in executor(api).running(session)]


def submit(api: Api, who: str = "alice", **spec: Any) -> str:
    r = api.post("/v1/jobs", who, json=job_spec(**spec))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def state(api: Api, job_id: str) -> dict[str, Any]:
    r = api.get(f"/v1/jobs/{job_id}", "alice")
    assert r.status_code == 200, r.text
    return dict(r.json())


def transitions(api: Api, job_id: str) -> list[str]:
    return [e["body"]["state_after"] for e in ledger_entries(api)
            if e["kind"] == "transition" and e["body"].get("job_id") == job_id and "state_after" in e["body"]]


def test_the_walk_through_runs_in_process_submit_refused_stop_owners_graceful_stop(api: Api) -> None:
    job_id = submit(api)
    executor(api).run()
    running = state(api, job_id)
    assert running["state"] == "running" and running["placement"][0]["node"] == "demo-node-1"
    assert runs(api) == [(job_id, "demo-node-1", 2)]

    refused = api.post(f"/v1/jobs/{job_id}/stop", "mallory", json={"reason": "I need the GPUs"})
    assert refused.status_code == 403, refused.text
    (denied,) = [e for e in ledger_entries(api) if e["kind"] == "decision" and e["body"]["actor"]["id"] == "mallory"]
    assert denied["body"]["decision"]["effect"] == "deny"

    asked = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done for today"})
    assert asked.status_code == 202, asked.text
    assert state(api, job_id)["state"] == "stop_requested"  # nothing is carried out before the executor acts
    executor(api).run()
    stopped = state(api, job_id)
    assert (stopped["state"], stopped["outcome"]) == ("stopped", "graceful")
    (node,) = stopped["evidence"]["nodes"].values()
    (checkpoint,) = node["checkpoints"]
    assert checkpoint["path"].endswith(".ckpt") and len(checkpoint["sha256"]) == 64
    assert node["signal"] == "SIGTERM" and node["process_group_gone"] is True
    assert transitions(api, job_id)[-4:] == ["running", "stop_requested", "stopping", "stopped"]
    assert runs(api) == []
    with api.gateway.db.transaction() as session:
        assert all(p.released for p in session.query(Allocation).filter_by(job_id=job_id))


def test_a_gang_is_placed_whole_or_waits_and_runs_once_the_gpus_are_free(api: Api) -> None:
    first = submit(api, gpus_per_node=8, nodes=2)
    second = submit(api, gpus_per_node=8, nodes=2)
    executor(api).run()
    assert sorted(p["node"] for p in state(api, first)["placement"]) == list(DEMO_NODES)
    assert state(api, second)["state"] == "pending"  # no part of it holds a GPU meanwhile (Q6, Q7)
    assert api.post(f"/v1/jobs/{first}/stop", "alice", json={"reason": "make room"}).status_code == 202
    executor(api).run()
    assert state(api, first)["state"] == "stopped"
    assert state(api, second)["state"] == "running"


def test_pause_keeps_the_checkpoint_and_resume_runs_the_job_again(api: Api) -> None:
    job_id = submit(api)
    executor(api).run()
    assert api.post(f"/v1/jobs/{job_id}/pause", "alice", json={"reason": "fix the loader"}).status_code == 202
    executor(api).run()
    paused = state(api, job_id)
    assert (paused["state"], paused["outcome"]) == ("paused", "graceful")
    assert paused["checkpoint_retention"]["state"] == "kept"
    assert api.post(f"/v1/jobs/{job_id}/resume", "alice", json={"reason": "fixed"}).status_code == 200
    assert state(api, job_id)["state"] == "pending"
    executor(api).run()
    assert state(api, job_id)["state"] == "running"
    assert state(api, job_id)["checkpoint_retention"]["state"] == "in_use"


def test_a_deleted_jobs_files_are_removed_where_it_ran_after_its_recovery_window(api: Api) -> None:
    job_id = submit(api)
    executor(api).run()
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    executor(api).run()
    asked = api.client.request("DELETE", f"/v1/jobs/{job_id}", headers=api.headers("alice"),
                               json={"reason": "trained on the wrong data"})
    assert asked.status_code == 202, asked.text
    approved = api.post(f"/v1/approvals/{asked.json()['approval_id']}/approve", "carol")
    assert approved.status_code == 200, approved.text
    with api.gateway.transaction() as session:
        job = session.get(Job, job_id)
        assert executor(api).holders(session, job) == ["demo-node-1"]
    shift_clock(api, lifecycle.recovery_window(api.gateway).total_seconds() + 1)
    lifecycle.run_chores(api.gateway)
    executor(api).run()
    removed = sorted(e["body"]["object"]["path"] for e in ledger_entries(api)
                     if e["kind"] == "deletion" and "object" in e["body"])
    assert len(removed) == 2 and removed[0].startswith("checkpoints/") and removed[1] == f"logs/{job_id}.log"
    assert any(e["body"].get("action") == "purged" for e in ledger_entries(api) if e["kind"] == "deletion")


@pytest.mark.parametrize(("exit_code", "ended"), [(0, "succeeded"), (3, "failed")], ids=["exit-0", "exit-3"])
def test_a_job_that_ends_on_its_own_ends_as_its_exit_code_says(api: Api, exit_code: int, ended: str) -> None:
    job_id = submit(api)
    executor(api).run()
    executor(api).finish(job_id, exit_code)
    done = state(api, job_id)
    assert (done["state"], done["exit_code"]) == (ended, exit_code)
    assert runs(api) == []
