"""The stop state machine (C3), command acknowledgement and node health, over the real API with a scripted agent."""

from __future__ import annotations

import nacl.signing
import pytest
from gateway_testkit import Api
from stop_helpers import FakeAgent, gpus_used, ledger, notices, running_job, shift_clock, stopped_evidence, transitions

from gateway.native import agents
from gateway.native.scheduler_loop import run_once
from nodeagent.protocol import verify_command


@pytest.fixture
def agent(api: Api) -> FakeAgent:
    a = FakeAgent(api, "demo-node-1")
    a.beat()
    return a


@pytest.fixture
def settled(agent: FakeAgent) -> FakeAgent:
    """An agent whose start-up reconcile was carried out and acknowledged, as a real agent does."""
    (rec,) = agent.take()
    agent.report("", "reconciled", rec["nonce"], detail="0 running, 0 to stop, 0 missing")
    return agent


def test_agent_start_gets_a_signed_reconcile(api: Api, agent: FakeAgent) -> None:
    (cmd,) = agent.take()
    assert cmd["kind"] == "reconcile" and cmd["params"] == {"expected": [], "stop": [], "pending": []}
    pub = nacl.signing.VerifyKey(bytes(api.gateway.command_key.verify_key))
    verified = verify_command(cmd["envelope"], pub, node="demo-node-1", now=cmd["issued_at"],
                              seen_nonce=lambda _n: False)
    assert verified.nonce == cmd["nonce"]


def test_every_step_is_ledgered_and_stopped_needs_evidence(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent)
    assert gpus_used(api, "demo-node-1") == 2
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "enough"}).status_code == 202
    (stop,) = agent.take()
    assert stop["kind"] == "stop" and stop["job_id"] == job_id
    agent.report(job_id, "stopping", stop["nonce"], evidence={"signal": "SIGTERM"})
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stopping"
    # The node says the group survived SIGKILL: not stopped, GPUs withheld, a person is asked.
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(gone=False, outcome="forced"))
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "stop_failed" and "still alive" in job["state_reason"]
    assert gpus_used(api, "demo-node-1") == 2
    assert any(n["kind"] == "stop_failed" and n["body"]["job_id"] == job_id for n in notices(api, "dave"))
    assert any(n["kind"] == "stop_failed" for n in notices(api, "alice"))  # the owner hears of it too

    # Only on-call confirms, with a reason; then the GPUs are released and the step is ledgered.
    assert api.post(f"/v1/jobs/{job_id}/confirm-stopped", "alice", json={"reason": "looks dead"}).status_code == 403
    assert api.post(f"/v1/jobs/{job_id}/confirm-stopped", "dave", json={}).status_code == 422
    r = api.post(f"/v1/jobs/{job_id}/confirm-stopped", "dave", json={"reason": "checked on the node: gone"})
    assert r.status_code == 200, r.text
    done = r.json()["job"]
    assert done["state"] == "stopped" and done["outcome"] == "confirmed"
    assert done["evidence"]["confirmed_by"] == "dave"
    assert gpus_used(api, "demo-node-1") == 0
    assert transitions(api, job_id) == ["running", "stop_requested", "stopping", "stop_failed", "stopped"]
    again = api.post(f"/v1/jobs/{job_id}/confirm-stopped", "dave", json={"reason": "again"})
    assert again.status_code == 409 and again.headers["content-type"].startswith("application/problem+json")


def test_graceful_evidence_releases_gpus(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent)
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "enough"})
    (stop,) = agent.take()
    agent.report(job_id, "stopping", stop["nonce"])
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence())
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "stopped" and job["outcome"] == "graceful"
    assert job["evidence"]["gpus_released"] is True and job["evidence"]["process_groups_gone"] is True
    assert gpus_used(api, "demo-node-1") == 0


