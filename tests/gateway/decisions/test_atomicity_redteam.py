"""Red team: atomicity, fail-closed behaviour and concurrency of job mutations (M2, H3; record first)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from approval_testkit import ask_stop, job_state
from fastapi.testclient import TestClient
from gateway_testkit import Api, assert_problem, job_spec, ledger_entries
from sched_testkit import advance, bring_up_nodes, job, report
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gateway.decisions.reconcile import SETTLE_S
from gateway.housekeeping import run_all
from gateway.jobs.records import lock_jobs
from gateway.jobs.stops import STOP_CONFIRM_MARGIN_S
from gateway.native.scheduler_loop import run_once
from gateway.store.models import Allocation, NodeCommand
from gateway.store.scheduler_tables import PreemptionRow
from gateway.store.service_tables import Approval
from scheduler.model import SchedulerConfig

DONE = {"exit_code": 0, "process_group_gone": True}


def _stop_nonces(api: Api, job_id: str) -> list[str]:
    with api.gateway.db.transaction() as s:
        return list(
            s.scalars(
                select(NodeCommand.nonce)
                .where(NodeCommand.job_id == job_id, NodeCommand.kind == "stop")
                .order_by(NodeCommand.created_at)
            )
        )


@contextmanager
def commits_fail() -> Iterator[None]:
    """Every business transaction's commit fails inside the block, as a database refusing it would."""

    def fail(session: Any) -> None:
        raise RuntimeError("the business database refused the commit")

    event.listen(Session, "before_commit", fail)
    try:
        yield
    finally:
        event.remove(Session, "before_commit", fail)


def _running(api: Api, who: str = "alice") -> tuple[str, str]:
    """A job the scheduler placed and its agent started (pid 7); returns (job, node)."""
    bring_up_nodes(api)
    j = api.post("/v1/jobs", who, json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    assert job(api, j)["state"] == "running"
    return j, node


def test_a_second_stop_of_a_stopping_job_does_not_restart_the_stop(api: Api) -> None:
    """A stop of a job already stopping replaced its stop request and sent a second stop command. The node's
    answer to the first command then looked like one to an earlier stop and was dropped as stale, so the job
    never left `stopping`; and each repeat pushed the escalation deadline further out."""
    j, node = _running(api)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "wrong config"}).status_code == 202
    (first,) = _stop_nonces(api, j)
    asked = job(api, j)["stop_request"]["at"]
    advance(api, 5)
    again = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "really, stop it"})
    assert again.status_code == 202, again.text
    assert _stop_nonces(api, j) == [first]
    assert job(api, j)["stop_request"]["at"] == asked
    outcome = ledger_entries(api)[-1]["body"]
    assert outcome["took_over_stop"] and outcome["decision_seq"] == again.json()["decision"]["ledger_seq"]
    report(api, node, j, "stopping", nonce=first, pid=7)
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"


def test_an_approved_stop_of_a_job_its_owner_stopped_meanwhile_sends_nothing_more(api: Api) -> None:
    j, node = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "I stop it myself"}).status_code == 202
    (first,) = _stop_nonces(api, j)
    advance(api, 5)
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 200, r.text
    assert _stop_nonces(api, j) == [first]
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"


def test_a_stop_does_not_take_a_deleted_or_paused_job_out_of_its_state(api: Api) -> None:
    j, node = _running(api)
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the node"}).status_code == 202
    (pause_stop,) = _stop_nonces(api, j)
    report(api, node, j, "stopped", nonce=pause_stop, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "paused"
    r = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "stop the paused one"})
    assert r.status_code == 409, r.text
    assert job(api, j)["state"] == "paused" and _stop_nonces(api, j) == [pause_stop]
    r = api.client.request("DELETE", f"/v1/jobs/{j}", headers=api.headers("alice"), json={"reason": "not needed"})
    assert r.status_code == 202, r.text
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "carol").status_code == 200
    r = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "stop the deleted one"})
    assert r.status_code == 409, r.text
    assert job_state(api, j) == "deleted" and _stop_nonces(api, j) == [pause_stop]


