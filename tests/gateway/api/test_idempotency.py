"""Safe retries with an Idempotency-Key (issue 28, Deliver 2; gateway/api/idempotency.py): a retry with the same
key and body gets the first answer and nothing is done or ledgered again, on any replica; another body under the
key is refused (422); a retry while the first is in flight gets 409; keys are the caller's own, expire after 24 h,
and a malformed one is refused (400)."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, InBackground, assert_problem, job_spec, ledger_entries, start_api
from sqlalchemy import func, select

from gateway.app import create_app
from gateway.bootstrap import open_gateway
from gateway.settings import Settings
from gateway.store import idempotency
from gateway.store.models import Job


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """One demo gateway per store for the whole module (each test uses keys and job names of its own)."""
    data_dir = tmp_path_factory.mktemp("idempotency")
    if request.param == "sqlite":
        yield Settings(data_dir=data_dir)
        return
    import psycopg

    server: str = request.getfixturevalue("pg_server_url")
    names = [f"jobgate_idem_{what}_{secrets.token_hex(4)}" for what in ("biz", "ledger")]
    with psycopg.connect(server, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(server)
    biz, ledger = (urlunsplit(parts._replace(path="/" + name)) for name in names)
    yield Settings(data_dir=data_dir, database_url=biz, ledger_url=ledger)
    with psycopg.connect(server, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def api(settings: Settings) -> Iterator[Api]:
    yield from start_api(settings)


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": f'"{key}"'}


def jobs_named(api: Api, name: str) -> int:
    with api.gateway.db.transaction(immediate=False) as s:
        return int(s.scalar(select(func.count()).select_from(Job).where(Job.name == name)) or 0)


def submit_decisions(api: Api, name: str) -> list[dict[str, Any]]:
    return [e for e in ledger_entries(api) if e["kind"] == "decision"
            and e["body"]["input"]["action"] == "job.submit" and e["body"]["context"]["spec"]["name"] == name]


def test_a_retry_gets_the_first_answer_and_nothing_happens_twice(api: Api) -> None:
    first = api.post("/v1/jobs", "alice", json=job_spec(name="once"), headers=keyed("k-replay"))
    assert first.status_code == 201, first.text
    again = api.post("/v1/jobs", "alice", json=job_spec(name="once"), headers=keyed("k-replay"))
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert again.headers["content-type"] == first.headers["content-type"]
    assert jobs_named(api, "once") == 1
    assert len(submit_decisions(api, "once")) == 1  # the replay is not decided nor ledgered again
    # Without a key, the same body is a new request (today's behaviour).
    assert api.post("/v1/jobs", "alice", json=job_spec(name="once")).status_code == 201
    assert jobs_named(api, "once") == 2


def test_a_refusal_is_replayed_too_and_ledgered_once(api: Api) -> None:
    spec = job_spec(name="not-mine", project="speech")  # alice is no researcher of speech
    first = api.post("/v1/jobs", "alice", json=spec, headers=keyed("k-refused"))
    assert first.status_code == 403, first.text
    again = api.post("/v1/jobs", "alice", json=spec, headers=keyed("k-refused"))
    assert (again.status_code, again.json()) == (403, first.json())
    assert len(submit_decisions(api, "not-mine")) == 1


def test_a_put_is_replayed_too(api: Api) -> None:
    """A quota change asks a second platform admin (A7): its retry is the same approval request, not a second."""
    body = {"gpus": 20, "reason": "a retried quota change"}
    headers = {**api.headers("erin"), **keyed("k-put")}
    first = api.client.put("/v1/quotas/vision", headers=headers, json=body)
    again = api.client.put("/v1/quotas/vision", headers=headers, json=body)
    assert first.status_code in (200, 202) and again.json() == first.json(), first.text
    asked = [e for e in ledger_entries(api) if e["kind"] == "decision"
             and e["body"]["input"]["action"] == "quota.change" and e["body"]["input"]["reason"] == body["reason"]]
    assert len(asked) == 1, asked


def test_the_same_key_with_another_body_or_route_is_refused(api: Api) -> None:
    assert api.post("/v1/jobs", "alice", json=job_spec(name="a"), headers=keyed("k-reused")).status_code == 201
    assert_problem(api.post("/v1/jobs", "alice", json=job_spec(name="b"), headers=keyed("k-reused")),
                   422, "idempotency-key-reused", "another request")
    job_id = api.post("/v1/jobs", "alice", json=job_spec(name="c")).json()["id"]
    assert_problem(api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "reused key"},
                            headers=keyed("k-reused")), 422, "idempotency-key-reused")
    assert jobs_named(api, "b") == 0
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "pending"


def test_keys_are_the_callers_own(api: Api) -> None:
    """bob sending alice's key (and her very body) gets an answer of his own, never hers."""
    mine = api.post("/v1/jobs", "alice", json=job_spec(name="scoped"), headers=keyed("k-shared"))
    yours = api.post("/v1/jobs", "bob", json=job_spec(name="scoped"), headers=keyed("k-shared"))
    assert (mine.status_code, yours.status_code) == (201, 201), yours.text
    assert "idempotent-replayed" not in yours.headers
    assert yours.json()["id"] != mine.json()["id"] and yours.json()["ownership"]["creator"] == "bob"
    assert jobs_named(api, "scoped") == 2


