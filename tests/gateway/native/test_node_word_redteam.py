"""Red team: something on a node speaks with the node's token (H1, F3). The gateway believes a node only about
what that node can know; every report that contradicts its own record is refused as a node anomaly, ledgered,
and on-call is alerted, and the job it was about is left as it was."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from gateway_testkit import Api
from stop_helpers import FakeAgent, gpus_used, ledger, notices, running_job, shift_clock, transitions

from gateway.jobs.stops import STOP_CONFIRM_MARGIN_S
from gateway.native import agents
from gateway.native.scheduler_loop import run_once

# The checks are the gateway's own logic over either store: once is enough.
pytestmark = pytest.mark.parametrize("settings", ["sqlite"], indirect=True)

GONE = {"exit_code": 0, "process_group_gone": True, "gpus_released": [0, 1]}


def anomalies(api: Api) -> list[dict[str, Any]]:
    return [e["body"] for e in ledger(api) if e["kind"] == "agent_report" and "anomaly" in e["body"]]


def job_state(api: Api, job_id: str) -> str:
    return str(api.get(f"/v1/jobs/{job_id}", "alice").json()["state"])


def node_2(api: Api) -> FakeAgent:
    other = FakeAgent(api, "demo-node-2")
    other.beat()
    return other


def _other_nodes_nonce(api: Api, agent: FakeAgent, job_id: str, start: str) -> None:
    (reconcile,) = node_2(api).take()
    agent.report(job_id, "exited", reconcile["nonce"], pid=4242, evidence=GONE)


def _stopped_without_nonce(api: Api, agent: FakeAgent, job_id: str, start: str) -> None:
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    agent.report(job_id, "stopped", None, pid=4242, evidence={**GONE, "outcome": "graceful"})


def _stopped_with_the_starts_nonce(api: Api, agent: FakeAgent, job_id: str, start: str) -> None:
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    agent.report(job_id, "stopped", start, pid=4242, evidence={**GONE, "outcome": "graceful"})


def _another_jobs_gpus(api: Api, agent: FakeAgent, job_id: str, start: str) -> None:
    agent.report(job_id, "exited", None, pid=4242, evidence={**GONE, "gpus_released": [6, 7]})


def _a_stop_called_reconciled(api: Api, agent: FakeAgent, job_id: str, start: str) -> None:
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    (stop,) = agent.take()
    agent.report("", "reconciled", stop["nonce"])


FALSE_REPORTS: dict[str, tuple[Callable[[Api, FakeAgent, str, str], None], str]] = {
    "a nonce issued to another node": (_other_nodes_nonce, "never issued to this node"),
    "stop evidence without a nonce": (_stopped_without_nonce, "stop evidence without the nonce"),
    "stop evidence with the start's nonce": (_stopped_with_the_starts_nonce, "stop evidence without the nonce"),
    "GPUs the job does not hold": (_another_jobs_gpus, "releases GPUs [6, 7]"),
    "a stop acknowledged as reconciled": (_a_stop_called_reconciled, "calls a stop command reconciled"),
}


@pytest.mark.parametrize("case", sorted(FALSE_REPORTS), ids=str)
def test_a_report_the_node_cannot_make_is_refused_as_an_anomaly(api: Api, agent: FakeAgent, case: str) -> None:
    make, why = FALSE_REPORTS[case]
    job_id, start = running_job(api, agent)
    state = job_state(api, job_id)
    make(api, agent, job_id, start)
    assert job_state(api, job_id) in (state, "stop_requested")  # a stop asked for stays asked for
    assert gpus_used(api, "demo-node-1") == 2  # nothing released on its word
    (entry,) = anomalies(api)
    assert why in entry["anomaly"] and entry["node"] == "demo-node-1" and entry["job_id"] in (job_id, None)
    assert any(n["kind"] == "node_anomaly" for n in notices(api, "dave"))


def test_a_node_is_not_believed_about_a_job_placed_elsewhere(api: Api, agent: FakeAgent) -> None:
    """A report a node makes about another node's job changes nothing there."""
    job_id, _ = running_job(api, agent)
    node_2(api).report(job_id, "exited", None, pid=4242, evidence=GONE)
    assert job_state(api, job_id) == "running" and gpus_used(api, "demo-node-1") == 2
    (entry,) = anomalies(api)
    assert entry["node"] == "demo-node-2" and "no allocation on this node" in entry["anomaly"]
    assert entry["placed_on"] == ["demo-node-1"]


def test_a_second_end_of_the_same_run_is_an_anomaly_but_a_resend_of_the_first_is_not(
    api: Api, agent: FakeAgent
) -> None:
    job_id, _ = running_job(api, agent)
    at = time.time()
    agent.report(job_id, "exited", None, pid=4242, at=at, evidence={**GONE, "exit_code": 3})
    assert job_state(api, job_id) == "failed"
    agent.report(job_id, "exited", None, pid=4242, at=at, evidence={**GONE, "exit_code": 3})  # delivered twice
    assert anomalies(api) == []
    agent.report(job_id, "exited", None, pid=4242, at=at + 5, evidence=GONE)  # "it really exited 0"
    (entry,) = anomalies(api)
    assert "a second end of the same run" in entry["anomaly"]
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "failed" and job["exit_code"] == 3


def test_a_heartbeat_still_running_a_process_the_node_said_ended_is_alerted_once(api: Api, agent: FakeAgent) -> None:
    job_id, _ = running_job(api, agent)
    ended = time.time()
    agent.report(job_id, "exited", None, pid=4242, at=ended, evidence=GONE)
    assert job_state(api, job_id) == "succeeded"

    def beat(at: float) -> None:
        body = {"gpus": 8, "running": [{"job_id": job_id, "pid": 4242, "gpus": [0, 1]}], "instance": agent.instance,
                "at": at}
        r = api.client.post("/v1/agents/demo-node-1/heartbeat", json=body, headers=agent._headers())
        assert r.status_code == 200, r.text

    beat(ended - 1)  # taken before the end: no contradiction
    assert anomalies(api) == []
    beat(ended + 2)
    beat(ended + 4)
    (entry,) = anomalies(api)
    assert "still runs a process it reported ended" in entry["anomaly"] and entry["job_id"] == job_id


def test_a_rejected_stop_is_sent_again_and_escalates_with_the_rejection_as_evidence(
    api: Api, agent: FakeAgent
) -> None:
    """Something answered the job's stop with "rejected": the stop was taken as delivered and never reached the
    agent, so the job could not be stopped. Now a rejection never acknowledges a stop."""
    job_id, _ = running_job(api, agent, grace_seconds=5)
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(job_id, "rejected", stop["nonce"], detail="invalid: not today")
    shift_clock(api, agents.RESEND_AFTER_S + 1)
    again = [c for c in agent.take() if c["kind"] == "stop"]
    assert [c["envelope"] for c in again] == [stop["envelope"]]  # the very same stop, handed out again
    shift_clock(api, 5 + STOP_CONFIRM_MARGIN_S + 1)
    agent.beat(running=[job_id])
    run_once(api.gateway)
    assert job_state(api, job_id) == "stop_failed"
    failed = next(e["body"] for e in reversed(ledger(api))
                  if e["kind"] == "transition" and e["body"].get("state_after") == "stop_failed")
    assert [r["detail"] for r in failed["rejections"]] == ["invalid: not today"]
    assert "the node rejected it 1 time(s)" in failed["reason"]
    assert transitions(api, job_id).count("stop_failed") == 1
