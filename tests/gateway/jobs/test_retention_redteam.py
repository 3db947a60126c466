"""Red team: checkpoint retention (P1) and deletion with a recovery window (A6): files go where they are."""

from __future__ import annotations

from typing import Any

from gateway_testkit import Api, job_spec, ledger_entries
from stop_helpers import FakeAgent, ledger, running_job, shift_clock, stopped_evidence

from gateway.decisions.policy.engine import RoleBinding
from gateway.jobs import lifecycle
from gateway.native.scheduler_loop import run_once
from gateway.store.stop_tables import CheckpointRetention, JobDeletion

CKPT = [{"path": "checkpoints/step-9.ckpt", "size": 7, "mtime": 1.0, "sha256": "ab" * 32}]


def _paused_resumed_and_cancelled(api: Api, agent: FakeAgent) -> str:
    """A job paused on demo-node-1 (its checkpoint stays there), resumed, then stopped while still queued."""
    job_id, _ = running_job(api, agent)
    assert api.post(f"/v1/jobs/{job_id}/pause", "alice", json={"reason": "make room"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    assert api.post(f"/v1/jobs/{job_id}/resume", "alice", json={"reason": "back"}).status_code == 200
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "not needed"}).status_code == 202
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stopped"
    return job_id


def test_a_purge_reaches_the_node_that_holds_the_files_of_an_earlier_run(api: Api, agent: FakeAgent) -> None:
    """The purge asked the nodes of the job's current placement, which a resume (or a requeue after preemption)
    empties. A job stopped while queued again had none: after the recovery window it was marked purged with no
    command sent and no object deleted, while its checkpoint stayed on the node of its paused run."""
    api.gateway.policy.grant(RoleBinding(principal="carol", role="queue_admin", project="acme"))
    job_id = _paused_resumed_and_cancelled(api, agent)
    r = api.client.request("DELETE", f"/v1/jobs/{job_id}", headers=api.headers("alice"), json={"reason": "gone"})
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "carol").status_code == 200
    shift_clock(api, lifecycle.recovery_window(api.gateway).total_seconds() + 1)
    lifecycle.run_chores(api.gateway)
    (purge,) = [c for c in agent.take() if c["kind"] == "delete_artifacts"]
    assert purge["job_id"] == job_id and purge["params"]["what"] == "all"
    with api.gateway.db.transaction() as s:
        assert s.get(JobDeletion, job_id).state == "purging"
    agent.report(job_id, "deleted", purge["nonce"], evidence={"deleted": CKPT, "what": "all",
                                                               "reason": purge["params"]["reason"]})
    with api.gateway.db.transaction() as s:
        assert s.get(JobDeletion, job_id).state == "purged"
    purged = [e["body"] for e in ledger(api) if e["kind"] == "deletion" and e["body"].get("action") == "purged"]
    assert [p["objects"] for p in purged] == [1]


