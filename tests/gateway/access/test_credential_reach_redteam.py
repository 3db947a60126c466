"""Red team: what a narrowed, automated or short-lived credential can reach through the side doors of F1, M2 and
A4 (break-glass requests, refusals, receipts, service accounts, dry runs), and the answers those doors give."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from gateway_testkit import Api, assert_problem, job_spec, ledger_entries

from gateway.store.models import Job, Project
from gateway.store.service_tables import Approval

BOT = {"X-Jobgate-Trigger": "ci/train-nightly#7"}


def running_job(api: Api, who: str = "alice", **spec: Any) -> str:
    job_id = api.post("/v1/jobs", who, json=job_spec(**spec)).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.placement = "running", [{"node": "demo-node-1", "gpus": [0, 1]}]
    return job_id


def mint(api: Api, who: str, **body: Any) -> dict[str, str]:
    """A token of `who`'s, narrowed as `body` says; the headers that use it."""
    r = api.post("/v1/tokens", who, json={"purpose": "narrowed", "expires_in_days": 1, **body})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def ask_stop(api: Api, job_id: str, who: str = "carol") -> str:
    """A stop carol may ask for but not do alone: its approval's id."""
    r = api.post(f"/v1/jobs/{job_id}/stop", who, json={"reason": "it holds the GPUs we need"})
    assert r.status_code == 202, r.text
    return str(r.json()["approval_id"])


def test_a_token_narrowed_to_one_project_cannot_ask_for_a_break_glass_grant_beyond_it(api: Api) -> None:
    """A token scoped to speech and breakglass.request got a grant for every project and action, which then
    stopped a vision job with no second person: a leaked narrow token became the widest credential there is."""
    narrow = mint(api, "dave", projects=["speech"], actions=["breakglass.request", "job.stop"])
    wide = {"projects": ["*"], "actions": ["*"], "duration_minutes": 240, "max_uses": 100, "ticket": "INC-9",
            "reason": "a narrow token asks for everything"}
    r = api.client.post("/v1/break-glass", headers=narrow, json=wide)
    assert_problem(r, 403, "forbidden", "a break-glass grant it asks for cannot hold *, which is outside it")
    r = api.client.post("/v1/break-glass", headers=narrow, json={**wide, "actions": ["job.stop"]})
    assert_problem(r, 403, "forbidden", "scoped to projects ['speech']; a break-glass grant it asks for cannot hold *")
    assert api.get("/v1/break-glass", "dave").json()["grants"] == []
    # Within its scope it still asks (the policy then decides as for any request).
    within = {**wide, "projects": ["speech"], "actions": ["job.stop"]}
    r = api.client.post("/v1/break-glass", headers=narrow, json=within)
    assert r.status_code in (201, 202), r.text


def test_refusing_someone_elses_request_needs_what_approving_it_needs(api: Api) -> None:
    """Anyone eligible could veto with any credential: a view-only token for another project, or a service
    account acting as its responsible person, rejected a stop that neither could have approved."""
    job_id = running_job(api)
    approval_id = ask_stop(api, job_id)
    view_only = mint(api, "dave", projects=["speech"], actions=["job.view"])
    r = api.client.post(f"/v1/approvals/{approval_id}/reject", headers=view_only, json={"reason": "vetoed"})
    assert_problem(r, 403, "forbidden", "approval.grant is outside it")
    r = api.post(f"/v1/approvals/{approval_id}/reject", "ci-bot", headers=BOT, json={"reason": "automation veto"})
    assert_problem(r, 403, "forbidden", "ci-bot is a service identity; only a person can refuse a request")
    refused = [e["body"] for e in ledger_entries(api)
               if e["body"].get("action") == "approval.reject" and e["body"].get("approval_id") == approval_id]
    assert [(b["result"], b["operator"]) for b in refused] == [("refused", "dave"), ("refused", "ci-bot")]
    assert api.get(f"/v1/approvals/{approval_id}", "dave").json()["state"] == "pending"
    # The owner, in person, refuses; the requester (who withdraws) is another case, tested with the API.
    r = api.post(f"/v1/approvals/{approval_id}/reject", "alice", json={"reason": "my run is nearly done"})
    assert r.status_code == 200 and r.json()["state"] == "rejected", r.text


def test_a_service_account_cannot_acknowledge_its_persons_receipts(api: Api) -> None:
    """A4's receipt says the owner saw the notice. ci-bot acknowledged alice's, and the ledger said alice did."""
    job_id = running_job(api)
    assert api.post(f"/v1/approvals/{ask_stop(api, job_id)}/approve", "dave").status_code == 200
    notes = api.get("/v1/notifications", "ci-bot", headers=BOT).json()["notifications"]
    [pending] = [n for n in notes if n["receipt"] == "pending"]
    r = api.post(f"/v1/notifications/{pending['id']}/ack", "ci-bot", headers=BOT)
    assert_problem(r, 403, "forbidden", "only alice, with their own token, can")
    assert not [e for e in ledger_entries(api) if e["kind"] == "receipt"]
    r = api.post(f"/v1/notifications/{pending['id']}/ack", "alice")
    assert r.status_code == 200 and r.json()["receipt"] == "acknowledged", r.text
    [receipt] = [e["body"] for e in ledger_entries(api) if e["kind"] == "receipt"]
    assert receipt["principal"] == "alice" and receipt["actor"]["id"] == "alice"
    assert receipt["actor"]["kind"] == "person"


