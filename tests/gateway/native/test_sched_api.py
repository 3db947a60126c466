"""Scheduler through the gateway: quotas (A7 with a second admin), admission, borrowing with owned/borrowed
marking, reclaim by graceful preemption and requeue, explain/estimate, statistics, notices."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

from gateway_testkit import Api, assert_problem, job_spec, ledger_entries
from sched_testkit import advance, bring_up_nodes, full_cluster_an_hour_on, job, node_headers, report, set_quota
from sqlalchemy import select

from gateway.decisions.policy.engine import RoleBinding as PolicyBinding
from gateway.identity.tokens import issue_token
from gateway.native.scheduler_loop import run_once
from gateway.store.models import Allocation, Job, Principal, RoleBinding
from gateway.store.scheduler_tables import PreemptionRow, PriorityChange, SchedJob
from gateway.store.service_tables import Notification


def add_second_admin(api: Api) -> str:
    gw = api.gateway
    with gw.transaction() as s:
        now = gw.clock()
        s.add(Principal(id="pat", kind="person", display_name="Pat (platform admin)", created_at=now))
        s.flush()
        s.add(RoleBinding(principal_id="pat", role="platform_admin", project="*", created_at=now))
        secret = issue_token(s, "pat", purpose="test", now=now, lifetime=timedelta(days=1)).secret
    gw.policy.grant(PolicyBinding(principal="pat", role="platform_admin", project="*"))
    api.tokens["pat"] = secret
    return secret


def test_quota_change_needs_a_second_platform_admin_and_is_ledgered_with_before_and_after(api: Api) -> None:
    add_second_admin(api)
    body = {"gpus": 8, "borrow_limit": 4, "lend_limit": 2, "users": {"alice": 6}, "reason": "Q3 budget for vision",
            "effective_from": "2026-01-01T00:00:00Z"}
    r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"), json=body)
    assert r.status_code == 202, r.text
    approval_id = r.json()["approval_id"]
    assert api.get("/v1/quotas", "erin").json()["quotas"] == []  # nothing changes before the second person
    assert api.post(f"/v1/approvals/{approval_id}/approve", "erin", json={}).status_code == 403  # not herself
    r = api.post(f"/v1/approvals/{approval_id}/approve", "pat", json={"comment": "ok"})
    assert r.status_code == 200, r.text
    quotas = api.get("/v1/quotas", "alice").json()["quotas"]
    assert [(q["project"], q["gpus"], q["borrow_limit"], q["lend_limit"], q["users"]) for q in quotas] == [
        ("vision", 8, 4, 2, {"alice": 6})]
    applied = [e["body"] for e in ledger_entries(api) if e["body"].get("action") == "quota.change"
               and e["body"].get("result") == "applied"]
    assert len(applied) == 1
    assert applied[0]["before"] is None and applied[0]["after"]["gpus"] == 8
    assert applied[0]["effective_from"].startswith("2026-01-01") and applied[0]["approved_by"] == ["pat"]


def test_researcher_and_queue_admin_cannot_change_quotas(api: Api) -> None:
    for who in ("alice", "carol"):
        r = api.client.put("/v1/quotas/vision", headers=api.headers(who), json={"gpus": 64, "reason": "more please"})
        assert r.status_code == 403, r.text
        assert r.json()["type"].endswith("/policy-denied")


def test_bad_quota_bodies_are_problems(api: Api) -> None:
    r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"), json={"gpus": -1, "reason": "neg"})
    assert r.status_code == 422 and "gpus" in r.json()["detail"]
    r = api.client.put("/v1/quotas/nope", headers=api.headers("erin"), json={"gpus": 1, "reason": "unknown"})
    assert r.status_code == 422 and "unknown project" in r.json()["detail"]


def test_admission_refuses_over_hard_quota_and_unregistered_mounts(api: Api) -> None:
    bring_up_nodes(api)
    set_quota(api, "vision", 4, borrow_limit=2, users={"bob": 2})
    r = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8))
    assert r.status_code == 422, r.text
    assert "more than tenant vision may ever hold" in r.json()["detail"]
    r = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=3))
    assert r.status_code == 422 and "user quota of bob" in r.json()["detail"]
    r = api.post("/v1/jobs", "alice", json=job_spec(mounts=["/scratch"], datasets=["imagenet"]))
    assert r.status_code == 422, r.text
    assert "mount '/scratch'" in r.json()["detail"] and "dataset 'imagenet'" in r.json()["detail"]
    assert api.post("/v1/mounts", "alice", json={"name": "imagenet", "kind": "dataset"}).status_code == 403
    r = api.post("/v1/mounts", "erin", json={"name": "imagenet", "kind": "dataset", "projects": ["speech"]})
    assert r.status_code == 201, r.text
    r = api.post("/v1/jobs", "alice", json=job_spec(datasets=["imagenet"]))
    assert r.status_code == 422 and "not open to project vision" in r.json()["detail"]
    api.post("/v1/mounts", "erin", json={"name": "imagenet", "kind": "dataset", "projects": ["*"]})
    r = api.post("/v1/jobs", "alice", json=job_spec(datasets=["imagenet"]))
    assert r.status_code == 201, r.text


def test_admission_refuses_a_job_that_cannot_be_stopped_beyond_its_tenants_owned_quota(api: Api) -> None:
    # Such a job is never placed on borrowed GPUs (R5: no reclaim could take them back); admitted past its
    # tenant's owned quota, it sat pending for ever, told only that the quota was in use.
    bring_up_nodes(api)
    set_quota(api, "vision", 4, borrow_limit=8)
    r = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, stoppable=False))
    body = assert_problem(r, 422, "invalid-request", "the job can never run here")
    assert "cannot be stopped, but tenant vision owns only 4" in body["detail"]
    assert api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).status_code == 201  # stoppable: borrows
    fits = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=4, stoppable=False, name="fits"))
    assert fits.status_code == 201, fits.text
    run_once(api.gateway)
    assert job(api, fits.json()["id"])["state"] == "starting"
    assert {p["quota"] for p in job(api, fits.json()["id"])["placement"]} == {"owned"}


def test_admission_refuses_a_job_only_borrowing_could_run_when_no_tenant_lends_that_much(api: Api) -> None:
    # speech owns nothing; vision owns the whole cluster and lends none of it: a speech job could only ever run
    # on lent GPUs, and was admitted to wait for ever behind "only 0 idle GPUs of other tenants may be borrowed".
    bring_up_nodes(api)
    set_quota(api, "vision", 16, lend_limit=0)
    r = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=2))
    assert_problem(r, 422, "invalid-request", "more than tenant speech owns (0), and other tenants lend at most 0")
    set_quota(api, "vision", 16, lend_limit=4)
    assert api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=4)).status_code == 201
    r = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=5))
    assert_problem(r, 422, "invalid-request", "other tenants lend at most 4")


def test_a_job_a_quota_holds_back_is_estimated_from_when_the_quota_allows_it_and_delays_no_other(api: Api) -> None:
    # The estimate simulates when GPUs are free; a job its quota holds back was told it would start now (GPUs were
    # idle), and its simulated run pushed the estimates of the jobs behind it back by a day. Then it was told no
    # estimate at all, though its quota allows it as soon as the tenant's running job ends.
    bring_up_nodes(api)
    set_quota(api, "vision", 2, borrow_limit=0)
    first = api.post("/v1/jobs", "alice", json=job_spec(runtime_limit_seconds=3600)).json()["id"]
    assert run_once(api.gateway) == 1
    report(api, job(api, first)["placement"][0]["node"], first, "started", pid=1)
    held = api.post("/v1/jobs", "alice", json=job_spec(name="held")).json()["id"]
    big = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=7, nodes=2)).json()["id"]
    assert run_once(api.gateway) == 0
    ends = datetime.fromisoformat(job(api, first)["started_at"]) + timedelta(seconds=3600)
    q = api.get(f"/v1/jobs/{held}/queue", "alice").json()
    assert "tenant quota of vision" in q["blocking_reason"] and q["position"] == 1
    assert (f"; the quota allows it from {ends.isoformat(timespec='seconds')}, when job {first} ends"
            in q["blocking_reason"]), q["blocking_reason"]
    assert datetime.fromisoformat(q["estimated_start"]) == ends
    q = api.get(f"/v1/jobs/{big}/queue", "mallory").json()
    assert q["position"] == 2 and q["estimated_start"] is not None
    # when the running job's hour is up, not a day later
    assert abs((datetime.fromisoformat(q["estimated_start"]) - ends).total_seconds()) < 5


def test_borrowed_gpus_are_reclaimed_by_graceful_preemption_and_the_victim_is_requeued(api: Api) -> None:
    bring_up_nodes(api)
    set_quota(api, "vision", 8)
    set_quota(api, "speech", 8, borrow_limit=8)
    own = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="own")).json()["id"]
    lent = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="lent")).json()["id"]
    assert run_once(api.gateway) == 2
    modes = {j: {p["quota"] for p in job(api, j)["placement"]} for j in (own, lent)}
    assert modes == {own: {"owned"}, lent: {"borrowed"}}
    for j in (own, lent):
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=4242)
    advance(api, 3600)  # past the victims' minimum runtime

    mine = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="lender")).json()["id"]
    assert run_once(api.gateway) == 0
    assert job(api, lent)["state"] == "stop_requested" and job(api, own)["state"] == "running"
    assert job(api, lent)["stop_request"]["preemption"] == {"preemptor": mine, "kind": "reclaim"}
    decisions = [e["body"] for e in ledger_entries(api) if e["kind"] == "decision"
                 and e["body"]["actor"]["id"] == "scheduler"]
    assert decisions[-1]["plan"]["victims"][0]["job_id"] == lent
    assert decisions[-1]["decision"]["rules"] == ["Q5.reclaim_borrowed"]
    q = api.get(f"/v1/jobs/{mine}/queue", "alice").json()
    assert "reclaiming" in q["blocking_reason"] or "held for it" in q["blocking_reason"]
    with api.gateway.db.transaction() as s:
        notes = s.scalars(select(Notification).where(Notification.principal == "mallory")).all()
        assert [n.kind for n in notes] == ["preempted"]
        assert "checkpoint" in notes[0].body and notes[0].body["preemptor"] == mine
        before = s.get(SchedJob, lent).priority

    node = job(api, lent)["placement"][0]["node"]
    report(api, node, lent, "stopping")
    report(api, node, lent, "stopped", evidence={"outcome": "graceful", "exit_code": 0, "checkpoints": [
        {"path": "checkpoints/last.ckpt", "size": 7, "sha256": "ab" * 32}]})
    victim = job(api, lent)
    assert victim["state"] == "pending", victim["history"][-1]
    assert victim["placement"] == []
    assert run_once(api.gateway) == 1
    assert {p["quota"] for p in job(api, mine)["placement"]} == {"owned"}
    q = api.get(f"/v1/jobs/{lent}/queue", "mallory").json()
    assert q["position"] == 1 and q["wait_credit_s"] >= 0 and q["preemptions"] == 1
    assert q["priority"]["effective"] >= before + 50 - 1e-6  # its priority kept, plus compensation
    assert [h["basis"] for h in q["priority_history"]][:1] == ["submit"]
    assert "compensation" in [h["basis"] for h in q["priority_history"]]
    assert "quota" in q["blocking_reason"]
    with api.gateway.db.transaction() as s:
        row = s.scalars(select(PreemptionRow).where(PreemptionRow.victim == lent)).one()
        assert row.state == "requeued" and row.checkpoint["outcome"] == "graceful"
        assert round(row.gpu_hours_lost, 2) == 8.0
        notes = s.scalars(select(Notification).where(Notification.principal == "mallory")).all()
        assert [n.kind for n in notes] == ["preempted", "requeued", "expected_restart"]
        assert notes[1].body["checkpoint"]["outcome"] == "graceful"
        assert notes[1].body["checkpoint"]["files"][0]["path"] == "checkpoints/last.ckpt"
        assert notes[2].body["position"] == 1 and "expected_restart" in notes[2].body
    stats = api.get("/v1/stats/preemptions", "erin", params={"by": "tenant", "period": "quarter"}).json()
    assert [(r["tenant"], r["count"], round(r["gpu_hours_lost"], 2)) for r in stats["rows"]] == [("speech", 1, 8.0)]
    assert api.get("/v1/stats/preemptions", "alice").json()["rows"] == []  # vision cannot see speech's numbers
    assert api.get("/v1/stats/preemptions", "erin", params={"period": "year"}).status_code == 422


def test_a_victim_whose_stop_on_call_confirms_is_requeued_too(api: Api) -> None:
    # The victim's node went silent during its graceful window: stop_failed, then on-call vouched it had stopped.
    # It ended `stopped` for good, its preemption never closed, and its owner had been told it would be requeued.
    bring_up_nodes(api)
    set_quota(api, "vision", 8)
    set_quota(api, "speech", 8, borrow_limit=8)
    own = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="own")).json()["id"]
    lent = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="lent")).json()["id"]
    assert run_once(api.gateway) == 2
    for j in (own, lent):
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=4242)
    advance(api, 3600)
    mine = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="lender")).json()["id"]
    run_once(api.gateway)
    assert job(api, lent)["state"] == "stop_requested"
    silent = job(api, lent)["placement"][0]["node"]
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=60)
    for node in {"demo-node-1", "demo-node-2"} - {silent}:
        api.client.post(f"/v1/agents/{node}/heartbeat", headers=node_headers(api, node),
                        json={"gpus": 8, "running": []})
    run_once(api.gateway)
    assert job(api, lent)["state"] == "stop_failed"

    r = api.post(f"/v1/jobs/{lent}/confirm-stopped", "dave", json={"reason": "node is powered off"})
    assert r.status_code == 200, r.text
    victim = job(api, lent)
    assert victim["state"] == "pending", victim["history"][-1]
    assert victim["placement"] == []
    q = api.get(f"/v1/jobs/{lent}/queue", "mallory").json()
    assert q["preemptions"] == 1 and q["priority"]["effective"] > 0
    with api.gateway.db.transaction() as s:
        row = s.scalars(select(PreemptionRow).where(PreemptionRow.victim == lent)).one()
        assert row.state == "requeued" and row.checkpoint["outcome"] == "confirmed"
        notes = [n for n in s.scalars(select(Notification).where(Notification.principal == "mallory")).all()
                 if n.kind == "requeued"]
        assert len(notes) == 1 and notes[0].body["outcome"] == "confirmed"
        assert not s.scalars(select(Allocation).where(Allocation.job_id == lent)).all()
    requeued = [e["body"] for e in ledger_entries(api) if e["body"].get("action") == "job.preempt"
                and e["body"].get("result") == "requeued"]
    assert requeued[-1]["job_id"] == lent and requeued[-1]["confirmed"]["by"] == "dave"
    assert requeued[-1]["confirmed"]["state_before"] == "stop_failed"
    assert job(api, mine)["state"] == "pending"


def test_urgent_job_preempts_the_lowest_priority_job_and_queue_explains_the_rest(api: Api) -> None:
    ids = full_cluster_an_hour_on(api)
    waiting = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=4, runtime_limit_seconds=600)).json()["id"]
    urgent = api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u")).json()["id"]
    run_once(api.gateway)
    assert job(api, ids[1])["state"] == "stop_requested" and job(api, ids[0])["state"] == "running"
    q = api.get(f"/v1/jobs/{waiting}/queue", "bob").json()
    assert q["position"] == 1 and q["queue"] == "normal" and q["blocking_reason"]
    assert q["estimated_start"] is not None
    assert q["priority"]["parts"]["contribution"] == 10.0  # bob's contribution from policy data
    queues = api.get("/v1/queues", "mallory").json()
    assert queues["queues"]["urgent"]["jobs"][0]["id"] is None  # another tenant's job: priority only
    assert queues["queues"]["urgent"]["jobs"][0]["priority"] >= 1000
    assert queues["cluster"]["gpus"] == 16 and queues["cluster"]["in_use"] == 16
    assert api.get(f"/v1/jobs/{urgent}/queue", "mallory").status_code == 403
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(PriorityChange).where(PriorityChange.job_id == urgent)).first() is not None
        assert s.get(Job, ids[1]).stop_request["preemption"]["kind"] == "priority"


def test_an_urgent_job_waiting_for_its_victims_minimum_runtime_is_told_so_and_when(api: Api) -> None:
    """Issue 30: another tenant runs 2x8 GPUs on the demo's 16; carol's urgent 6-GPU job was told it starts a day
    later, "beyond the 1h reservation window", and ran ten minutes later, when a victim passed its unnamed minimum
    runtime. `why` (API and CLI) and the console now name the rule, its value and when it ends, and the estimate
    is that time plus the victim's grace window."""
    from gateway.cli.queue import describe_why

    bring_up_nodes(api)
    theirs = [api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name=f"m{i}"))
              .json()["id"] for i in range(2)]
    assert run_once(api.gateway) == 2
    for j in theirs:
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=1)
    urgent = api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=6, queue="urgent", name="eval")).json()["id"]
    advance(api, 60)
    run_once(api.gateway)
    first = min(datetime.fromisoformat(job(api, j)["started_at"]) for j in theirs)
    free_from = first + timedelta(seconds=600)  # the normal queue's minimum runtime
    q = api.get(f"/v1/jobs/{urgent}/queue", "carol").json()
    said = q["blocking_reason"]
    assert f"may be preempted from {free_from.isoformat(timespec='seconds')}" in said, said
    assert "min_runtime_s: normal 10 min" in said and "reservation window" not in said, said
    assert datetime.fromisoformat(q["estimated_start"]) == free_from + timedelta(seconds=30)  # the 30 s grace
    cli = describe_why(q)
    assert f"  waiting because: {said}" in cli.splitlines() and f"  estimated start: {q['estimated_start']}" in cli
    login = api.client.get("/ui/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert nonce, login.text
    api.client.post("/ui/login", data={"token": api.tokens["carol"], "csrf": nonce.group(1)})
    page = api.client.get(f"/ui/jobs/{urgent}").text
    shown = (free_from + timedelta(seconds=30)).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert shown in page and "min_runtime_s: normal 10 min" in page, page

    advance(api, 600)  # past it: the victim is asked to stop, and the start is its grace window away
    run_once(api.gateway)
    assert sorted(job(api, j)["state"] for j in theirs) == ["running", "stop_requested"]
    q = api.get(f"/v1/jobs/{urgent}/queue", "carol").json()
    assert datetime.fromisoformat(q["estimated_start"]) == api.gateway.clock() + timedelta(seconds=30)


def test_a_job_placed_but_not_yet_started_has_run_from_its_placement_not_its_submission(api: Api) -> None:
    # Its run was counted from its submission: placed seconds ago after an hour in the queue, it had "run" an hour,
    # so it could be preempted before it ever started (minimum runtime 10 min), and it lost that hour of wait.
    bring_up_nodes(api)
    ids = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name=f"n{i}")).json()["id"] for i in range(2)]
    advance(api, 3600)  # an hour in the queue
    assert run_once(api.gateway) == 2  # placed; their agents fetched the commands but have not reported yet
    for node in ("demo-node-1", "demo-node-2"):
        api.client.get(f"/v1/agents/{node}/commands", headers=node_headers(api, node), params={"wait": 0})
    urgent = api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u")).json()["id"]
    advance(api, 10)
    run_once(api.gateway)
    assert [job(api, j)["state"] for j in ids] == ["starting", "starting"]
    assert job(api, urgent)["state"] == "pending"
    advance(api, 600)  # now past the minimum runtime, counted from the placement
    run_once(api.gateway)
    victim = next(j for j in ids if job(api, j)["state"] == "stop_requested")
    with api.gateway.db.transaction() as s:
        plan = s.scalars(select(PreemptionRow).where(PreemptionRow.victim == victim)).one()
        assert plan.gpu_hours_lost == 0  # it never ran
    report(api, job(api, victim)["placement"][0]["node"], victim, "stopped",
           evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, victim)["state"] == "pending"
    q = api.get(f"/v1/jobs/{victim}/queue", "alice").json()
    assert 3600 - 1 <= q["wait_credit_s"] <= 3600 + 1  # its hour in the queue is kept (P2)