def test_retention_cleanup_reaches_the_node_of_a_paused_run_the_job_left(api: Api, agent: FakeAgent) -> None:
    """P1: a job paused on one node and resumed on another keeps a checkpoint on each; when its retention ends
    (here: the next job on its quota starts), cleanup asked only the node of its last run."""
    paused, _ = running_job(api, agent, gpus_per_node=8)
    assert api.post(f"/v1/jobs/{paused}/pause", "alice", json={"reason": "make room"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(paused, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    running_job(api, agent, gpus_per_node=8)  # demo-node-1 is full now
    second = FakeAgent(api, "demo-node-2")
    second.beat()
    second.take()
    assert api.post(f"/v1/jobs/{paused}/resume", "alice", json={"reason": "back"}).status_code == 200
    run_once(api.gateway)
    (start,) = [c for c in second.take() if c["kind"] == "start"]
    second.report(paused, "started", start["nonce"], pid=9)
    assert api.post(f"/v1/jobs/{paused}/stop", "alice", json={"reason": "enough"}).status_code == 202
    (stop,) = [c for c in second.take() if c["kind"] == "stop"]
    second.report(paused, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    assert api.get(f"/v1/jobs/{paused}", "alice").json()["state"] == "stopped"
    running_job(api, second, gpus_per_node=8)  # the next job on quota vision starts
    lifecycle.run_chores(api.gateway)
    cleanups = [c for a in (agent, second) for c in a.take() if c["kind"] == "delete_artifacts"]
    assert sorted(c["node"] for c in cleanups) == ["demo-node-1", "demo-node-2"]
    assert {c["job_id"] for c in cleanups} == {paused} and {c["params"]["what"] for c in cleanups} == {"checkpoints"}


def test_a_resumed_job_stopped_before_it_ran_again_puts_its_checkpoint_back_under_retention(api: Api,
                                                                                           agent: FakeAgent) -> None:
    """The resume marks the paused run's checkpoint in use (the new run reads it). Stopped while still queued, the
    job never ran again, but the checkpoint stayed in use for ever: no retention tier ever cleaned it (P1)."""
    job_id = _paused_resumed_and_cancelled(api, agent)
    with api.gateway.db.transaction() as s:
        assert s.get(CheckpointRetention, job_id).state == "kept"
    kept = [e["body"] for e in ledger(api) if e["kind"] == "retention" and e["body"]["job_id"] == job_id]
    assert len(kept) == 2 and kept[-1]["tier"] == "normal"
    running_job(api, agent)  # the next job on quota vision starts
    lifecycle.run_chores(api.gateway)
    (cleanup,) = [c for c in agent.take() if c["kind"] == "delete_artifacts"]
    assert cleanup["job_id"] == job_id and cleanup["params"]["what"] == "checkpoints"


def _gang_cleanup(api: Api, agent: FakeAgent) -> tuple[str, dict[str, tuple[FakeAgent, dict[str, Any]]]]:
    """A two-node job stopped with a checkpoint on each node, then the next job on its quota starts: its retention
    cleanup is sent to both nodes. Returns the job id and, per node, its agent and the cleanup command."""
    second = FakeAgent(api, "demo-node-2")
    second.beat()
    second.take()
    agents = {"demo-node-1": agent, "demo-node-2": second}
    r = api.post("/v1/jobs", "alice", json=job_spec(nodes=2, gpus_per_node=8))
    job_id = r.json()["id"]
    run_once(api.gateway)
    for a in agents.values():
        (start,) = [c for c in a.take() if c["kind"] == "start"]
        a.report(job_id, "started", start["nonce"], pid=7)
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "enough"}).status_code == 202
    for a in agents.values():
        (stop,) = [c for c in a.take() if c["kind"] == "stop"]
        a.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stopped"
    running_job(api, agent)  # the next job on quota vision starts
    lifecycle.run_chores(api.gateway)
    sent = {}
    for node, a in agents.items():
        (cleanup,) = [c for c in a.take() if c["kind"] == "delete_artifacts"]
        assert cleanup["job_id"] == job_id and cleanup["params"]["what"] == "checkpoints"
        sent[node] = (a, cleanup)
    return job_id, sent


def _retention_state(api: Api, job_id: str) -> str:
    with api.gateway.db.transaction() as s:
        return s.get(CheckpointRetention, job_id).state


def _deleted(a: FakeAgent, job_id: str, cleanup: dict[str, Any], left: list[str] | None = None) -> None:
    a.report(job_id, "deleted", cleanup["nonce"], evidence={"deleted": CKPT, "what": "checkpoints",
                                                            "reason": cleanup["params"]["reason"],
                                                            **({"left": left} if left else {})})


def test_a_gang_jobs_cleanup_is_over_only_once_every_node_has_reported(api: Api, agent: FakeAgent) -> None:
    """P1: the retention of a job run on several nodes was marked cleaned as soon as the first node reported,
    while the other nodes' checkpoints were still there (or never removed). A purge waits for every node."""
    job_id, sent = _gang_cleanup(api, agent)
    assert _retention_state(api, job_id) == "cleaning"
    _deleted(sent["demo-node-1"][0], job_id, sent["demo-node-1"][1])
    assert _retention_state(api, job_id) == "cleaning"
    _deleted(sent["demo-node-2"][0], job_id, sent["demo-node-2"][1])
    assert _retention_state(api, job_id) == "cleaned"
    # P1: the cleanup is audited to its end, not only its start and the objects each node removed.
    kept = [e["body"] for e in ledger_entries(api) if e["kind"] == "retention" and e["body"].get("job_id") == job_id]
    (done,) = [b for b in kept if b.get("action") == "cleaned"]
    assert done["nodes"] == ["demo-node-1", "demo-node-2"] and done["tier"] == "normal", done


def test_a_gang_jobs_cleanup_stays_open_while_a_node_left_files_behind(api: Api, agent: FakeAgent) -> None:
    """A node that could not remove everything keeps the cleanup open (a person must look), whichever node
    reports last."""
    job_id, sent = _gang_cleanup(api, agent)
    _deleted(sent["demo-node-2"][0], job_id, sent["demo-node-2"][1], left=["checkpoints/step-9.ckpt"])
    assert _retention_state(api, job_id) == "cleaning"
    _deleted(sent["demo-node-1"][0], job_id, sent["demo-node-1"][1])
    assert _retention_state(api, job_id) == "cleaning"


def test_a_jobs_answer_says_whether_its_checkpoints_are_still_kept(api: Api, agent: FakeAgent) -> None:
    """`job show` kept listing a normal-tier checkpoint as evidence after retention had removed it from the node
    (the next job on the quota started): nothing in the job said it was gone."""
    job_id, _ = running_job(api, agent, gpus_per_node=8)
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done for today"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    kept = api.get(f"/v1/jobs/{job_id}", "alice").json()["checkpoint_retention"]
    assert (kept["tier"], kept["state"], kept["until_next_job_on_quota"]) == ("normal", "kept", "vision")
    running_job(api, agent, gpus_per_node=8)  # the next job on quota vision starts
    lifecycle.run_chores(api.gateway)
    (cleanup,) = [c for c in agent.take() if c["kind"] == "delete_artifacts"]
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["checkpoint_retention"]["state"] == "cleaning"
    _deleted(agent, job_id, cleanup)
    gone = api.get(f"/v1/jobs/{job_id}", "alice").json()["checkpoint_retention"]
    assert gone["state"] == "cleaned" and gone["cleaned_at"] is not None
    assert all(j["checkpoint_retention"] is None for j in api.get("/v1/jobs", "alice").json()["jobs"])  # one job