def test_a_narrowed_token_cannot_create_a_service_account_for_another_project(api: Api) -> None:
    narrow = mint(api, "alice", projects=["vision"], actions=["job.view"])
    r = api.client.post("/v1/service-accounts", headers=narrow,
                        json={"name": "sneaky-bot", "project": "vision", "description": "made with a view token"})
    assert_problem(r, 403, "forbidden", "job.submit is outside it")
    assert "sneaky-bot" not in [a["id"] for a in api.get("/v1/service-accounts", "alice").json()["service_accounts"]]


def test_a_token_mints_none_that_outlives_it_for_a_service_account_either(api: Api) -> None:
    """The cap applied to tokens for oneself only: a token with an hour left handed ci-bot a 90-day token."""
    hour = mint(api, "alice", projects=["vision"], actions=["*"], expires_in_days=1 / 24)
    r = api.client.post("/v1/tokens", headers=hour, json={"principal": "ci-bot", "purpose": "nightly runs",
                                                          "projects": ["vision"], "actions": ["job.submit"],
                                                          "expires_in_days": 90})
    assert r.status_code == 201, r.text
    expires = datetime.fromisoformat(r.json()["expires_at"])
    assert expires <= api.gateway.clock() + timedelta(hours=1)
    # Said, not silent: the answer and the ledger name the token whose end cut it short, and what was asked.
    capped = r.json()["lifetime_capped"]
    minted_with = next(e for e in ledger_entries(api) if e["kind"] == "identity"
                       and e["body"]["action"] == "token.create" and e["body"]["purpose"] == "narrowed")
    assert capped["by_token"] == minted_with["body"]["token_id"], capped
    assert "ends no later than the token that made it" in capped["reason"], capped
    asked = datetime.fromisoformat(capped["asked_expires_at"])
    assert asked - expires > timedelta(days=89), capped
    [entry] = [e["body"] for e in ledger_entries(api) if e["kind"] == "identity"
               and e["body"]["action"] == "token.create" and e["body"]["purpose"] == "nightly runs"]
    assert entry["lifetime_capped_by"] == capped["by_token"] and entry["asked_expires_at"] == capped["asked_expires_at"]
    r = api.client.post("/v1/tokens", headers=hour, json={"principal": "ci-bot", "purpose": "a short one",
                                                          "projects": ["vision"], "actions": ["job.submit"],
                                                          "expires_in_days": 1 / 48})
    assert r.status_code == 201 and r.json()["lifetime_capped"] is None, r.text


def test_a_trigger_header_too_long_or_unprintable_is_refused_before_anything_is_decided(api: Api) -> None:
    """On PostgreSQL a 300-character trigger failed with a 500 when the approval row was written, after the
    decision was already in the ledger."""
    with api.gateway.db.transaction() as s:
        s.add(Project(id="partner", organisation="other-org", description="external rights holder"))
    job_id = api.post("/v1/jobs", "ci-bot", headers=BOT, json=job_spec(rights_holder="partner")).json()["id"]
    before = len(ledger_entries(api))
    for trigger, said in (("ci/" + "x" * 300, "this one has 303 characters"),
                          ("ci/run\x7f1", "characters that are not printable")):
        r = api.post(f"/v1/jobs/{job_id}/stop", "ci-bot", headers={"X-Jobgate-Trigger": trigger},
                     json={"reason": "stop my own run"})
        assert_problem(r, 422, "invalid-request", said)
    assert len(ledger_entries(api)) == before
    r = api.post(f"/v1/jobs/{job_id}/stop", "ci-bot", headers={"X-Jobgate-Trigger": "ci/" + "x" * 197},
                 json={"reason": "stop my own run"})
    assert r.status_code in (200, 202), r.text


def test_a_dry_run_shows_no_blast_radius_of_jobs_the_caller_may_not_view(api: Api) -> None:
    job_id = running_job(api)
    assert_problem(api.get(f"/v1/jobs/{job_id}", "mallory"), 403, "policy-denied")
    r = api.post("/v1/jobs:stop", "mallory", json={"ids": [job_id], "reason": "how big is it?", "dry_run": True})
    body = assert_problem(r, 403, "forbidden", f"mallory may not view {job_id}")
    assert "blast_radius" not in body
    r = api.post("/v1/jobs:stop", "dave", json={"ids": [job_id], "reason": "how big is it?", "dry_run": True})
    assert r.status_code == 202 and r.json()["blast_radius"]["gpus"] == 2, r.text