def test_a_requeued_victim_placed_again_at_once_is_told_it_runs_again(api: Api) -> None:
    # Q9's expected-restart notice went out only from a cycle that left the victim waiting: placed at once, its
    # owner never heard when it ran again, and the notice stayed pending, to go out with a stale text on some
    # later wait of the job.
    ids = full_cluster_an_hour_on(api)
    urgent = api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u")).json()["id"]
    run_once(api.gateway)
    victim = ids[1]
    assert job(api, victim)["state"] == "stop_requested"
    r = api.post(f"/v1/jobs/{urgent}/stop", "carol", json={"reason": "not needed after all"})
    assert r.status_code in (200, 202), r.text
    report(api, job(api, victim)["placement"][0]["node"], victim, "stopped",
           evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, victim)["state"] == "pending"
    assert run_once(api.gateway) == 1 and job(api, victim)["state"] == "starting"
    with api.gateway.db.transaction() as s:
        notes = s.scalars(select(Notification).where(Notification.principal == "alice")).all()
        assert {n.kind for n in notes} >= {"preempted", "requeued"}
        restart = [n.body for n in notes if n.kind == "expected_restart"]
        assert len(restart) == 1 and restart[0]["job_id"] == victim and restart[0]["placed"] is True
        assert s.get(SchedJob, victim).restart_notice_pending is False


