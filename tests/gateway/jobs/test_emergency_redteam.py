"""Red team: emergency stops (C2, C3, C6) as on-call and the security reviewer meet them."""

from __future__ import annotations

from typing import Any

from gateway_testkit import Api, job_spec
from sched_testkit import advance, bring_up_nodes, job, report
from sqlalchemy import Engine, event
from stop_helpers import FakeAgent, ledger, running_job, stopped_evidence

from gateway.jobs.stops import STOP_CONFIRM_MARGIN_S
from gateway.native.scheduler_loop import run_once
from scheduler.model import SchedulerConfig

DONE = {"exit_code": 0, "process_group_gone": True}


def body(kind: str, value: object) -> dict[str, object]:
    return {"scope": {"kind": kind, "value": value}, "trigger": "security", "reason": "leaked credentials",
            "grace_seconds": 0}


def _being_preempted(api: Api, **spec: Any) -> tuple[str, str]:
    """A running job asked to stop and be requeued for an unrenewed occupancy period (P3); (job, node)."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, **spec)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    advance(api, 3600 + 700)
    run_once(api.gateway)
    assert job(api, j)["state"] == "stop_requested" and job(api, j)["stop_request"]["preemption"]
    return j, node


def test_a_job_being_preempted_is_stopped_for_good_by_an_emergency_stop_not_requeued(api: Api) -> None:
    """A job whose preemption (here P3 occupancy) was under way when the emergency stop came was not in the
    stop's scope at all (only queued and running jobs were): a job-level stop was refused with 422 'no running
    or queued job', and once the preemption ended the job went back to the queue and ran again."""
    j, node = _being_preempted(api)
    r = api.post("/v1/emergency-stops", "dave", json=body("job", j))
    assert r.status_code == 201, r.text
    es = r.json()
    assert [x["job_id"] for x in es["jobs"]] == [j] and es["summary"]["in_progress"] == 1
    taken = job(api, j)["stop_request"]
    assert taken["emergency_id"] == es["id"] and "preemption" not in taken
    report(api, node, j, "stopping")
    report(api, node, j, "stopped", evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"
    assert run_once(api.gateway) == 0
    done = api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()
    assert done["state"] == "done" and done["summary"]["stopped_graceful"] == 1


def test_a_scope_stop_counts_the_jobs_already_stopping_in_it(api: Api) -> None:
    """The same for a whole environment: the job being preempted is a target, reported until it ends."""
    j, node = _being_preempted(api, environment="staging")
    r = api.post("/v1/emergency-stops", "sam", json=body("environment", "staging"))
    assert r.status_code == 202, r.text
    es = r.json()
    assert [x["job_id"] for x in es["jobs"]] == [j]
    assert api.post(f"/v1/approvals/{es['approval_id']}/approve", "dave", json={}).status_code == 200
    report(api, node, j, "stopped", evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"
    assert api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()["state"] == "done"


def test_a_job_being_paused_ends_stopped_not_resumable_by_its_owner(api: Api) -> None:
    """A pause under way when the emergency stop came would have ended `paused`, which its owner may resume at
    once; taken over by the emergency stop, it ends `stopped`."""
    agent = FakeAgent(api, "demo-node-1")
    agent.beat()
    agent.take()
    j, _ = running_job(api, agent)
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "lunch"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    es = api.post("/v1/emergency-stops", "dave", json=body("job", j))
    assert es.status_code == 201, es.text
    agent.report(j, "stopped", stop["nonce"], evidence=stopped_evidence())
    assert job(api, j)["state"] == "stopped"
    assert api.post(f"/v1/jobs/{j}/resume", "alice", json={"reason": "back"}).status_code == 409
    (step,) = [e["body"] for e in ledger(api) if e["kind"] == "transition" and e["body"].get("takes_over_stop")]
    assert step["job_id"] == j and step["dropped"] == ["pause"] and step["emergency_id"] == es.json()["id"]


def test_an_emergency_stop_brings_forward_the_kill_of_a_stop_with_a_long_window(api: Api, agent: FakeAgent) -> None:
    """C2: a job already stopping with an hour's grace window kept that hour when an emergency stop (window 0)
    took the stop over: no command went to its node, and escalation waited the hour too. Each node still
    stopping now gets a stop with the shorter window, and escalation follows the earlier end."""
    j, _ = running_job(api, agent, grace_seconds=3600)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "done"}).status_code == 202
    (first,) = [c for c in agent.take() if c["kind"] == "stop"]
    assert first["params"]["grace_seconds"] == 3600
    agent.report(j, "stopping", first["nonce"])
    advance(api, 10)
    es = api.post("/v1/emergency-stops", "dave", json=body("job", j))
    assert es.status_code == 201, es.text
    (cut,) = [c for c in agent.take() if c["kind"] == "stop"]
    assert cut["params"]["grace_seconds"] == 0
    (step,) = [e["body"] for e in ledger(api) if e["kind"] == "transition" and e["body"].get("takes_over_stop")]
    assert step["grace_cut_to"] == 0
    assert 10 <= job(api, j)["stop_request"]["grace_seconds"] < 11  # the window, counted from the first stop
    # Unconfirmed past the shorter end (plus the margin), on-call is paged; an hour is not waited out.
    advance(api, STOP_CONFIRM_MARGIN_S + 2)
    run_once(api.gateway)
    assert job(api, j)["state"] == "stop_failed"


