"""Red team: job state and GPU accounting across the glue (scheduling, preemption, stops, agent reports)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gateway_testkit import Api, job_spec, ledger_entries
from sched_testkit import advance, bring_up_nodes, job, node_headers, report, set_quota
from sqlalchemy import select

from gateway.native.scheduler_loop import run_once
from gateway.store.models import Allocation, NodeCommand
from gateway.store.scheduler_tables import PreemptionRow, SchedJob
from scheduler.model import SchedulerConfig

DONE = {"exit_code": 0, "process_group_gone": True}


def _running_gang(api: Api) -> str:
    bring_up_nodes(api)
    gang = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, nodes=2)).json()["id"]
    assert run_once(api.gateway) == 1
    for node in ("demo-node-1", "demo-node-2"):
        report(api, node, gang, "started", pid=10)
    return gang


def test_a_gang_member_that_exited_first_does_not_stop_scheduling_and_frees_only_its_gpus(api: Api) -> None:
    """One node of a running gang reports its part exited (GPUs released there) while the other part still
    runs. The snapshot listed the gang on its whole placement, so the released GPUs were both held and free:
    every cycle raised InconsistentSnapshot, for everybody, and stop escalation (same transaction) stalled."""
    gang = _running_gang(api)
    report(api, "demo-node-1", gang, "exited", evidence=DONE)
    assert job(api, gang)["state"] == "running"  # its other member still runs

    other = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    assert [p["node"] for p in job(api, other)["placement"]] == ["demo-node-1"]
    with api.gateway.db.transaction() as s:
        held = s.execute(select(Allocation.job_id, Allocation.node).where(Allocation.released.is_(False))).all()
    assert sorted(held) == sorted([(gang, "demo-node-2"), (other, "demo-node-1")])


def test_a_gang_member_that_fails_gets_the_others_stopped_and_the_job_ends_failed(api: Api) -> None:
    """Q6: a gang runs whole or not at all. A member that failed left the others waiting for it, often until a
    collective operation timed out, holding 8 GPUs each: the job stayed `running` for ever. The system now
    stops the members still running (decided under the policy and ledgered) and the job ends `failed` with the
    failed member's exit code."""
    gang = _running_gang(api)
    before = len(ledger_entries(api))
    report(api, "demo-node-1", gang, "exited", evidence={"exit_code": 3, "process_group_gone": True})
    assert job(api, gang)["state"] == "stop_requested"
    with api.gateway.db.transaction() as s:
        sent = s.execute(select(NodeCommand.node, NodeCommand.nonce)
                         .where(NodeCommand.job_id == gang, NodeCommand.kind == "stop")).all()
    assert [node for node, _ in sent] == ["demo-node-2"]  # not to the member that already ended
    (decision,) = [e["body"] for e in ledger_entries(api)[before:] if e["kind"] == "decision"]
    assert decision["input"]["actor"]["kind"] == "system"
    assert decision["input"]["targets"][0]["failed_members"] == ["demo-node-1"]
    assert decision["decision"]["effect"] == "allow" and decision["decision"]["rules"] == ["Q6.gang_member_failed"]
    notices = api.get("/v1/notifications", "alice").json()["notifications"]
    assert any(n["kind"] == "job_gang_member_failed" and n["body"]["job_id"] == gang for n in notices)

    report(api, "demo-node-2", gang, "stopped", nonce=sent[0][1], pid=10,
           evidence={"outcome": "graceful", "exit_code": -15, "process_group_gone": True})
    ended = job(api, gang)
    assert (ended["state"], ended["exit_code"]) == ("failed", 3)
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(Allocation).where(Allocation.job_id == gang, Allocation.released.is_(False))).all() \
            == []


def test_a_failed_gang_member_the_policy_does_not_let_the_system_stop_pages_on_call(papi: Api,
                                                                                    policy_dir: Path) -> None:
    """A policy set without the Q6 rule keeps the stop to people: nothing is stopped, and on-call is told
    which job holds GPUs for a member that failed."""
    rules, cases = policy_dir / "jobs.rego", policy_dir / "tests" / "guards.yaml"
    rules.write_text(rules.read_text().replace("count(t.failed_members) > 0", "false"))
    # Its table case goes with it, or the reload is refused (rightly: the set would fail its own tests).
    cases.write_text(cases.read_text().replace("expect: {effect: allow, rules: [Q6.gang_member_failed], "
                                               "obligations: [notify_owner]}", "expect: {effect: deny}"))
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    gang = _running_gang(papi)
    report(papi, "demo-node-1", gang, "exited", evidence={"exit_code": 3, "process_group_gone": True})
    assert job(papi, gang)["state"] == "running"
    notices = papi.get("/v1/notifications", "dave").json()["notifications"]
    (alert,) = [n["body"] for n in notices if n["kind"] == "gang_member_failed"]
    assert (alert["job_id"], alert["node"], alert["exit_code"]) == (gang, "demo-node-1", 3)