def test_occupancy_limit_asks_for_renewal_then_stops_and_requeues(api: Api) -> None:
    from scheduler.model import SchedulerConfig

    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    other = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="renewed")).json()["id"]
    run_once(api.gateway)
    for x in (j, other):
        report(api, job(api, x)["placement"][0]["node"], x, "started", pid=7)
    assert api.post(f"/v1/jobs/{j}/renew", "alice", json={"progress": "epoch 3", "expected_remaining_seconds": 60}
                    ).status_code == 200  # renewing early is allowed and starts a new period
    advance(api, 3600 + 60)
    run_once(api.gateway)
    q = api.get(f"/v1/jobs/{other}/queue", "alice").json()
    assert q["renewal_due_at"] is not None and job(api, other)["state"] == "running"
    assert job(api, other)["state_reason"].startswith("renewal due")
    r = api.post(f"/v1/jobs/{other}/renew", "bob", json={"progress": "not mine", "expected_remaining_seconds": 5})
    assert r.status_code == 403, r.text
    r = api.post(f"/v1/jobs/{other}/renew", "alice", json={"progress": "loss 0.3, epoch 9",
                                                           "expected_remaining_seconds": 1800})
    assert r.status_code == 200, r.text
    assert api.get(f"/v1/jobs/{other}/queue", "alice").json()["renewal_due_at"] is None
    advance(api, 600)  # now t0+1h11: j (renewed at t0) was due at t0+1h and its window ended at t0+1h10
    run_once(api.gateway)
    assert job(api, j)["state"] == "stop_requested"
    assert job(api, j)["stop_request"]["preemption"]["kind"] == "occupancy"
    assert job(api, other)["state"] == "running"  # renewed at t0+1h01: still inside its new period
    renewals = [e["body"] for e in ledger_entries(api) if e["body"].get("action") == "job.renew"]
    assert [r["progress"] for r in renewals] == ["epoch 3", "loss 0.3, epoch 9"]
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "stopped", evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, j)["state"] == "pending"
    # Requeued with its priority and wait, but no Q8 compensation: that is for preemption victims, and paid here
    # it rewarded leaving a renewal unanswered (and the history said "preempted by None").
    q = api.get(f"/v1/jobs/{j}/queue", "alice").json()
    assert q["priority"]["parts"]["compensation"] == 0
    last = q["priority_history"][-1]
    assert last["basis"] == "requeue" and last["after"] == last["before"]
    assert "maximum continuous occupancy" in last["note"] and "None" not in last["note"]