def test_a_persons_stop_of_a_job_being_preempted_ends_it_instead_of_requeueing_it(api: Api) -> None:
    """The stop joins the preemption's stop in progress (no second command) and makes it final."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    j, node = _running(api)
    advance(api, 3600 + 700)
    run_once(api.gateway)
    assert job(api, j)["stop_request"].get("preemption")
    (first,) = _stop_nonces(api, j)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "I do not want it back"}).status_code == 202
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped" and _stop_nonces(api, j) == [first]
    with api.gateway.db.transaction() as s:
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] == ["superseded"]


def test_an_approved_stop_of_a_job_paused_meanwhile_leaves_it_paused(api: Api) -> None:
    j, node = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the node"}).status_code == 202
    (pause_stop,) = _stop_nonces(api, j)
    report(api, node, j, "stopped", nonce=pause_stop, pid=7, evidence={"outcome": "graceful", **DONE})
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 200, r.text
    assert r.json()["resolution"]["result"]["not_stoppable"] == [{"id": j, "state": "paused"}]
    assert job(api, j)["state"] == "paused" and _stop_nonces(api, j) == [pause_stop]


def _expire(api: Api, approval_id: str) -> None:
    with api.gateway.db.transaction() as s:
        a = s.get(Approval, approval_id)
        a.expires_at = a.created_at - timedelta(seconds=1)


def test_an_expired_approval_stays_expired_and_its_expiry_is_ledgered_once(api: Api) -> None:
    """The expiry was written in the transaction the 409 then rolled back: the request stayed pending in every
    listing while the ledger said it expired, once more on every later attempt."""
    j, _ = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    _expire(api, approval_id)
    for who in ("alice", "dave"):
        r = api.post(f"/v1/approvals/{approval_id}/approve", who)
        assert r.status_code == 409 and "expired" in r.json()["detail"], r.text
    r = api.post(f"/v1/approvals/{approval_id}/reject", "carol", json={"reason": "withdrawn"})
    assert r.status_code == 409, r.text
    shown = api.get(f"/v1/approvals/{approval_id}", "alice").json()
    assert shown["state"] == "expired" and shown["resolved_at"]
    assert [a["id"] for a in api.get("/v1/approvals", "alice", params={"state": "pending"}).json()["approvals"]] == []
    expired = [
        e
        for e in ledger_entries(api)
        if e["body"].get("approval_id") == approval_id and e["body"].get("result") == "expired"
    ]
    assert len(expired) == 1
    assert job_state(api, j) == "running"


def test_an_approval_nobody_answers_expires_on_its_own(api: Api) -> None:
    j, _ = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    _expire(api, approval_id)
    run_all(api.gateway)
    assert api.get(f"/v1/approvals/{approval_id}", "alice").json()["state"] == "expired"
    assert [e["body"]["result"] for e in ledger_entries(api) if e["body"].get("approval_id") == approval_id][
        -1
    ] == "expired"


class _Interleave:
    """Holds the scheduler's cycle just before it ledgers a step it decided from the queue as it read it (an
    entry of `kind` whose body has `key` = `value`), until released. Real threads, the real cycle and ledger;
    the pause is the only addition."""

    def __init__(self, api: Api, kind: str, key: str, value: str) -> None:
        self.api, self.kind, self.key, self.value = api, kind, key, value
        self.append = api.gateway.ledger.append
        self.held, self.go = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._cycle, name="cycle-under-test")
        self.error: BaseException | None = None
        api.gateway.ledger.append = self._append

    def _append(self, kind: str, body: Any, **kw: Any) -> Any:
        if threading.current_thread() is self.thread and kind == self.kind and _at(body, self.key) == self.value:
            self.held.set()
            self.go.wait(60)
        return self.append(kind, body, **kw)

    def _cycle(self) -> None:
        try:
            run_once(self.api.gateway)
        except BaseException as e:  # reported by finish()
            self.error = e

    def start(self) -> None:
        self.thread.start()
        assert self.held.wait(60), f"the cycle never ledgered a {self.kind} with {self.key} {self.value}"

    def finish(self) -> None:
        self.go.set()
        self.thread.join(60)
        del self.api.gateway.ledger.append
        assert self.error is None, repr(self.error)


def _at(body: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        body = body.get(key) if isinstance(body, dict) else None
    return body


def _blocked_or_done(api: Api, call: threading.Thread) -> None:
    """Wait until `call` has finished or waits for a row lock in the business database."""
    url = api.settings.resolved_database_url()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(6000):
            if not call.is_alive():
                return
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'", (name,)
            ).fetchone()
            if waiting and waiting[0]:
                return
            call.join(0.01)
    raise AssertionError("the call neither finished nor waited for a lock")


def _commands(api: Api, job_id: str) -> list[str]:
    with api.gateway.db.transaction() as s:
        return list(
            s.scalars(select(NodeCommand.kind).where(NodeCommand.job_id == job_id).order_by(NodeCommand.created_at))
        )


def _held_parts(api: Api, job_id: str) -> int:
    with api.gateway.db.transaction() as s:
        return len(
            s.scalars(select(Allocation).where(Allocation.job_id == job_id, Allocation.released.is_(False))).all()
        )


def test_a_queued_job_cancelled_while_the_cycle_places_it_is_not_started(api: Api) -> None:
    """PostgreSQL: the cycle read the job as pending, its owner cancelled it (row lock, committed), and the
    cycle then wrote `starting` over `stopped` from its stale copy and sent the start command: a job its owner
    had stopped ran, and its history lost the stop."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the stop waits for it")
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    cycle = _Interleave(api, "schedule", "result", "admitted")
    cycle.start()
    answers: list[httpx.Response] = []
    stop = threading.Thread(
        target=lambda: answers.append(api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "wrong data"}))
    )
    stop.start()
    _blocked_or_done(api, stop)
    cycle.finish()
    stop.join(60)
    (answer,) = answers
    assert answer.status_code == 202, answer.text
    final = job(api, j)
    if answer.json()["job"]["state"] == "stopped":  # cancelled before the cycle could start it
        assert final["state"] == "stopped" and final["history"][-1]["to"] == "stopped", final["history"]
        assert _commands(api, j) == [] and _held_parts(api, j) == 0
    else:  # the cycle started it first; the stop then went to its node
        assert final["state"] == "stop_requested" and _commands(api, j) == ["start", "stop"]


