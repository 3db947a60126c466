"""A node whose agent reports fewer GPUs than its running jobs hold, through the agents' heartbeat API: the
node is degraded (closed to new work until its jobs fit again), on-call is told, and the rest of the cluster
goes on scheduling. The snapshot used to list the jobs on GPUs the node no longer had, the scheduler core
refused it, and every cycle failed, for every node, with everything else the cycle does rolled back."""

from __future__ import annotations

from datetime import timedelta

from gateway_testkit import Api, job_spec
from sched_testkit import beat, bring_up_nodes, job, node_headers, report
from sqlalchemy import select

from gateway.native.scheduler_loop import run_once
from gateway.store.models import Allocation, Job
from gateway.store.service_tables import Notification

NODES = ("demo-node-1", "demo-node-2")
DONE = {"process_group_gone": True, "exit_code": 0}


def start(api: Api, who: str = "alice", **spec: object) -> str:
    """Submit, admit in a cycle of its own (so placements are predictable) and report started."""
    r = api.post("/v1/jobs", who, json=job_spec(**spec))
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])
    assert run_once(api.gateway) == 1
    report(api, job(api, job_id)["placement"][0]["node"], job_id, "started", pid=1)
    return job_id


def held(api: Api, node: str) -> dict[str, list[int]]:
    with api.gateway.db.transaction() as s:
        rows = s.execute(select(Allocation.job_id, Allocation.gpus)
                         .where(Allocation.node == node, Allocation.released.is_(False))).all()
    return {job_id: sorted(gpus) for job_id, gpus in rows}


def test_a_node_reporting_fewer_gpus_than_its_jobs_hold_does_not_stop_the_other_nodes(api: Api) -> None:
    """Job a holds all 8 GPUs of its node; the node then says it has 2. The next job must still start on the
    other node's free GPUs: the cycle raised InconsistentSnapshot instead, every time, cluster-wide."""
    bring_up_nodes(api)
    a = start(api, gpus_per_node=8, name="a")
    shrunk = job(api, a)["placement"][0]["node"]
    other = next(n for n in NODES if n != shrunk)
    beat(api, shrunk, 2, running=[a])
    b = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8, name="b")).json()["id"]
    assert run_once(api.gateway) == 1
    assert [p["node"] for p in job(api, b)["placement"]] == [other]
    assert job(api, a)["state"] == "running"  # its job runs on: nothing is taken from it
    with api.gateway.db.transaction() as s:
        alerts = [n.body for n in s.scalars(select(Notification).where(Notification.kind == "node_gpus_missing"))]
    assert alerts and alerts[0]["node"] == shrunk and alerts[0]["reported_gpus"] == 2
    assert alerts[0]["jobs"] == [a] and alerts[0]["allocated_beyond"] == list(range(2, 8))
    # On-call sees which node and why in the node list, not only in the alert.
    nodes = {n["id"]: n for n in api.get("/v1/nodes", "alice").json()["nodes"]}
    assert nodes[shrunk]["degraded"] and nodes[shrunk]["gpus"] == 2 and nodes[shrunk]["gpus_used"] == 8
    assert not nodes[other]["degraded"]


def test_stops_are_still_escalated_while_a_node_reports_fewer_gpus_than_its_jobs_hold(api: Api) -> None:
    """Escalating unconfirmed stops runs in the scheduler's transaction: while every cycle failed on the
    degraded node, a stop nobody confirmed on a healthy node was never escalated to on-call."""
    bring_up_nodes(api)
    a = start(api, gpus_per_node=8, name="a")
    shrunk = job(api, a)["placement"][0]["node"]
    other = next(n for n in NODES if n != shrunk)
    c = start(api, gpus_per_node=8, name="c", grace_seconds=5)
    assert job(api, c)["placement"][0]["node"] == other
    assert api.post(f"/v1/jobs/{c}/stop", "alice", json={"reason": "enough"}).status_code == 202
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=5 + 31)  # past grace + margin; agents beat meanwhile
    beat(api, shrunk, 2, running=[a])
    beat(api, other, 8, running=[c])
    run_once(api.gateway)
    assert job(api, c)["state"] == "stop_failed", job(api, c)["state_reason"]


def test_a_degraded_node_takes_no_new_work_until_its_jobs_fit_the_gpus_it_reports(api: Api) -> None:
    """Job a holds GPUs 6 and 7 of a node that then reports 4. GPUs 0-3 look idle, but with the node's count
    in doubt nothing is placed there (GPU 2 today may be yesterday's GPU 6, still running a). Once a ends, the
    node is whole again and takes work within the 4 GPUs it reports."""
    bring_up_nodes(api)
    x = start(api, gpus_per_node=6, name="x")
    node = job(api, x)["placement"][0]["node"]
    a = start(api, gpus_per_node=2, name="a")
    assert held(api, node) == {x: list(range(6)), a: [6, 7]}
    start(api, "bob", gpus_per_node=8, name="fills-the-other-node")
    report(api, node, x, "exited", evidence=DONE)
    beat(api, node, 4, running=[a])
    d = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=2, name="d")).json()["id"]
    assert run_once(api.gateway) == 0
    assert job(api, d)["state"] == "pending"
    assert held(api, node) == {a: [6, 7]}
    report(api, node, a, "exited", evidence=DONE)
    assert run_once(api.gateway) == 1
    assert held(api, node) == {d: [0, 1]}


def test_an_external_rights_job_never_goes_to_a_node_that_cannot_isolate_it(api: Api) -> None:
    """H1 with R3: on a node whose agent runs jobs as its own user (isolation: none) any job could act as the node
    and reach its neighbours; policy (data.json isolation.unisolated_nodes_take) keeps external-rights jobs off."""
    for node, isolation in zip(NODES, ("none", "none"), strict=True):
        r = api.client.post(f"/v1/agents/{node}/heartbeat", headers=node_headers(api, node),
                            json={"gpus": 8, "running": [], "isolation": isolation})
        assert r.status_code == 200, r.text
    partner = api.post("/v1/jobs", "alice", json=job_spec(name="on-partner-data")).json()
    own = api.post("/v1/jobs", "alice", json=job_spec(name="own-data")).json()
    with api.gateway.db.transaction() as s:
        s.get(Job, partner["id"]).external_rights = True  # its data's rights holder is another organisation (R3)
    run_once(api.gateway)
    assert job(api, own["id"])["state"] == "starting"
    waiting = job(api, partner["id"])
    assert waiting["state"] == "pending" and "on nodes that isolate jobs; only 0 such" in waiting["state_reason"]
    r = api.client.post(f"/v1/agents/{NODES[1]}/heartbeat", headers=node_headers(api, NODES[1]),
                        json={"gpus": 8, "running": [], "isolation": "uid+cgroup"})
    assert r.status_code == 200, r.text
    run_once(api.gateway)
    placed = job(api, partner["id"])
    assert placed["state"] == "starting" and [p["node"] for p in placed["placement"]] == [NODES[1]]