def test_a_job_declared_not_stoppable_is_not_stopped_at_its_occupancy_limit_but_made_visible(api: Api) -> None:
    # R5: the system never stops such a job (no preemption, no emergency stop reaches it); P3 stopped it anyway
    # when its renewal window passed.
    from scheduler.model import SchedulerConfig

    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, stoppable=False)).json()["id"]
    run_once(api.gateway)
    report(api, job(api, j)["placement"][0]["node"], j, "started", pid=7)
    advance(api, 3600 + 60)
    run_once(api.gateway)
    assert job(api, j)["state_reason"].startswith("renewal due")
    advance(api, 3600 + 660)
    run_once(api.gateway)
    run_once(api.gateway)
    after = job(api, j)
    assert after["state"] == "running", after["history"][-1]
    assert "not renewed" in after["state_reason"] and "its owner must stop or renew it" in after["state_reason"]
    with api.gateway.db.transaction() as s:
        told = s.scalars(select(Notification).where(Notification.principal == "alice",
                                                    Notification.kind == "occupancy_expired")).all()
        assert len(told) == 1  # once, not every cycle
    r = api.post(f"/v1/jobs/{j}/renew", "alice", json={"progress": "epoch 9", "expected_remaining_seconds": 600})
    assert r.status_code == 200, r.text
    assert job(api, j)["state_reason"] == "renewed by alice"