def test_a_key_is_forgotten_after_its_retention_and_purged(api: Api) -> None:
    gw = api.gateway
    assert api.post("/v1/jobs", "alice", json=job_spec(name="old"), headers=keyed("k-old")).status_code == 201
    real_clock = gw.clock
    later = real_clock() + idempotency.RETENTION + timedelta(minutes=1)
    gw.clock = lambda: later
    try:
        # Another body under the key: no longer a reuse, a first use (the key was forgotten).
        r = api.post("/v1/jobs", "alice", json=job_spec(name="new"), headers=keyed("k-old"))
        assert r.status_code == 201 and "idempotent-replayed" not in r.headers, r.text
        assert api.post("/v1/jobs", "alice", json=job_spec(name="other"), headers=keyed("k-older")).status_code == 201
        chore = dict(gw.chores)["idempotency keys past retention"]
        gw.clock = lambda: later + idempotency.RETENTION + timedelta(minutes=1)
        with gw.db.transaction() as s:
            chore(s)
        with gw.db.transaction(immediate=False) as s:
            assert s.scalar(select(func.count()).select_from(idempotency.IdempotencyKey)) == 0
    finally:
        gw.clock = real_clock


@pytest.mark.parametrize(("header", "why"), [
    ('"unterminated', "quoted string"),
    ('"a"b"', "quoted string"),
    ("two words", "quoted string"),
    ('""', "1 to 255"),
    ('"' + "x" * 256 + '"', "this one has 256"),
    ('"caf\u00e9"'.encode(), "ASCII"),  # as bytes: httpx would refuse to send it as a str
])
def test_a_malformed_key_is_refused_before_anything_happens(api: Api, header: str | bytes, why: str) -> None:
    before = len(ledger_entries(api))
    r = api.post("/v1/jobs", "alice", json=job_spec(name="malformed"), headers={"Idempotency-Key": header})
    assert_problem(r, 400, "idempotency-key-invalid", why)
    assert jobs_named(api, "malformed") == 0 and len(ledger_entries(api)) == before


def test_two_keys_in_one_request_are_refused(api: Api) -> None:
    r = api.client.post("/v1/jobs", json=job_spec(name="twice"), headers=httpx.Headers(
        [("Authorization", f"Bearer {api.tokens['alice']}"), ("Idempotency-Key", '"a"'), ("Idempotency-Key", '"b"')]))
    assert_problem(r, 400, "idempotency-key-invalid", "not 2")


def test_a_bare_key_and_its_quoted_form_are_one_key(api: Api) -> None:
    bare = "0" + str(uuid.uuid4())[1:]  # a bare UUID may begin with a digit (no sf-token may)
    first = api.post("/v1/jobs", "alice", json=job_spec(name="bare"), headers={"Idempotency-Key": bare})
    again = api.post("/v1/jobs", "alice", json=job_spec(name="bare"), headers=keyed(bare))
    assert first.status_code == 201 and again.json() == first.json() and jobs_named(api, "bare") == 1


