"""Approval tests' helpers: a job marked running on demo-node-1 (the scheduler and agents are not what they
test), a stop that waits for a second person, a job's state as the store holds it."""

from __future__ import annotations

from gateway_testkit import Api, job_spec

from gateway.store.models import Job


def running_job(api: Api, who: str = "alice", **spec: object) -> str:
    """Submit a job and mark it running on demo-node-1, as if the agent had started it."""
    headers = {"X-Jobgate-Trigger": "ci/nightly#7"} if who == "ci-bot" else {}
    job_id = api.post("/v1/jobs", who, json=job_spec(**spec), headers=headers).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state = "running"
        job.placement = [{"node": "demo-node-1", "gpus": [0, 1]}]
    return job_id


def ask_stop(api: Api, who: str, job_id: str, reason: str = "needs the GPUs for the urgent eval") -> dict:
    r = api.post(f"/v1/jobs/{job_id}/stop", who, json={"reason": reason})
    assert r.status_code == 202, r.text
    return r.json()


def job_state(api: Api, job_id: str) -> str:
    with api.gateway.db.transaction() as s:
        return s.get(Job, job_id).state