def test_a_new_run_starts_a_new_occupancy_period_with_its_own_renewal_notice(api: Api) -> None:
    # The period was counted from the last renewal ever made, even one of an earlier run, and the renewal-due mark
    # of an earlier run stayed: a job renewed once, then stopped and requeued, was stopped again within a cycle of
    # every restart (for ever), and one that had been due was stopped at its next limit without a notice.
    from scheduler.model import SchedulerConfig

    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    run_once(api.gateway)
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    assert api.post(f"/v1/jobs/{j}/renew", "alice", json={"progress": "epoch 3", "expected_remaining_seconds": 60}
                    ).status_code == 200
    advance(api, 3600 + 60)
    run_once(api.gateway)  # due
    advance(api, 3600 + 660)
    run_once(api.gateway)  # not renewed in the window: stopped, then requeued
    assert job(api, j)["stop_request"]["preemption"]["kind"] == "occupancy"
    report(api, node, j, "stopped", evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, j)["state"] == "pending"

    assert run_once(api.gateway) == 1  # its second run
    report(api, job(api, j)["placement"][0]["node"], j, "started", pid=8)
    advance(api, 60)
    run_once(api.gateway)
    assert job(api, j)["state"] == "running", job(api, j)["history"][-1]
    assert api.get(f"/v1/jobs/{j}/queue", "alice").json()["renewal_due_at"] is None
    advance(api, 3600)
    run_once(api.gateway)  # an hour into the second run: due again, and told so
    assert job(api, j)["state"] == "running" and job(api, j)["state_reason"].startswith("renewal due")
    with api.gateway.db.transaction() as s:
        notes = s.scalars(select(Notification).where(Notification.principal == "alice",
                                                     Notification.kind == "renewal_due")).all()
        assert len(notes) == 2


