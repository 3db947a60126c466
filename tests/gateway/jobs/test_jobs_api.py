"""Submitting, reading and stopping jobs through the HTTP API; bad input gets problem+json and changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from gateway_testkit import Api, assert_problem, job_spec, ledger_entries
from sqlalchemy import func, select

from gateway.identity.tokens import hash_token
from gateway.store.models import Job, Token
from ledger.errors import StoreError


def job_count(api: Api) -> int:
    with api.gateway.db.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0)


def test_submit_defaults_ownership_to_caller_and_ids_are_unique(api: Api) -> None:
    ids = set()
    for _ in range(5):
        r = api.post("/v1/jobs", "alice", json=job_spec())
        assert r.status_code == 201, r.text
        job = r.json()
        ids.add(job["id"])
        assert job["state"] == "pending"
        own = job["ownership"]
        assert (own["creator"], own["owner"], own["beneficiary_project"], own["rights_holder"]) == (
            "alice", "alice", "vision", "vision")
        assert own["external_rights"] is False
    assert len(ids) == 5


def test_every_job_carries_its_four_ownerships_and_the_facts_that_go_with_them(api: Api) -> None:
    """R2: creator, responsible owner, beneficiary project and rights holder, with the validity period and
    auto-offline, first contact, environment, dependencies and downstream; as given, or defaulted from the
    caller and the project. The four ownerships go into every decision on the job (H3)."""
    until = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    given = job_spec(owner="bob", beneficiary_project="speech", rights_holder="speech", valid_until=until.isoformat(),
                     auto_offline=True, contact="carol", environment="staging", dependencies=["dataset:imagenet"],
                     downstream=["eval-board"])
    created = api.post("/v1/jobs", "alice", json=given)
    assert created.status_code == 201, created.text
    job = api.get(f"/v1/jobs/{created.json()['id']}", "alice").json()
    assert job["ownership"] == {
        "creator": "alice", "creator_kind": "person", "owner": "bob", "beneficiary_project": "speech",
        "rights_holder": "speech", "external_rights": False, "contact": "carol",
        "valid_until": until.isoformat(), "auto_offline": True, "submitted_via": {}}
    assert (job["environment"], job["dependencies"], job["downstream"]) == (
        "staging", ["dataset:imagenet"], ["eval-board"])

    plain = api.get(f"/v1/jobs/{api.post('/v1/jobs', 'alice', json=job_spec()).json()['id']}", "alice").json()
    assert plain["ownership"] == {
        "creator": "alice", "creator_kind": "person", "owner": "alice", "beneficiary_project": "vision",
        "rights_holder": "vision", "external_rights": False, "contact": "alice", "valid_until": None,
        "auto_offline": False, "submitted_via": {}}
    assert (plain["environment"], plain["dependencies"], plain["downstream"]) == ("research", [], [])

    stopped = api.post(f"/v1/jobs/{job['id']}/stop", "bob", json={"reason": "done with it"})
    assert stopped.status_code == 202, stopped.text
    decision = next(e for e in ledger_entries(api) if e["seq"] == stopped.json()["decision"]["ledger_seq"])
    target = decision["body"]["input"]["targets"][0]
    assert {k: target[k] for k in ("id", "creator", "owner", "beneficiary_project", "rights_holder")} == {
        "id": job["id"], "creator": "alice", "owner": "bob", "beneficiary_project": "speech",
        "rights_holder": "speech"}


@pytest.mark.parametrize("owner", ["ci-bot", "nobody-by-that-name"])
def test_the_responsible_owner_must_be_a_known_person(api: Api, owner: str) -> None:
    """R2: a job answers to a person; a service account or an unknown name is refused and nothing is created."""
    before = job_count(api)
    r = api.post("/v1/jobs", "alice", json=job_spec(owner=owner))
    assert_problem(r, 422, "invalid-request", f"owner {owner!r} is not a known person")
    assert job_count(api) == before


def test_service_account_owner_is_its_responsible_person_and_trigger_is_recorded(api: Api) -> None:
    r = api.post("/v1/jobs", "ci-bot", json=job_spec(), headers={"X-Jobgate-Trigger": "ci/nightly#42"})
    assert r.status_code == 201, r.text
    own = r.json()["ownership"]
    assert own["creator"] == "ci-bot" and own["creator_kind"] == "service" and own["owner"] == "alice"
    assert own["submitted_via"] == {"trigger": "ci/nightly#42", "responsible": "alice"}
    decisions = [e for e in ledger_entries(api) if e["kind"] == "decision"]
    actor = decisions[-1]["body"]["actor"]
    assert actor == {**actor, "id": "ci-bot", "real_identity": "alice", "trigger": "ci/nightly#42"}


def test_service_account_without_trigger_is_refused(api: Api) -> None:
    before = job_count(api)
    assert_problem(api.post("/v1/jobs", "ci-bot", json=job_spec()), 422, "invalid-request", "X-Jobgate-Trigger")
    assert job_count(api) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in job_spec().items() if k != "command"}, "command"),
        (job_spec(gpus_per_node=-1), "gpus_per_node"),
        (job_spec(nodes=0), "nodes"),
        (job_spec(command=[]), "command"),
        (job_spec(name="bad name with spaces"), "name"),
        (job_spec(queue="vip"), "queue"),
        (job_spec(surprise=1), "surprise"),
    ],
    ids=["missing-command", "negative-gpus", "zero-nodes", "empty-command", "bad-name", "unknown-queue",
         "unknown-field"],
)
def test_malformed_submissions_are_refused_with_the_field(api: Api, body: dict, field: str) -> None:
    before = job_count(api)
    problem = assert_problem(api.post("/v1/jobs", "alice", json=body), 422, "invalid-request")
    assert any(e["field"] == field for e in problem["errors"]), problem
    assert job_count(api) == before


def test_non_json_body_is_refused(api: Api) -> None:
    r = api.post("/v1/jobs", "alice", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "invalid-request")


def test_unknown_project_is_refused(api: Api) -> None:
    before = job_count(api)
    assert_problem(api.post("/v1/jobs", "alice", json=job_spec(project="nope")), 422, "invalid-request",
                   "unknown project 'nope'")
    assert job_count(api) == before


def test_submit_into_a_project_without_a_role_is_denied_and_ledgered(api: Api) -> None:
    before = job_count(api)
    body = assert_problem(api.post("/v1/jobs", "mallory", json=job_spec()), 403, "policy-denied")
    assert job_count(api) == before
    entry = next(e for e in ledger_entries(api) if e["seq"] == body["ledger_seq"])
    assert entry["body"]["decision"]["effect"] == "deny"
    assert entry["body"]["actor"]["id"] == "mallory"


@pytest.mark.parametrize(
    ("header", "contains"),
    [
        (None, "missing Authorization"),
        ("Bearer nonsense", "malformed token"),
        ("Basic dXNlcjpwYXNz", "malformed token"),
        ("Bearer jg_" + "A" * 43, "unknown token"),
    ],
    ids=["missing", "malformed", "wrong-scheme", "unknown"],
)
def test_bad_tokens_get_401(api: Api, header: str | None, contains: str) -> None:
    headers = {"Authorization": header} if header else {}
    assert_problem(api.client.post("/v1/jobs", json=job_spec(), headers=headers), 401, "unauthenticated", contains)


@pytest.mark.parametrize(("header", "contains"), [(None, "missing Authorization"), ("Bearer x", "malformed token")],
                         ids=["missing", "malformed"])
def test_a_caller_without_a_credential_is_told_so_before_anything_about_its_body(
        api: Api, header: str | None, contains: str) -> None:
    headers = {"Authorization": header} if header else {}
    assert_problem(api.client.post("/v1/jobs", json={"name": "x"}, headers=headers), 401, "unauthenticated", contains)
    assert_problem(api.post("/v1/jobs", "alice", json={"name": "x"}), 422, "invalid-request", "project")


def test_expired_and_revoked_tokens_get_401(api: Api) -> None:
    now = datetime.now(UTC)
    with api.gateway.db.transaction() as s:
        s.scalars(select(Token).where(Token.token_hash == hash_token(api.tokens["alice"]))).one().expires_at = (
            now - timedelta(seconds=1))
        s.scalars(select(Token).where(Token.token_hash == hash_token(api.tokens["bob"]))).one().revoked_at = now
    assert_problem(api.post("/v1/jobs", "alice", json=job_spec()), 401, "unauthenticated", "expired")
    assert_problem(api.post("/v1/jobs", "bob", json=job_spec()), 401, "unauthenticated", "revoked")


def test_unknown_job_is_404(api: Api) -> None:
    assert_problem(api.get("/v1/jobs/j-doesnotexist", "alice"), 404, "not-found", "j-doesnotexist")
    assert_problem(api.post("/v1/jobs/j-doesnotexist/stop", "alice", json={"reason": "cleanup"}), 404, "not-found")


def test_a_path_or_method_the_api_lacks_is_named_and_405_keeps_its_allow_header(api: Api) -> None:
    assert_problem(api.get("/v1/jobz", "alice"), 404, "not-found", "no endpoint answers GET /v1/jobz")
    r = api.client.delete("/v1/jobs", headers=api.headers("alice"))
    assert_problem(r, 405, "method-not-allowed", "DELETE /v1/jobs is not allowed here; this path takes GET, POST")
    assert r.headers["allow"] == "GET, POST"


def test_other_tenant_cannot_see_or_stop_and_the_denial_is_ledgered(api: Api) -> None:
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()
    assert api.get("/v1/jobs", "mallory").json()["jobs"] == []
    assert_problem(api.get(f"/v1/jobs/{job['id']}", "mallory"), 403, "policy-denied")
    body = assert_problem(api.post(f"/v1/jobs/{job['id']}/stop", "mallory", json={"reason": "I need GPUs"}),
                          403, "policy-denied")
    assert body["reasons"], body
    assert api.get(f"/v1/jobs/{job['id']}", "alice").json()["state"] == "pending"
    denial = next(e for e in ledger_entries(api) if e["seq"] == body["ledger_seq"])
    assert denial["kind"] == "decision"
    assert denial["body"]["input"]["action"] == "job.stop"
    assert denial["body"]["input"]["targets"][0]["id"] == job["id"]
    assert denial["body"]["decision"]["effect"] == "deny"
    assert denial["blobs"]["queue_snapshot"]


def test_a_job_state_stays_private_to_whom_the_job_is_refused(api: Api) -> None:
    """A1: someone who may not see a job is refused (and ledgered) the same whatever its state; a 409 saying
    "already ended" or "still running" would tell them what the job is doing."""
    ended = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    api.post(f"/v1/jobs/{ended}/stop", "alice", json={"reason": "wrong config"})
    queued = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    attempts = [("POST", f"/v1/jobs/{ended}/stop", {"reason": "I need GPUs"}),
                ("POST", f"/v1/jobs/{ended}/priority", {"priority": 1, "reason": "mine first"}),
                ("DELETE", f"/v1/jobs/{queued}", {"reason": "cleanup"})]
    for method, path, body in attempts:
        r = api.client.request(method, path, headers=api.headers("mallory"), json=body)
        problem = assert_problem(r, 403, "policy-denied")
        assert "ended" not in problem["detail"] and "pending" not in problem["detail"], problem
        assert next(e for e in ledger_entries(api) if e["seq"] == problem["ledger_seq"])["kind"] == "decision"
    # Who may see the job still hears why nothing can be done, also through a token scoped to stopping only.
    assert_problem(api.post(f"/v1/jobs/{ended}/stop", "bob", json={"reason": "again"}), 409, "conflict",
                   "already ended")
    stop_only = api.post("/v1/tokens", "carol", json={"purpose": "stops", "projects": ["vision"],
                                                      "actions": ["job.stop"], "expires_in_days": 1}).json()["token"]
    r = api.client.post(f"/v1/jobs/{ended}/stop", headers={"Authorization": f"Bearer {stop_only}"},
                        json={"reason": "again"})
    assert_problem(r, 409, "conflict", "already ended")


def test_owner_stops_a_queued_job_at_once(api: Api) -> None:
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()
    r = api.post(f"/v1/jobs/{job['id']}/stop", "alice", json={"reason": "wrong config", "ticket": "T-1"})
    assert r.status_code == 202, r.text
    out = r.json()
    assert out["decision"]["effect"] == "allow"
    assert out["job"]["state"] == "stopped" and out["job"]["outcome"] == "cancelled"
    assert out["job"]["stop_request"]["ticket"] == "T-1"
    again = api.post(f"/v1/jobs/{job['id']}/stop", "alice", json={"reason": "wrong config"})
    assert_problem(again, 409, "conflict", "already ended")


def test_stop_without_reason_is_refused(api: Api) -> None:
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()
    assert_problem(api.post(f"/v1/jobs/{job['id']}/stop", "alice", json={}), 422, "invalid-request")
    assert api.get(f"/v1/jobs/{job['id']}", "alice").json()["state"] == "pending"


def test_ledger_write_failure_refuses_the_mutation(api: Api) -> None:
    """Fail closed: with the ledger unwritable nothing changes and the caller gets 503."""
    before = job_count(api)
    api.gateway.ledger.close()
    r = api.post("/v1/jobs", "alice", json=job_spec())
    assert_problem(r, 503, "ledger-unavailable")
    assert job_count(api) == before


def test_a_decision_the_ledger_then_fails_to_write_refuses_the_submission(api: Api,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued, then not written: the caller hears 503 only once the write failed, and nothing was created."""
    before, size = job_count(api), api.gateway.ledger.size()

    def disk_full(*args: object, **kwargs: object) -> None:
        raise StoreError("disk full")

    with monkeypatch.context() as m:
        store = api.gateway.ledger._store  # a PostgreSQL ledger writes each batch through its head row
        m.setattr(store, "write_sequenced" if store.sequenced else "write_batch", disk_full)
        assert_problem(api.post("/v1/jobs", "alice", json=job_spec()), 503, "ledger-unavailable", "disk full")
    assert job_count(api) == before and api.gateway.ledger.size() == size
    assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201  # written again once it can be