def test_an_emergency_stop_with_a_longer_window_leaves_the_stop_in_progress_alone(api: Api, agent: FakeAgent) -> None:
    j, _ = running_job(api, agent, grace_seconds=5)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "done"}).status_code == 202
    agent.take()
    r = api.post("/v1/emergency-stops", "dave", json={**body("job", j), "grace_seconds": 60})
    assert r.status_code == 201, r.text
    assert [c for c in agent.take() if c["kind"] == "stop"] == []
    (step,) = [e["body"] for e in ledger(api) if e["kind"] == "transition" and e["body"].get("takes_over_stop")]
    assert "grace_cut_to" not in step and job(api, j)["stop_request"].get("grace_seconds", 5) == 5


def _placed(api: Api, n: int = 1) -> list[tuple[str, str]]:
    """n running jobs; [(job, node)]."""
    bring_up_nodes(api)
    ids = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=1)).json()["id"] for _ in range(n)]
    assert run_once(api.gateway) == n
    out = [(j, job(api, j)["placement"][0]["node"]) for j in ids]
    for j, node in out:
        report(api, node, j, "started", pid=7)
    return out


def test_a_stop_is_done_when_its_last_target_stopped_not_when_someone_first_looked(api: Api) -> None:
    """A stop became `done` when someone viewed it, and its finished_at was the time of that view: an auditor
    reading the stop an hour later saw it finish an hour late."""
    [(j, node)] = _placed(api)
    es = api.post("/v1/emergency-stops", "dave", json=body("job", j)).json()
    report(api, node, j, "stopping")
    report(api, node, j, "stopped", evidence={"outcome": "graceful", **DONE})
    stopped_at = job(api, j)["history"][-1]["at"]
    advance(api, 3600)
    shown = api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()
    assert shown["state"] == "done" and shown["finished_at"] == stopped_at
    advance(api, 86400)  # stored as it was first seen, not found again later
    listed = api.get("/v1/emergency-stops", "dave").json()["emergency_stops"]
    assert [(s["id"], s["state"], s["finished_at"]) for s in listed] == [(es["id"], "done", stopped_at)]


def test_viewing_emergency_stops_takes_no_write_lock_and_reads_as_often_for_one_stop_as_for_three(
    api: Api,
) -> None:
    """The list and the single view ran in an immediate transaction (SQLite's write lock, which every
    mutation waits for), and the list made four queries per stop while the console polled it."""
    targets = [j for j, _ in _placed(api, 3)]
    api.post("/v1/emergency-stops", "dave", json=body("job", targets[0]))

    def statements_of(path: str) -> list[str]:
        seen: list[str] = []

        def note(conn: object, cursor: object, statement: str, *args: object) -> None:
            seen.append(statement)

        event.listen(Engine, "before_cursor_execute", note)
        try:
            r = api.get(path, "dave")
        finally:
            event.remove(Engine, "before_cursor_execute", note)
        assert r.status_code == 200, r.text
        return seen

    statements_of("/v1/emergency-stops")  # warm: the caller's token is looked up once, then cached
    one = statements_of("/v1/emergency-stops")
    for j in targets[1:]:
        api.post("/v1/emergency-stops", "dave", json=body("job", j))
    three = statements_of("/v1/emergency-stops")
    assert len(api.get("/v1/emergency-stops", "dave").json()["emergency_stops"]) == 3
    assert len(three) == len(one)
    writes = [s for s in one + three if s.split()[0] in ("INSERT", "UPDATE", "DELETE") or "IMMEDIATE" in s]
    assert not writes
    es_id = api.get("/v1/emergency-stops", "dave").json()["emergency_stops"][0]["id"]
    assert not [s for s in statements_of(f"/v1/emergency-stops/{es_id}") if "IMMEDIATE" in s or s.startswith("UPDATE")]
