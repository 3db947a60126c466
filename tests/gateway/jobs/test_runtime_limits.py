"""Q6: a job is stopped once it has run past the runtime limit it declared (gateway/jobs/runtime_limits.py).

A limit is what lets a job backfill onto GPUs held for a larger one; nothing enforced it, so a job that
overran delayed that larger job without bound while its wait reason still said GPUs were held for it."""

from __future__ import annotations

from datetime import timedelta

from gateway_testkit import Api, job_spec, ledger_entries
from sched_testkit import beat, bring_up_nodes, job, report
from sqlalchemy import select

from gateway.native.scheduler_loop import run_once
from gateway.store.service_tables import Notification


def running_with_limit(api: Api, **spec: object) -> tuple[str, str]:
    """A job with a 60 s runtime limit, placed and reported started now: (job id, its node)."""
    bring_up_nodes(api)
    r = api.post("/v1/jobs", "alice", json=job_spec(runtime_limit_seconds=60, grace_seconds=5, **spec))
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])
    assert run_once(api.gateway) == 1
    node = job(api, job_id)["placement"][0]["node"]
    report(api, node, job_id, "started", pid=1)
    return job_id, node


def later(api: Api, seconds: float, node: str, job_id: str) -> None:
    """Move the gateway's clock on; the job's node keeps beating (it is not lost), then one cycle runs."""
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=seconds)
    beat(api, node, 8, running=[job_id])
    run_once(api.gateway)


def test_a_job_past_its_runtime_limit_is_stopped_gracefully_by_the_system(api: Api) -> None:
    job_id, node = running_with_limit(api)
    later(api, 59, node, job_id)
    assert job(api, job_id)["state"] == "running"  # within its limit: left alone
    later(api, 2, node, job_id)
    j = job(api, job_id)
    assert j["state"] == "stop_requested", j["state_reason"]
    assert j["stop_request"]["by"] == "system" and "runtime limit" in j["stop_request"]["reason"]
    decisions = [e["body"] for e in ledger_entries(api) if e["kind"] == "decision"
                 and e["body"]["input"].get("action") == "job.stop"]
    assert [(d["actor"]["id"], d["decision"]["rules"]) for d in decisions] == [("system", ["Q6.runtime_limit"])]
    with api.gateway.db.transaction() as s:
        told = s.scalars(select(Notification).where(Notification.kind == "job_runtime_limit")).all()
        assert [(n.principal, n.body["job_id"]) for n in told] == [("alice", job_id)]


def test_a_job_declared_not_stoppable_runs_on_past_its_limit(api: Api) -> None:
    job_id, node = running_with_limit(api, stoppable=False)
    later(api, 3600, node, job_id)
    assert job(api, job_id)["state"] == "running"