def test_cluster_hard_cap_is_a_quota_change_too(api: Api) -> None:
    add_second_admin(api)
    r = api.client.put("/v1/quotas/*", headers=api.headers("erin"), json={"gpus": 8, "reason": "half the pool"})
    assert r.status_code == 202, r.text
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "pat", json={}).status_code == 200
    bring_up_nodes(api)
    r = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, nodes=2))
    assert r.status_code == 422 and "cluster's hard quota of 8" in r.json()["detail"]
    first = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    second = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    waiting = second if job(api, first)["state"] == "starting" else first
    assert "cluster quota" in api.get(f"/v1/jobs/{waiting}/queue", "alice").json()["blocking_reason"]


def test_a_cluster_hard_quota_at_the_clusters_size_does_not_stop_a_reclaim(api: Api) -> None:
    # The cluster tier refused the lender's job before any plan: its borrowed GPUs never came back.
    bring_up_nodes(api)
    set_quota(api, "*", 16)
    set_quota(api, "vision", 8)
    set_quota(api, "speech", 8, borrow_limit=8)
    own = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="own")).json()["id"]
    lent = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="lent")).json()["id"]
    assert run_once(api.gateway) == 2
    for j in (own, lent):
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=4242)
    advance(api, 3600)
    mine = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="lender")).json()["id"]
    assert run_once(api.gateway) == 0
    assert job(api, lent)["state"] == "stop_requested" and job(api, own)["state"] == "running"
    assert job(api, lent)["stop_request"]["preemption"] == {"preemptor": mine, "kind": "reclaim"}
    assert "reclaiming" in api.get(f"/v1/jobs/{mine}/queue", "alice").json()["blocking_reason"]
    assert run_once(api.gateway) == 0 and job(api, own)["state"] == "running"  # no second victim meanwhile
    report(api, job(api, lent)["placement"][0]["node"], lent, "stopped",
           evidence={"outcome": "graceful", "exit_code": 0})
    assert run_once(api.gateway) == 1
    assert job(api, mine)["state"] == "starting" and job(api, lent)["state"] == "pending"