def _occupancy_due(api: Api) -> tuple[str, str]:
    """A running job (pid 7) past its maximum occupancy without renewal: the next cycle stops and requeues it."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    j, node = _running(api)
    advance(api, 3600 + 700)
    return j, node


def _in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_a_persons_stop_during_the_cycles_preemption_of_the_job_is_final(api: Api) -> None:
    """PostgreSQL: the cycle read the job as running and decided to preempt it; the owner's stop committed
    meanwhile; the cycle then wrote its preemption over the stop and sent a second stop command. The job went
    back to the queue instead of ending, and the node's answer to the owner's stop was dropped as stale."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the stop waits for it")
    j, node = _occupancy_due(api)
    cycle = _Interleave(api, "decision", "input.action", "job.preempt")
    cycle.start()
    stop, answers = _in_thread(lambda: api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "done with it"}))
    _blocked_or_done(api, stop)
    cycle.finish()
    stop.join(60)
    assert answers[0].status_code == 202, answers[0].text
    (nonce,) = _stop_nonces(api, j)
    report(api, node, j, "stopped", nonce=nonce, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped", job(api, j)["history"]


def test_a_job_that_exits_while_the_cycle_preempts_it_ends_as_it_ran(api: Api) -> None:
    """PostgreSQL: a node's report (read without a lock) and the cycle's preemption each wrote their own copy
    of the job over the other's: a job that had exited was stopped and requeued to run again, or a preempted
    job's history lost the stop while its preemption record stayed open for ever."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the report waits for it")
    j, node = _occupancy_due(api)
    cycle = _Interleave(api, "decision", "input.action", "job.preempt")
    cycle.start()
    exited, _ = _in_thread(lambda: report(api, node, j, "exited", pid=7, evidence=DONE))
    _blocked_or_done(api, exited)
    cycle.finish()
    exited.join(60)
    final = job(api, j)
    assert final["state"] == "succeeded", final["history"]
    assert [h["to"] for h in final["history"]][-2:] in (["running", "succeeded"], ["stop_requested", "succeeded"])
    with api.gateway.db.transaction() as s:
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] in ([], ["ended"])


def test_a_stop_confirmed_while_the_cycle_escalates_it_stays_stopped(api: Api) -> None:
    """PostgreSQL: the cycle read the stop as unconfirmed past its deadline, the node's `stopped` committed
    meanwhile, and the cycle wrote stop_failed over stopped: on-call was paged for a stop that had succeeded."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the report waits for it")
    j, node = _running(api)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "wrong config"}).status_code == 202
    (nonce,) = _stop_nonces(api, j)
    advance(api, 30 + STOP_CONFIRM_MARGIN_S + 5)
    cycle = _Interleave(api, "transition", "state_after", "stop_failed")
    cycle.start()
    stopped, _ = _in_thread(
        lambda: report(api, node, j, "stopped", nonce=nonce, pid=7, evidence={"outcome": "graceful", **DONE})
    )
    _blocked_or_done(api, stopped)
    cycle.finish()
    stopped.join(60)
    final = job(api, j)
    assert final["state"] == "stopped", final["history"]
    assert [h["to"] for h in final["history"]][-1] == "stopped"