def test_unconfirmed_stop_escalates_once_and_never_retries(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent, grace_seconds=5)
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "enough"})
    (stop,) = agent.take()
    agent.report(job_id, "stopping", stop["nonce"])  # then silence, although heartbeats go on
    shift_clock(api, 5 + 31)
    agent.beat(running=[job_id])
    run_once(api.gateway)
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "stop_failed" and "not confirmed within 5s grace + 30s margin" in job["state_reason"]
    run_once(api.gateway)
    assert transitions(api, job_id).count("stop_failed") == 1
    assert agent.take() == []  # no silent retry: nothing new is sent


def test_an_overdue_stop_escalates_though_a_fresher_stop_is_still_within_its_window(
    api: Api, settled: FakeAgent
) -> None:
    """Every overdue stop was judged by the time of the last stop in the query: a stop asked for just now kept
    all older unconfirmed ones from escalating, and each new stop pushed their escalation back again."""
    agent = settled
    old, _ = running_job(api, agent, grace_seconds=5)
    fresh, _ = running_job(api, agent, grace_seconds=5)
    api.post(f"/v1/jobs/{old}/stop", "alice", json={"reason": "enough"})
    agent.take()  # the stop command, never answered
    shift_clock(api, 5 + 31)
    agent.beat(running=[old, fresh])
    api.post(f"/v1/jobs/{fresh}/stop", "alice", json={"reason": "this one too"})
    run_once(api.gateway)
    assert api.get(f"/v1/jobs/{old}", "alice").json()["state"] == "stop_failed"
    assert api.get(f"/v1/jobs/{fresh}", "alice").json()["state"] == "stop_requested"


@pytest.mark.parametrize("code", ["abc", [1], 1.5, True, 2**70])
def test_an_exit_code_that_is_no_exit_status_is_refused_and_the_job_stays_readable(
    api: Api, settled: FakeAgent, code: object
) -> None:
    """A string, list or huge number was a 500 that rolled back the agent's whole batch of reports; a float
    was stored on SQLite, and every read of the job (and of the job list) then failed with a 500."""
    job_id, nonce = running_job(api, settled)
    body = {"reports": [{"job_id": job_id, "event": "exited", "nonce": nonce, "pid": 4242,
                         "at": api.gateway.clock().timestamp(), "evidence": {"exit_code": code}}]}
    r = api.client.post(f"/v1/agents/{settled.node}/reports", json=body, headers=settled._headers())
    assert r.status_code == 422 and "evidence.exit_code must be an integer" in r.text, r.text
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "running"
    assert api.get("/v1/jobs", "alice").status_code == 200
    settled.report(job_id, "exited", nonce, pid=4242, evidence={"exit_code": -9, "process_group_gone": True})
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["exit_code"] == -9


def test_an_exit_without_an_exit_status_says_so_and_never_exit_code_none(api: Api, settled: FakeAgent) -> None:
    """A process gone before its agent could read its status (an agent restarted under it, say) is reported with
    no exit code: the job's history and the ledger read "exit code None"."""
    job_id, nonce = running_job(api, settled)
    settled.report(job_id, "exited", nonce, pid=4242, evidence={"process_group_gone": True})
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "failed" and job["exit_code"] is None
    ended = [e for e in ledger(api) if e["kind"] == "transition" and e["body"].get("job_id") == job_id][-1]
    assert ended["body"]["reason"] == job["history"][-1]["reason"] == "its node reported no exit status"


def test_commands_are_resent_until_acknowledged(api: Api, agent: FakeAgent) -> None:
    (first,) = agent.take()
    assert agent.take() == []  # handed out, not yet due again
    shift_clock(api, agents.RESEND_AFTER_S + 1)
    (again,) = agent.take()
    assert again["envelope"] == first["envelope"]  # the very same signed envelope, same nonce
    # A reconcile stops jobs: a "rejected" answer, even `replayed`, never acknowledges it, so it goes out again.
    agent.report("", "rejected", first["nonce"], detail="replayed: nonce already used")
    shift_clock(api, agents.RESEND_AFTER_S + 1)
    (third,) = agent.take()
    assert third["nonce"] == first["nonce"]
    # The agent's `reconciled` does.
    agent.report("", "reconciled", first["nonce"], detail="0 running, 0 to stop, 0 missing")
    shift_clock(api, agents.RESEND_AFTER_S + 1)
    assert agent.take() == []
    refusals = [e["body"] for e in ledger(api) if e["kind"] == "agent_report"]
    assert refusals[-1]["acknowledgement"] is False and refusals[-1]["stop_resent"] is True
    assert not any(n["kind"] == "command_rejected" for n in notices(api, "dave"))  # the agent has it: no alarm