def test_a_job_whose_start_command_expired_unfetched_goes_back_to_the_queue(api: Api) -> None:
    # An expired command is never handed out again: the job stayed `starting` for ever, holding its GPUs and
    # quota, and its owner read only where it had been placed.
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    fetched = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="fetched")).json()["id"]
    assert run_once(api.gateway) == 2
    node = job(api, j)["placement"][0]["node"]
    other = job(api, fetched)["placement"][0]["node"]
    def starts(node: str) -> list[str]:
        r = api.client.get(f"/v1/agents/{node}/commands", headers=node_headers(api, node), params={"wait": 0})
        return [json.loads(c["payload"])["job_id"] for c in r.json()["commands"]
                if json.loads(c["payload"])["kind"] == "start"]

    assert starts(other) == [fetched]  # delivered, not yet acknowledged: left to that node's reports
    advance(api, api.settings.command_ttl_s + 60)  # the agents beat, but the first never fetched its command
    assert starts(node) == []
    assert run_once(api.gateway) == 1  # back in the queue, and placed again in the same cycle
    assert job(api, fetched)["state"] == "starting"
    back = job(api, j)
    assert [h["to"] for h in back["history"]] == ["pending", "starting", "pending", "starting"]
    assert "expired before node" in back["history"][2]["reason"]
    with api.gateway.db.transaction() as s:
        assert len(s.scalars(select(Allocation).where(Allocation.job_id == j)).all()) == 1
        notes = s.scalars(select(Notification).where(Notification.principal == "alice",
                                                     Notification.kind == "start_not_delivered")).all()
        assert [n.body["job_id"] for n in notes] == [j]
    assert any(e["body"].get("job_id") == j and e["body"].get("state_after") == "pending"
               for e in ledger_entries(api))
    assert starts(back["placement"][0]["node"]) == [j]  # with a fresh command


def test_a_job_whose_node_was_lost_before_it_fetched_the_start_goes_back_to_the_queue(api: Api) -> None:
    # It was `lost`, withholding GPUs that held nothing; back, the node reported it not there and it ended `failed`
    # though it never ran.
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    dead = job(api, j)["placement"][0]["node"]
    alive = next(n for n in ("demo-node-1", "demo-node-2") if n != dead)
    base = api.gateway.clock()
    for seconds in (60, api.settings.command_ttl_s + 60):
        api.gateway.clock = lambda s=seconds: base + timedelta(seconds=s)
        api.client.post(f"/v1/agents/{alive}/heartbeat", headers=node_headers(api, alive),
                        json={"gpus": 8, "running": []})
        run_once(api.gateway)
        if seconds == 60:
            assert job(api, j)["state"] == "lost"
    now = job(api, j)
    assert now["state"] == "starting" and now["placement"][0]["node"] == alive, now["history"][-1]
    assert [h["to"] for h in now["history"]] == ["pending", "starting", "lost", "pending", "starting"]