def test_an_answer_a_retry_may_change_is_not_kept(api: Api) -> None:
    """A 503 (the ledger could not be written, nothing changed): the key is forgotten, and the retry acts."""
    gw = api.gateway
    real_enqueue = gw.ledger.enqueue

    def broken(*args: Any, **kwargs: Any) -> Any:
        from ledger.errors import StoreError
        raise StoreError("disk full")

    gw.ledger.enqueue = broken
    try:
        r = api.post("/v1/jobs", "alice", json=job_spec(name="transient"), headers=keyed("k-503"))
    finally:
        gw.ledger.enqueue = real_enqueue
    assert r.status_code == 503, r.text
    retry = api.post("/v1/jobs", "alice", json=job_spec(name="transient"), headers=keyed("k-503"))
    assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers, retry.text
    assert jobs_named(api, "transient") == 1


# --- in flight, and two replicas on one PostgreSQL business database --------------------------------------------


@pytest.fixture
def held_decisions(api: Api) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(entered, release): the gateway's policy decisions wait for `release` once `entered` is set, so that a
    request stays in flight while the test sends its retry."""
    gw = api.gateway
    entered, release = threading.Event(), threading.Event()
    real = gw.policy.decide

    def held(decision_input: dict[str, Any]) -> Any:
        if decision_input.get("action") == "job.submit" and not entered.is_set():  # the first submission
            entered.set()
            assert release.wait(20), "the test never let the decision go"
        return real(decision_input)

    gw.policy.decide = held
    try:
        yield entered, release
    finally:
        release.set()
        gw.policy.decide = real


def test_a_retry_while_the_first_is_in_flight_gets_409(
        api: Api, held_decisions: tuple[threading.Event, threading.Event], settings: Settings) -> None:
    if settings.database_url is None:
        pytest.skip("SQLite: a submission decides on the event loop, so nothing else is served while it is held")
    entered, release = held_decisions
    first = InBackground(lambda: api.post("/v1/jobs", "alice", json=job_spec(name="held"), headers=keyed("k-busy")))
    assert entered.wait(20)
    busy = api.post("/v1/jobs", "alice", json=job_spec(name="held"), headers=keyed("k-busy"))
    assert_problem(busy, 409, "idempotency-key-in-use", "still being processed")
    assert 1 <= int(busy.headers["retry-after"]) <= idempotency.LEASE.total_seconds()
    release.set()
    first.wait(20)
    assert first.answer.status_code == 201
    again = api.post("/v1/jobs", "alice", json=job_spec(name="held"), headers=keyed("k-busy"))
    assert again.json() == first.answer.json() and jobs_named(api, "held") == 1


@pytest.fixture(scope="module")
def replica(api: Api, settings: Settings) -> Iterator[TestClient]:
    """A second replica on the module's PostgreSQL business database and ledger, in this process (its own
    engine, ledger appender and policy engine); the processes' own test is tests/gateway/test_replica_retry.py."""
    if settings.database_url is None:
        pytest.skip("replicas share a PostgreSQL business database")
    with TestClient(create_app(settings, run_scheduler=False, gateway=open_gateway(settings))) as client:
        yield client


@pytest.fixture
def second_replica(replica: TestClient) -> Iterator[TestClient]:
    """The second gateway, its clock given back after the test."""
    gw = replica.app.state.gateway  # type: ignore[attr-defined]
    real_clock = gw.clock
    try:
        yield replica
    finally:
        gw.clock = real_clock


def _on(client: TestClient, api: Api, who: str, **kw: Any) -> httpx.Response:
    return client.post("/v1/jobs", headers={"Authorization": f"Bearer {api.tokens[who]}", **kw.pop("headers")}, **kw)


def test_a_retry_on_another_replica_gets_the_first_answer(api: Api, second_replica: TestClient) -> None:
    first = api.post("/v1/jobs", "alice", json=job_spec(name="replicated"), headers=keyed("k-replica"))
    again = _on(second_replica, api, "alice", json=job_spec(name="replicated"), headers=keyed("k-replica"))
    assert first.status_code == 201 and again.json() == first.json(), again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert jobs_named(api, "replicated") == 1 and len(submit_decisions(api, "replicated")) == 1