def test_a_stop_while_the_cycle_marks_the_node_lost_is_not_undone(api: Api) -> None:
    """PostgreSQL: the cycle read the job as running on a node gone silent, the owner's stop committed
    meanwhile, and the cycle wrote `lost` over stop_requested: the stop vanished from the job's state."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the stop waits for it")
    j, _ = _running(api)
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=api.settings.node_heartbeat_timeout_s + 5)
    cycle = _Interleave(api, "transition", "state_after", "lost")
    cycle.start()
    stop, answers = _in_thread(lambda: api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "done with it"}))
    _blocked_or_done(api, stop)
    cycle.finish()
    stop.join(60)
    assert answers[0].status_code == 202, answers[0].text
    final = job(api, j)
    assert final["state"] == "stop_requested", final["history"]
    assert [h["to"] for h in final["history"]][-2:] == ["lost", "stop_requested"]


def test_two_creations_of_one_service_account_at_once_get_a_conflict_not_a_bare_500(api: Api) -> None:
    """PostgreSQL: both requests found the name free; the later INSERT broke the primary key and the caller got
    a bare 'Internal Server Error' instead of a problem saying what happened."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the creations run one after the other")
    client = TestClient(api.client.app, raise_server_exceptions=False)
    for i in range(5):
        barrier = threading.Barrier(2)

        def create(who: str, project: str, name: str = f"race-bot-{i}", barrier: threading.Barrier = barrier) -> Any:
            barrier.wait()
            body = {"name": name, "project": project, "description": "made twice at once"}
            return client.post("/v1/service-accounts", headers=api.headers(who), json=body)

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(create, ["alice", "mallory"], ["vision", "speech"]))
        assert sum(r.status_code == 201 for r in answers) == 1, [r.text for r in answers]
        for r in answers:
            if r.status_code != 201:
                assert_problem(r, 409, "conflict")


def test_a_stop_while_the_business_database_is_down_is_a_503_problem(api: Api) -> None:
    if api.gateway.db.is_sqlite:
        pytest.skip("a PostgreSQL outage: new connections are refused")
    j, _ = _running(api)
    size = api.gateway.ledger.size()
    url = api.settings.resolved_database_url()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            client = TestClient(api.client.app, raise_server_exceptions=False)
            r = client.post(f"/v1/jobs/{j}/stop", headers=api.headers("alice"), json={"reason": "db is down"})
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert_problem(r, 503, "database-unavailable", "nothing was changed")
    assert "Traceback" not in r.text and "SELECT" not in r.text
    assert api.gateway.ledger.size() == size
    assert job(api, j)["state"] == "running"