def test_a_job_that_could_never_run_is_refused_after_its_decision_and_the_refusal_are_ledgered(api: Api) -> None:
    r = api.post("/v1/jobs", "alice", json=job_spec(mounts=["/scratch"]))
    assert_problem(r, 422, "invalid-request", "mount '/scratch'")
    assert job_count(api) == 0
    decision, outcome = ledger_entries(api)[-2:]
    assert decision["kind"] == "decision" and decision["body"]["decision"]["effect"] == "allow"
    assert outcome["kind"] == "outcome" and outcome["body"]["decision_seq"] == decision["seq"]
    assert outcome["body"]["result"] == "rejected" and "mount '/scratch'" in outcome["body"]["problems"][0]


def test_ledger_is_readable_by_the_auditor_only(api: Api) -> None:
    assert api.get("/v1/ledger/entries", "audrey").status_code == 200
    assert_problem(api.get("/v1/ledger/entries", "alice"), 403, "policy-denied")
    note = api.get("/v1/ledger/checkpoint", "audrey")
    assert note.status_code == 200
    origin, size = note.text.splitlines()[:2]
    assert origin == api.settings.ledger_origin and int(size) >= 0
    assert json.loads(api.get("/healthz").text)["status"] == "ok"


@pytest.mark.parametrize("raw", [b'"\\u0000"', b'"\\ud800"', b'"\xed\xa0\x80"'],
                         ids=["escaped NUL", "escaped surrogate", "raw surrogate bytes"])
def test_text_no_store_can_hold_is_refused_however_it_is_spelled(api: Api, raw: bytes) -> None:
    """A NUL or an unpaired surrogate, written as a JSON escape or (a surrogate) as its UTF-8-style bytes, which
    the JSON parser lets through."""
    body = b'{"name": "n", "project": "vision", "gpus_per_node": 1, "command": ["true"], "contact": %s}' % raw
    r = api.client.post("/v1/jobs", content=body, headers={**api.headers("alice"), "Content-Type": "application/json"})
    assert_problem(r, 422, "invalid-request", "field contact contains")
    assert job_count(api) == 0