def test_an_emergency_stop_taking_over_a_failed_gangs_stop_ends_it_stopped(api: Api) -> None:
    """A final stop that takes over ends the job `stopped`, whatever the stop it took over would have ended in."""
    gang = _running_gang(api)
    report(api, "demo-node-1", gang, "exited", evidence={"exit_code": 3, "process_group_gone": True})
    es = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "job", "value": gang}, "trigger": "safety",
                                                       "reason": "bad outputs", "grace_seconds": 0})
    assert es.status_code == 201, es.text
    report(api, "demo-node-2", gang, "stopped", pid=10,
           evidence={"outcome": "forced", "exit_code": None, "process_group_gone": True})
    assert job(api, gang)["state"] == "stopped"


def test_a_gang_member_that_exits_cleanly_leaves_the_others_running(api: Api) -> None:
    """Members of a distributed run may finish at different times: only a failure stops the rest."""
    gang = _running_gang(api)
    report(api, "demo-node-1", gang, "exited", evidence=DONE)
    assert job(api, gang)["state"] == "running"
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(NodeCommand).where(NodeCommand.job_id == gang, NodeCommand.kind == "stop")).all() \
            == []


def _occupancy_stop_requested(api: Api) -> tuple[str, str]:
    """A running job (pid 7) asked to stop for an unrenewed occupancy period (P3); returns (job, node)."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    advance(api, 3600 + 700)
    run_once(api.gateway)
    assert job(api, j)["state"] == "stop_requested"
    return j, node


def _requeued_by_occupancy(api: Api) -> tuple[str, str]:
    """A running job stopped for an unrenewed occupancy period (P3) and requeued; returns (job, node)."""
    j, node = _occupancy_stop_requested(api)
    report(api, node, j, "stopping")
    report(api, node, j, "stopped", evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "pending"
    return j, node


def test_a_requeued_job_that_later_finishes_succeeds_instead_of_being_requeued_again(api: Api) -> None:
    """The requeue kept the preemption's stop request on the job, so when the next run ended on its own (exit 0)
    the agent's report was taken for the preemption's stop: the finished job went back to the queue with more
    compensation, and would run again and again."""
    j, _ = _requeued_by_occupancy(api)
    advance(api, 3600 + 800)
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=8)
    report(api, node, j, "exited", evidence=DONE)
    done = job(api, j)
    assert done["state"] == "succeeded", done["history"][-1]
    assert done["stop_request"] == {}
    with api.gateway.db.transaction() as s:
        assert s.get(SchedJob, j).preemptions == 1
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] == ["requeued"]



def _nonces(api: Api, job_id: str, kind: str) -> list[str]:
    with api.gateway.db.transaction() as s:
        return list(s.scalars(select(NodeCommand.nonce).where(NodeCommand.job_id == job_id, NodeCommand.kind == kind)
                              .order_by(NodeCommand.created_at)))


def _stop_nonces(api: Api, job_id: str) -> list[str]:
    return _nonces(api, job_id, "stop")


def test_a_resent_stop_report_of_an_earlier_run_does_not_end_the_next_run_on_the_same_node(api: Api) -> None:
    """Agents deliver reports at least once (a batch whose response was lost is posted again). The requeued
    job was placed again on the same node; the resent `stopped` of its first run was folded into the new part:
    the new run was marked stopped and its GPUs released while its start command was on the way (double
    allocation). It must be ledgered as stale and change nothing, also while a later stop is in progress."""
    j, node = _requeued_by_occupancy(api)
    (old_stop,) = _stop_nonces(api, j)
    advance(api, 3600 + 800)
    assert run_once(api.gateway) == 1
    assert [p["node"] for p in job(api, j)["placement"]] == [node]
    old_evidence = {"outcome": "graceful", **DONE}
    report(api, node, j, "stopped", nonce=old_stop, pid=7, evidence=old_evidence)
    assert job(api, j)["state"] == "starting"
    report(api, node, j, "started", pid=8)
    report(api, node, j, "stopping", nonce=old_stop, pid=7)
    report(api, node, j, "stopped", nonce=old_stop, evidence=old_evidence)
    assert job(api, j)["state"] == "running"
    with api.gateway.db.transaction() as s:
        part = s.scalars(select(Allocation).where(Allocation.job_id == j)).one()
        assert (part.state, part.released, part.pid) == ("running", False, 8)

    advance(api, 3600 + 900)
    r = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "done with it"})
    assert r.status_code == 202, r.text
    new_stop = _stop_nonces(api, j)[-1]
    report(api, node, j, "stopped", nonce=old_stop, evidence=old_evidence)  # still the first run's answer
    assert job(api, j)["state"] == "stop_requested"
    report(api, node, j, "stopped", nonce=new_stop, pid=8, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"
    stale = [e["body"] for e in ledger_entries(api) if e["body"].get("stale")]
    assert len(stale) == 4 and {b["job_id"] for b in stale} == {j}



def test_a_resent_start_report_of_an_earlier_run_does_not_take_the_next_runs_place(api: Api) -> None:
    """Before the new run's own `started`, its part knows no pid: a resent `started` of the first run took it,
    and the new run's real reports were then all dropped as being about another process."""
    j, node = _requeued_by_occupancy(api)
    advance(api, 3600 + 800)
    assert run_once(api.gateway) == 1
    first_start, second_start = _nonces(api, j, "start")
    report(api, node, j, "started", nonce=first_start, pid=7)
    report(api, node, j, "started", nonce=second_start, pid=8)
    assert job(api, j)["state"] == "running"
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(Allocation.pid).where(Allocation.job_id == j)).one() == 8
    assert any(e["body"].get("stale") and e["body"].get("event") == "started" for e in ledger_entries(api))