def test_a_retry_takes_over_from_a_replica_that_stopped_before_acting(
        api: Api, second_replica: TestClient, held_decisions: tuple[threading.Event, threading.Event]) -> None:
    """The first replica hangs (as one killed would) after reserving the key: the retry on the other is told to
    wait until the reservation's lease runs out, then acts; when the first comes back, its write finds the key
    taken over and does nothing. The job exists once."""
    entered, release = held_decisions
    spec = job_spec(name="taken-over")
    first = InBackground(lambda: api.post("/v1/jobs", "alice", json=spec, headers=keyed("k-dead")))
    assert entered.wait(20)
    busy = _on(second_replica, api, "alice", json=job_spec(name="taken-over"), headers=keyed("k-dead"))
    assert_problem(busy, 409, "idempotency-key-in-use")
    other_gw = second_replica.app.state.gateway  # type: ignore[attr-defined]
    after_lease = other_gw.clock() + idempotency.LEASE + timedelta(seconds=1)
    other_gw.clock = lambda: after_lease
    took_over = _on(second_replica, api, "alice", json=job_spec(name="taken-over"), headers=keyed("k-dead"))
    assert took_over.status_code == 201, took_over.text
    release.set()
    first.wait(20)
    assert_problem(first.answer, 409, "idempotency-key-superseded")
    assert jobs_named(api, "taken-over") == 1
    replay = api.post("/v1/jobs", "alice", json=job_spec(name="taken-over"), headers=keyed("k-dead"))
    assert replay.json() == took_over.json() and replay.headers["idempotent-replayed"] == "true"


def test_a_slow_first_attempt_keeps_its_key_past_the_lease(
        api: Api, second_replica: TestClient, held_decisions: tuple[threading.Event, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt lives but is slow (its decision held longer than the lease): its replica renews the lease,
    so the retry on the other replica is told to wait rather than taking over and deciding a second time."""
    monkeypatch.setattr(idempotency, "LEASE", timedelta(seconds=1))
    monkeypatch.setattr(idempotency, "RENEW_EVERY", timedelta(seconds=0.2))
    entered, release = held_decisions
    first = InBackground(lambda: api.post("/v1/jobs", "alice", json=job_spec(name="slow"), headers=keyed("k-slow")))
    assert entered.wait(20)
    time.sleep(2.5)  # past the lease, more than twice
    busy = _on(second_replica, api, "alice", json=job_spec(name="slow"), headers=keyed("k-slow"))
    assert_problem(busy, 409, "idempotency-key-in-use")
    release.set()
    first.wait(20)
    assert first.answer.status_code == 201, first.answer.text
    again = _on(second_replica, api, "alice", json=job_spec(name="slow"), headers=keyed("k-slow"))
    assert again.json() == first.answer.json() and again.headers["idempotent-replayed"] == "true"
    assert jobs_named(api, "slow") == 1 and len(submit_decisions(api, "slow")) == 1


def test_an_action_whose_answer_was_lost_is_not_done_again(api: Api, second_replica: TestClient,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The first replica acted and stopped before it kept the answer (here: the keeping fails): a retry on the other
    is told the action was carried out, not carried out twice."""
    from gateway.api import idempotency as middleware

    monkeypatch.setattr(middleware, "_finish", _failing_finish)
    first = api.post("/v1/jobs", "alice", json=job_spec(name="lost"), headers=keyed("k-lost"))
    assert first.status_code == 201
    monkeypatch.undo()
    other_gw = second_replica.app.state.gateway  # type: ignore[attr-defined]
    after_lease = other_gw.clock() + idempotency.LEASE + timedelta(seconds=1)
    other_gw.clock = lambda: after_lease
    r = _on(second_replica, api, "alice", json=job_spec(name="lost"), headers=keyed("k-lost"))
    assert_problem(r, 409, "idempotency-answer-lost", "was carried out")
    assert jobs_named(api, "lost") == 1


def _failing_finish(*args: Any) -> None:
    raise RuntimeError("the business database went away as the answer was kept")



def test_the_openapi_document_names_the_key_on_every_mutating_operation() -> None:
    doc = create_app(Settings()).openapi()
    mutating = [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()
                if m in ("post", "put", "delete") and p.startswith("/v1/") and "security" in op]
    assert len(mutating) >= 31
    missing = [f"{m.upper()} {p}" for m, p, op in mutating
               if not any(q["in"] == "header" and q["name"] == "Idempotency-Key" for q in op.get("parameters", []))
               or not {"409", "422"} <= set(op["responses"])]
    assert not missing, missing
    reads = [op for ops in doc["paths"].values() for m, op in ops.items() if m == "get"]
    assert not any(q["name"] == "Idempotency-Key" for op in reads for q in op.get("parameters", []))