def test_a_request_stays_visible_however_many_newer_ones_there_are(api: Api) -> None:
    """GET /v1/approvals/{id} looked the request up among the newest 500: the approver could no longer see what
    they were about to approve, though approving it still worked."""
    approval_id = ask_stop(api, running_job(api))
    with api.gateway.db.transaction() as s:
        base = s.get(Approval, approval_id)
        for i in range(500):
            s.add(Approval(id=f"apr-newer{i:04d}", action="job.stop", target_ids=[], project="speech", params={},
                           reason="filler", ticket=None, granularity="job", digest="0" * 64, requester="mallory",
                           requester_real="mallory", requester_trigger=None, state="rejected",
                           created_at=base.created_at + timedelta(seconds=1 + i),
                           expires_at=base.expires_at + timedelta(seconds=1 + i), decision_seq=0, required={},
                           blast_radius={}, approvals=[]))
    r = api.get(f"/v1/approvals/{approval_id}", "dave")
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text
    assert_problem(api.get(f"/v1/approvals/{approval_id}", "mallory"), 404, "not-found")


def test_the_requester_and_the_owner_hear_when_a_request_expires_or_is_refused(api: Api) -> None:
    """An expired request told nobody, and a refused one only its requester: the owner, told a stop of their
    job was asked for, never learned that it would not come."""
    gw = api.gateway
    expiring, refused = ask_stop(api, running_job(api)), ask_stop(api, running_job(api))
    assert api.post(f"/v1/approvals/{refused}/reject", "dave", json={"reason": "not needed"}).status_code == 200
    real = gw.clock
    gw.clock = lambda: real() + timedelta(hours=2)
    assert_problem(api.post(f"/v1/approvals/{expiring}/approve", "dave"), 409, "conflict", "expired")
    gw.clock = real

    def heard(who: str) -> set[tuple[str, str]]:
        return {(n["kind"], n["body"]["approval_id"]) for n in api.get("/v1/notifications", who).json()["notifications"]
                if "approval_id" in n["body"]}

    for who in ("carol", "alice"):
        assert {("approval_expired", expiring), ("approval_rejected", refused)} <= heard(who)
    assert ("approval_rejected", refused) not in heard("dave")  # who refused it is not told


def test_an_id_in_the_path_longer_than_any_id_is_refused_not_echoed_back(api: Api) -> None:
    for method, path in (("GET", "/v1/approvals/" + "x" * 20_000), ("POST", "/v1/tokens/" + "z" * 20_000 + "/revoke"),
                         ("POST", "/v1/break-glass/" + "y" * 20_000 + "/revoke")):
        r = api.client.request(method, path, headers={"Authorization": f"Bearer {api.tokens['dave']}"},
                               json={"reason": "tidy up"})
        assert r.status_code == 422, (path[:30], r.text[:200])
        assert len(r.text) < 2_000


def test_revoking_a_token_closes_the_requests_it_left_pending(api: Api) -> None:
    """A stop asked for with a token that then leaked (and was revoked) still ran once a second person approved."""
    leaky = mint(api, "carol", projects=["vision"], actions=["job.stop"])
    r = api.client.post(f"/v1/jobs/{running_job(api)}/stop", headers=leaky, json={"reason": "asked with a leaky token"})
    assert r.status_code == 202, r.text
    made_with_it = r.json()["approval_id"]
    made_otherwise = ask_stop(api, running_job(api))  # carol's own usual token
    token_id = next(t["id"] for t in api.get("/v1/tokens", "carol").json()["tokens"] if t["purpose"] == "narrowed")
    r = api.post(f"/v1/tokens/{token_id}/revoke", "carol", json={"reason": "pasted into a public channel"})
    assert r.status_code == 200, r.text
    closed = api.get(f"/v1/approvals/{made_with_it}", "dave").json()
    assert closed["state"] == "rejected" and closed["resolution"]["token_revoked"] == token_id
    assert_problem(api.post(f"/v1/approvals/{made_with_it}/approve", "dave"), 409, "conflict", "already rejected")
    assert api.get(f"/v1/approvals/{made_otherwise}", "dave").json()["state"] == "pending"
    [revoked] = [e["body"] for e in ledger_entries(api) if e["body"].get("action") == "token.revoke"]
    assert revoked["withdrawn_requests"] == [made_with_it]


def test_listing_jobs_with_a_token_that_may_not_view_them_is_refused_not_an_empty_list(api: Api) -> None:
    """A pipeline token scoped to job.submit listed "(none)" right after submitting: no jobs, it seemed."""
    running_job(api)
    submit_only = mint(api, "alice", projects=["vision"], actions=["job.submit"])
    r = api.client.get("/v1/jobs", headers=submit_only)
    assert_problem(r, 403, "forbidden", "job.view is outside it")
    speech_only = mint(api, "mallory", projects=["speech"], actions=["job.view"])
    assert_problem(api.client.get("/v1/jobs", headers=speech_only, params={"project": "vision"}), 403, "forbidden",
                   "vision is outside it")
    assert api.client.get("/v1/jobs", headers=speech_only).json()["jobs"] == []  # its own project: none there
    assert len(api.get("/v1/jobs", "alice").json()["jobs"]) == 1
    typo = api.get("/v1/jobs", "alice", params={"state": "runing"})
    assert_problem(typo, 422, "invalid-request", "unknown state 'runing'")
