"""Scheduler tests' helpers: the demo nodes' agents beating and reporting over the real API, a quota set as an
approved change would set it, the gateway's clock moved forward."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gateway_testkit import Api, job_spec
from sqlalchemy import select

from gateway.jobs.quotas import apply_change
from gateway.native.scheduler_loop import run_once
from gateway.store.models import NodeCommand
from gateway.store.scheduler_tables import SchedJob


def node_headers(api: Api, node: str) -> dict[str, str]:
    token = (api.settings.data_dir / "agents" / node / "state" / "token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def bring_up_nodes(api: Api) -> None:
    for node in ("demo-node-1", "demo-node-2"):
        r = api.client.post(f"/v1/agents/{node}/heartbeat", headers=node_headers(api, node),
                            json={"gpus": 8, "running": []})
        assert r.status_code == 200, r.text


def report(api: Api, node: str, job_id: str, event: str, **extra: Any) -> None:
    """Report as the node's agent would; a stop's events carry the nonce of the last stop sent there for the job."""
    now = api.gateway.clock().timestamp()
    if event in ("stopping", "stopped") and "nonce" not in extra:
        extra["nonce"] = last_stop_nonce(api, node, job_id)
    r = api.client.post(f"/v1/agents/{node}/reports", headers=node_headers(api, node),
                        json={"reports": [{"job_id": job_id, "event": event, "at": now, **extra}]})
    assert r.status_code == 200, r.text


def last_stop_nonce(api: Api, node: str, job_id: str) -> str | None:
    """The nonce of the newest stop of `job_id` sent to `node`, or of the newest reconcile asking it stopped there."""
    with api.gateway.transaction(immediate=False) as s:
        commands = s.scalars(select(NodeCommand).where(NodeCommand.node == node, NodeCommand.kind.in_(
            ("stop", "reconcile"))).order_by(NodeCommand.created_at.desc())).all()
        for c in commands:
            if (c.kind == "stop" and c.job_id == job_id) or job_id in (c.envelope_params().get("stop") or []):
                return c.nonce
    return None


def job(api: Api, job_id: str) -> dict[str, Any]:
    r = api.get(f"/v1/jobs/{job_id}", "erin")
    assert r.status_code == 200, r.text
    return r.json()


def set_quota(api: Api, project: str, gpus: int, **kw: Any) -> None:
    with api.gateway.transaction() as s:
        apply_change(api.gateway, s, project, {"gpus": gpus, **kw}, by="erin", approved_by=["pat"],
                     reason="test setup", decision_seq=0)


def advance(api: Api, seconds: float) -> None:
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=seconds)
    bring_up_nodes(api)  # the agents kept beating meanwhile


def beat(api: Api, node: str, gpus: int, running: list[str] | None = None) -> None:
    body = {"gpus": gpus, "running": [{"job_id": j, "pid": 1, "gpus": []} for j in running or []]}
    r = api.client.post(f"/v1/agents/{node}/heartbeat", headers=node_headers(api, node), json=body)
    assert r.status_code == 200, r.text


def full_cluster_an_hour_on(api: Api) -> list[str]:
    """Both nodes taken by one whole-node job of alice's each, running for an hour; the second is the cheaper
    victim of a preemption."""
    bring_up_nodes(api)
    ids = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name=f"n{i}")).json()["id"] for i in range(2)]
    assert run_once(api.gateway) == 2
    for j in ids:
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=1)
    with api.gateway.db.transaction() as s:
        s.get(SchedJob, ids[1]).priority -= 5
    advance(api, 3600)
    return ids