def test_rejected_report_without_job_or_nonce_is_recorded_and_alerted(api: Api, agent: FakeAgent) -> None:
    agent.report("", "rejected", None, detail="forged: signature does not verify under the gateway command key")
    (entry,) = [e["body"] for e in ledger(api) if e["kind"] == "agent_report"]
    assert entry["job_id"] is None and entry["nonce"] is None and entry["detail"].startswith("forged")
    assert any(n["kind"] == "command_rejected" for n in notices(api, "dave"))


def test_unknown_process_is_reported_not_stopped(api: Api, settled: FakeAgent) -> None:
    agent = settled
    agent.report("stray-job", "unknown", None, pid=777, detail="running on this node but not expected")
    entry = [e["body"] for e in ledger(api) if e["kind"] == "agent_report"][-1]
    assert entry["event"] == "unknown" and entry["known_job"] is False and entry["pid"] == 777
    assert any(n["kind"] == "unknown_process" for n in notices(api, "dave"))
    assert agent.take() == []


def test_lost_node_withholds_gpus_then_reconciles_when_it_returns(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent)
    shift_clock(api, api.settings.node_heartbeat_timeout_s + 1)
    run_once(api.gateway)
    assert {n["id"]: n["state"] for n in api.get("/v1/nodes", "dave").json()["nodes"]}["demo-node-1"] == "lost"
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "lost" and "GPUs withheld" in job["state_reason"]
    assert gpus_used(api, "demo-node-1") == 2
    assert any(n["kind"] == "node_lost" for n in notices(api, "dave"))
    node_entries = [e["body"] for e in ledger(api) if e["kind"] == "node"]
    assert any(b.get("state_after") == "lost" and b["node"] == "demo-node-1" for b in node_entries)

    # It returns with the job still running: running again, and a reconcile that expects it.
    agent.beat(running=[job_id])
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "running"
    (rec,) = agent.take()
    assert rec["kind"] == "reconcile" and rec["params"] == {"expected": [job_id], "stop": [], "pending": []}
    assert transitions(api, job_id)[-2:] == ["lost", "running"]


def test_on_call_confirms_a_lost_job_and_the_returning_node_is_told_to_stop_it(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent)
    shift_clock(api, api.settings.node_heartbeat_timeout_s + 1)
    run_once(api.gateway)
    r = api.post(f"/v1/jobs/{job_id}/confirm-stopped", "dave", json={"reason": "node is being reimaged"})
    assert r.status_code == 200 and r.json()["job"]["state"] == "stopped"
    assert gpus_used(api, "demo-node-1") == 0
    agent.instance = "inst-2"  # the agent restarted while away
    agent.beat(running=[job_id])
    (rec,) = agent.take()
    assert rec["params"] == {"expected": [], "stop": [job_id], "pending": []}
    # The node's late evidence is kept, the job stays as the person confirmed it.
    agent.report(job_id, "stopped", rec["nonce"], evidence=stopped_evidence(outcome="forced"))
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["outcome"] == "confirmed"
    assert any(e["body"].get("late_evidence") for e in ledger(api) if e["kind"] == "agent_report")


def test_restarted_agent_gets_a_reconcile(api: Api, settled: FakeAgent) -> None:
    agent = settled
    job_id, _ = running_job(api, agent)
    agent.beat(running=[job_id])
    assert agent.take() == []  # same agent process: nothing to reconcile
    agent.instance = "inst-2"
    agent.beat(running=[job_id])
    (rec,) = agent.take()
    assert rec["kind"] == "reconcile" and rec["params"]["expected"] == [job_id]