def test_a_job_that_exits_while_a_batch_stop_is_decided_ends_as_it_ran(api: Api) -> None:
    """PostgreSQL: the batch read its jobs without a lock and stopped them from that copy; a node's `exited`
    committed between the read and the write was undone, and a finished job went back to stop_requested with a
    stop command sent for a process that was gone."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the batch holds the write lock, the report waits for it")
    j, node = _running(api)
    engine = api.gateway.policy
    decide, held, go = engine.decide, threading.Event(), threading.Event()

    def hold(doc: dict[str, Any]) -> Any:  # the batch has read its jobs; it decides before it writes
        if doc["action"] == "job.stop":
            held.set()
            go.wait(60)
        return decide(doc)

    engine.decide = hold  # type: ignore[method-assign]
    try:
        batch, answers = _in_thread(
            lambda: api.post("/v1/jobs:stop", "alice", json={"ids": [j], "reason": "bad learning rate"})
        )
        assert held.wait(60)
        exited, _ = _in_thread(lambda: report(api, node, j, "exited", pid=7, evidence=DONE))
        _blocked_or_done(api, exited)
        go.set()
        batch.join(60)
        exited.join(60)
    finally:
        del engine.decide
    assert answers[0].status_code in (200, 202), answers[0].text
    final = job(api, j)
    # Either order is right: the exit first (the batch then skips a finished job) or the stop first (the exit
    # then ends the stop). Never a finished job taken back to stop_requested.
    assert final["state"] in ("succeeded", "stopped"), final["history"]


def test_a_service_account_whose_creation_does_not_commit_holds_no_role(api: Api) -> None:
    """Its role was granted in the policy engine before the commit: when the commit failed, the account that
    does not exist held the role in memory, and a later account of that name got it without being given it."""
    body = {"name": "doomed-bot", "project": "vision", "description": "never committed"}
    with commits_fail():
        r = TestClient(api.client.app, raise_server_exceptions=False).post(
            "/v1/service-accounts", headers=api.headers("alice"), json=body)
    assert r.status_code == 500, r.text
    assert api.gateway.policy.roles_of("doomed-bot") == {}


def test_a_request_the_database_aborts_to_break_a_deadlock_is_a_409_to_try_again(api: Api) -> None:
    """PostgreSQL breaks a deadlock by aborting one of the transactions (SQLSTATE 40P01): the caller was told
    the business database was unavailable (503), which sends on-call looking for an outage that is not there."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: one writer at a time, no deadlock")
    ids = [api.post("/v1/jobs", "alice", json=job_spec(name=f"d{i}")).json()["id"] for i in range(2)]
    barrier, aborted = threading.Barrier(2), []

    def lock(first: str, then: str) -> None:  # the same two rows, in opposite orders
        try:
            with api.gateway.db.transaction() as s:
                lock_jobs(s, [first])
                barrier.wait(10)
                lock_jobs(s, [then])
        except OperationalError as e:
            aborted.append(e)

    threads = [threading.Thread(target=lock, args=pair) for pair in (ids, ids[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (deadlock,) = aborted

    def aborted_request() -> None:
        raise deadlock

    api.client.app.add_api_route("/test/aborted", aborted_request)
    r = TestClient(api.client.app, raise_server_exceptions=False).get("/test/aborted", headers=api.headers("alice"))
    assert_problem(r, 409, "conflict", "try again")
    assert "Traceback" not in r.text and "SELECT" not in r.text


def test_the_cycle_locks_every_job_it_may_change_before_it_changes_any(api: Api) -> None:
    """PostgreSQL: the cycle locked its jobs one step after another (node health, stop escalation, the P3
    occupancy stop, then admissions and victims), holding some while it waited for others; a request holding one
    of those and waiting for one the cycle held (a batch stop locks its jobs in id order) deadlocked with it,
    and PostgreSQL aborted one of them. Now a job the cycle has not reached yet is already locked: a stop of it
    waits for the cycle instead of taking it first."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle holds the write lock, the stop waits for it")
    z, _ = _occupancy_due(api)  # running on one node, past its maximum occupancy
    waiting = api.post("/v1/jobs", "alice", json=job_spec(nodes=2, gpus_per_node=8)).json()["id"]  # cannot fit
    cycle = _Interleave(api, "decision", "input.action", "job.preempt")  # the cycle is at Z's occupancy stop
    cycle.start()
    stop, answers = _in_thread(lambda: api.post(f"/v1/jobs/{waiting}/stop", "alice", json={"reason": "not now"}))
    _blocked_or_done(api, stop)
    blocked = stop.is_alive()
    cycle.finish()
    stop.join(60)
    assert blocked, "the stop of a job the cycle had not locked yet went first"
    assert answers[0].status_code == 202, answers[0].text
    assert job(api, waiting)["state"] == "stopped" and job(api, z)["state"] == "stop_requested"


def test_entries_reporting_a_change_that_did_not_commit_are_retracted_in_the_ledger(api: Api) -> None:
    """A stop's outcome and transition entries are made durable just before its commit. When the commit then
    failed, the ledger said the job was being stopped while the database had rolled the stop back, and nothing
    ever said otherwise: one entry now retracts them. The decision stands as decided and is not retracted."""
    j, _ = _running(api)
    before = len(ledger_entries(api))
    with commits_fail():
        r = TestClient(api.client.app, raise_server_exceptions=False).post(
            f"/v1/jobs/{j}/stop", headers=api.headers("alice"), json={"reason": "wrong config"})
    assert r.status_code == 500, r.text
    assert job(api, j)["state"] == "running"
    written = ledger_entries(api)[before:]
    decision = next(e for e in written if e["kind"] == "decision")
    reports = [e["seq"] for e in written if e["kind"] in ("outcome", "transition") and "retracts" not in e["body"]]
    assert reports, "the stop wrote no outcome before its commit: nothing to retract"
    (retraction,) = [e["body"] for e in written if "retracts" in e["body"]]
    assert retraction["result"] == "rolled_back" and retraction["error"] == "RuntimeError"
    assert retraction["retracts"] == reports and decision["seq"] not in retraction["retracts"]


def test_a_decision_whose_outcome_was_retracted_is_closed_with_the_state_that_holds(api: Api) -> None:
    """The retraction says the stop was not done; reconciliation then closes the stop's decision as it closes
    one that never got an outcome: not_confirmed, naming the retraction, with the job's state now."""
    j, _ = _running(api)
    before = len(ledger_entries(api))
    with commits_fail():
        TestClient(api.client.app, raise_server_exceptions=False).post(
            f"/v1/jobs/{j}/stop", headers=api.headers("alice"), json={"reason": "wrong config"})
    written = ledger_entries(api)[before:]
    decision = next(e["seq"] for e in written if e["kind"] == "decision")
    retraction = next(e["seq"] for e in written if "retracts" in e["body"])
    gw = api.gateway
    now = gw.clock()
    gw.clock = lambda: now + timedelta(seconds=SETTLE_S + 1)
    run_all(gw)
    (closing,) = [e["body"] for e in ledger_entries(api) if e["body"].get("reconciled")]
    assert closing["decision_seq"] == decision and closing["result"] == "not_confirmed"
    assert f"retracted (seq {retraction})" in closing["why"]
    assert closing["state_now"] == {"jobs": {j: "running"}}


def test_a_change_that_commits_retracts_nothing(api: Api) -> None:
    j, _ = _running(api)
    before = len(ledger_entries(api))
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "wrong config"}).status_code == 202
    assert not [e for e in ledger_entries(api)[before:] if "retracts" in e["body"]]
