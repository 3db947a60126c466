"""Approval tests' helpers: a job running on demo-node-1 on the in-process executor (the scheduler and node agents
are not what they test: the `inproc_api` fixture), a stop that waits for a second person, a job's state as the
store holds it."""

from __future__ import annotations

from gateway_testkit import Api, job_spec

from gateway.store.models import Job


def running_job(api: Api, who: str = "alice", **spec: object) -> str:
    """Submit a job and let the in-process executor place and start it (gateway/execution/inprocess.py)."""
    headers = {"X-Jobgate-Trigger": "ci/nightly#7"} if who == "ci-bot" else {}
    r = api.post("/v1/jobs", who, json=job_spec(**spec), headers=headers)
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])
    api.gateway.execution.run()
    assert job_state(api, job_id) == "running"
    return job_id


def ask_stop(api: Api, who: str, job_id: str, reason: str = "needs the GPUs for the urgent eval") -> dict:
    r = api.post(f"/v1/jobs/{job_id}/stop", who, json={"reason": reason})
    assert r.status_code == 202, r.text
    return r.json()


def job_state(api: Api, job_id: str) -> str:
    with api.gateway.db.transaction() as s:
        return s.get(Job, job_id).state