def test_a_circular_wait_between_partial_holds_is_detected_and_broken(api: Api) -> None:
    """Q7: two whole-cluster gangs each holding one node and waiting for the other's never run. The scheduler
    finds waiting jobs that hold GPUs, releases what they hold (ledgered), and then starts one gang whole."""
    bring_up_nodes(api)
    first, second = (api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, nodes=2, name=n)).json()["id"]
                     for n in ("g1", "g2"))
    with api.gateway.db.transaction() as s:  # what admission never writes: half of a gang, held while waiting
        s.add(Allocation(job_id=first, node="demo-node-1", gpus=list(range(8)), state="starting"))
        s.add(Allocation(job_id=second, node="demo-node-2", gpus=list(range(8)), state="starting"))
    assert run_once(api.gateway) == 1
    assert job(api, first)["state"] == "starting"
    assert sorted(p["node"] for p in job(api, first)["placement"]) == ["demo-node-1", "demo-node-2"]
    assert job(api, second)["state"] == "pending"
    broken = {e["body"]["job_id"]: e["body"] for e in ledger_entries(api)
              if e["body"].get("result") == "partial_hold_released"}
    assert broken[first]["held"] == [{"node": "demo-node-1", "gpus": list(range(8))}]
    assert broken[second]["held"] == [{"node": "demo-node-2", "gpus": list(range(8))}]
    assert broken[first]["rule"] == "Q7"
    with api.gateway.db.transaction() as s:
        holding = s.execute(select(Allocation.job_id, Allocation.node).where(Allocation.released.is_(False))).all()
    assert sorted(holding) == [(first, "demo-node-1"), (first, "demo-node-2")]  # the second gang holds nothing


def test_only_a_queue_admin_may_submit_urgent_work(api: Api) -> None:
    """Q2/A4: urgent jobs preempt others' running jobs, so choosing that queue is a queue admin's right."""
    r = api.post("/v1/jobs", "alice", json=job_spec(queue="urgent"))
    assert_problem(r, 403, "policy-denied", "alice holds no role in project vision that grants job.submit.urgent")
    assert r.json()["rules"] == ["Q2.urgent_queue"]
    assert [j["id"] for j in api.get("/v1/jobs", "alice").json()["jobs"]] == []  # nothing was queued
    denied = [e["body"] for e in ledger_entries(api) if e["kind"] == "decision"
              and e["body"]["input"]["action"] == "job.submit"]
    assert [d["decision"]["effect"] for d in denied] == ["deny"]  # refused, and on the record
    assert api.post("/v1/jobs", "carol", json=job_spec(queue="urgent")).status_code == 201


def test_a_stored_runtime_limit_past_any_date_does_not_stop_scheduling(api: Api) -> None:
    """Submissions bound the limit now; a row written before that bound still holds 1e308, and the
    scheduler, which adds it to the current time, failed every cycle for every tenant."""
    bring_up_nodes(api)
    old, new = (api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name=n)).json()["id"] for n in "ab")
    with api.gateway.db.transaction() as s:
        s.get(Job, old).runtime_limit_s = 1e308
    assert run_once(api.gateway) == 2
    assert job(api, old)["state"] == job(api, new)["state"] == "starting"


def test_naming_another_owner_lends_the_submitter_no_quota_and_no_standing(api: Api) -> None:
    """The user quota and the contribution score followed whatever owner the submitter named: bob, limited to 2
    GPUs, ran 8 by naming mallory (of another project), and took her higher contribution with it (Q3, Q4)."""
    bring_up_nodes(api)
    set_quota(api, "vision", 16, users={"bob": 2})
    r = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8, owner="mallory"))
    assert_problem(r, 422, "invalid-request", "owner 'mallory' holds no role in project vision")
    r = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8, owner="alice"))
    assert r.status_code == 422 and "more than the user quota of bob in tenant vision (2)" in r.text, r.text
    r = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=2, owner="alice"))  # within bob's own limit
    assert r.status_code == 201 and r.json()["ownership"]["owner"] == "alice", r.text
    parts = api.get(f"/v1/jobs/{r.json()['id']}/queue", "bob").json()["priority"]["parts"]
    assert parts["contribution"] == 10  # bob's, not alice's 20
    mine = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=2)).json()["id"]
    assert api.get(f"/v1/jobs/{mine}/queue", "alice").json()["priority"]["parts"]["contribution"] == 20