def _lose_node(api: Api, node: str) -> None:
    """Let the heartbeat timeout pass with only the other node beating; the next cycle marks `node` lost."""
    other = "demo-node-2" if node == "demo-node-1" else "demo-node-1"
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=60)
    r = api.client.post(f"/v1/agents/{other}/heartbeat", headers=node_headers(api, other),
                        json={"gpus": 8, "running": []})
    assert r.status_code == 200, r.text


def test_gpus_withheld_by_a_lost_job_still_count_against_the_tenant_quota(api: Api) -> None:
    """Q4: a job whose node went silent is `lost`, its GPUs withheld and its process possibly still running.
    The snapshot left lost (and stop_failed) jobs out, so the tenant's quota looked free: a second job was
    admitted, and when the node came back and the first job resumed, the tenant held twice its quota."""
    bring_up_nodes(api)
    set_quota(api, "vision", 8, borrow_limit=0)
    first = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, first)["placement"][0]["node"]
    report(api, node, first, "started", pid=7)
    _lose_node(api, node)
    second = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="second")).json()["id"]
    assert run_once(api.gateway) == 0
    assert job(api, first)["state"] == "lost"
    assert job(api, second)["state"] == "pending"
    assert "tenant quota of vision" in api.get(f"/v1/jobs/{second}/queue", "alice").json()["blocking_reason"]
    # What admins see agrees with what the scheduler counts.
    vision = next(q for q in api.get("/v1/quotas", "erin").json()["quotas"] if q["project"] == "vision")
    assert vision["in_use"] == {"owned": 8, "borrowed": 0}


def test_a_lost_job_on_a_dead_node_does_not_shrink_the_cluster_cap_for_others(api: Api) -> None:
    """The lost job's GPUs count as in use, and as capacity: the cluster cap of 16 still leaves the other
    node's 8 GPUs to a job of another tenant."""
    bring_up_nodes(api)
    set_quota(api, "*", 16)
    first = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, first)["placement"][0]["node"]
    report(api, node, first, "started", pid=7)
    _lose_node(api, node)
    other = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    assert job(api, first)["state"] == "lost" and job(api, other)["state"] == "starting"


def test_a_preemption_victim_that_finished_before_the_prepare_signal_succeeds_and_is_not_rerun(api: Api) -> None:
    """The stop was asked (here P3 occupancy), but the run exited 0 on its own before the agent signalled it,
    so the agent reports `exited`, not `stopped`. It was requeued as if preempted (graceful, compensation) and
    its finished command started again."""
    j, node = _occupancy_stop_requested(api)
    report(api, node, j, "exited", pid=7, evidence=DONE)
    done = job(api, j)
    assert (done["state"], done["exit_code"]) == ("succeeded", 0), done["history"][-1]
    assert run_once(api.gateway) == 0
    with api.gateway.db.transaction() as s:
        assert s.get(SchedJob, j).preemptions == 0
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] == ["ended"]


def test_a_queued_job_past_its_validity_with_auto_offline_is_not_started(api: Api) -> None:
    """R4: such a job is reclaimed by housekeeping (every 30 s); a scheduling cycle in between started it,
    sending its command to a node only for the next chore to stop it again."""
    bring_up_nodes(api)
    nodes = ("demo-node-1", "demo-node-2")
    full = [api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8)).json()["id"] for _ in nodes]
    assert run_once(api.gateway) == 2  # the cluster is full: the next job waits
    valid_until = (api.gateway.clock() + timedelta(seconds=60)).isoformat()
    expiring = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, valid_until=valid_until,
                                                           auto_offline=True)).json()["id"]
    keeps = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, valid_until=valid_until)).json()["id"]
    for job_id, node in zip(full, nodes, strict=True):
        report(api, node, job_id, "started", pid=10)
        report(api, node, job_id, "exited", evidence=DONE)
    advance(api, 61)
    assert run_once(api.gateway) == 1
    assert job(api, expiring)["state"] == "pending" and job(api, keeps)["state"] == "starting"


def test_a_selector_batch_stop_takes_a_lost_job_as_a_single_stop_does(api: Api) -> None:
    """A job whose node went silent may still run: a single stop takes it (and the returning node is told to stop
    it), but a batch stop by selector left lost jobs out of its matches, so 'stop my sweep' missed them."""
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, labels={"sweep": "lr"})).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    _lose_node(api, node)
    run_once(api.gateway)
    assert job(api, j)["state"] == "lost"
    body = {"selector": {"labels": {"sweep": "lr"}}, "reason": "bad lr grid", "dry_run": True}
    r = api.post("/v1/jobs:stop", "alice", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["targets"] == [j], r.json()
