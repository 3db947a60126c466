"""Service accounts and scoped tokens (F1): traceable, scoped, expiring, revocable, ledgered."""

from __future__ import annotations

import pytest
from gateway_testkit import Api, assert_problem, job_spec, ledger_entries


def make_token(api: Api, who: str, **body: object) -> dict:
    payload = {"purpose": "nightly training", "projects": ["vision"], "actions": ["job.submit", "job.view"],
               "expires_in_days": 30, **body}
    r = api.post("/v1/tokens", who, json=payload)
    assert r.status_code == 201, r.text
    return r.json()


def test_person_creates_a_service_account_and_its_scoped_token(api: Api) -> None:
    r = api.post("/v1/service-accounts", "bob", json={"name": "sweep-bot", "project": "vision"})
    assert r.status_code == 201, r.text
    assert r.json()["responsible"] == "bob"
    tok = make_token(api, "bob", principal="sweep-bot")
    assert tok["token"].startswith("jg_")
    headers = {"Authorization": f"Bearer {tok['token']}", "X-Jobgate-Trigger": "gitlab/sweep#311"}
    submitted = api.client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert submitted.status_code == 201, submitted.text
    assert submitted.json()["ownership"]["owner"] == "bob"
    decision = [e for e in ledger_entries(api) if e["kind"] == "decision"][-1]["body"]
    assert decision["actor"]["id"] == "sweep-bot"
    assert decision["actor"]["real_identity"] == "bob"
    assert decision["actor"]["trigger"] == "gitlab/sweep#311"
    listed = api.get("/v1/service-accounts", "bob").json()["service_accounts"]
    assert [a["id"] for a in listed] == ["sweep-bot"]
    assert [a["id"] for a in api.get("/v1/service-accounts", "alice").json()["service_accounts"]] == ["ci-bot"]
    assert {a["id"] for a in api.get("/v1/service-accounts", "erin").json()["service_accounts"]} == {
        "ci-bot", "sweep-bot"}


def test_service_token_outside_its_project_or_actions_is_refused_naming_the_scope(api: Api) -> None:
    tok = make_token(api, "alice", principal="ci-bot")
    headers = {"Authorization": f"Bearer {tok['token']}", "X-Jobgate-Trigger": "ci/x#1"}
    job = api.client.post("/v1/jobs", json=job_spec(), headers=headers).json()
    r = api.client.post(f"/v1/jobs/{job['id']}/stop", json={"reason": "cleanup run"}, headers=headers)
    assert r.status_code == 403
    assert "scoped to actions" in r.json()["detail"] and "job.stop" in r.json()["detail"]
    r = api.client.post("/v1/jobs", json=job_spec(project="speech"), headers=headers)
    assert r.status_code == 403
    assert "scoped to projects" in r.json()["detail"] and "speech" in r.json()["detail"]


def test_a_token_naming_an_action_that_does_not_exist_is_refused_naming_it(api: Api) -> None:
    r = api.post("/v1/tokens", "alice", json={"principal": "ci-bot", "purpose": "ci runs", "projects": ["vision"],
                                              "actions": ["job.submit", "job.stpo"], "expires_in_days": 10})
    assert r.status_code == 422, r.text
    assert "unknown action(s): job.stpo" in r.json()["detail"] and "job.stop" in r.json()["detail"]
    assert not [t for t in api.get("/v1/tokens", "alice").json()["tokens"] if t["purpose"] == "ci runs"]


@pytest.mark.parametrize(("who", "holder", "projects", "refused"), [
    ("alice", None, ["speech"], "alice holds no role in project(s) speech"),
    ("alice", "ci-bot", ["vision", "speech"], "ci-bot holds no role in project(s) speech"),
    ("erin", "alice", ["speech"], "alice holds no role in project(s) speech"),  # a platform admin minting for her
    ("dave", None, ["speech"], None),  # on-call holds its role in every project
    ("alice", None, ["*"], None),  # a person's token for wherever she holds a role
], ids=["own-token", "service-token", "admin-for-a-person", "global-role", "star"])
def test_a_token_for_a_project_where_its_holder_has_no_role_is_refused(
    api: Api, who: str, holder: str | None, projects: list[str], refused: str | None
) -> None:
    """Minted as asked, such a token granted nothing, and would have started to act in that project, unseen,
    the day its holder was given a role there."""
    body = {"purpose": "roleless", "projects": projects, "actions": ["job.view"], "expires_in_days": 1,
            **({"principal": holder} if holder else {})}
    r = api.post("/v1/tokens", who, json=body)
    if refused is None:
        assert r.status_code == 201, r.text
        return
    assert_problem(r, 422, "invalid-request", refused)
    assert "ask for the role first" in r.json()["detail"]
    assert not [t for t in api.get("/v1/tokens", "erin").json()["tokens"] if t["purpose"] == "roleless"]
    assert not [e for e in ledger_entries(api) if e["kind"] == "identity" and e["body"].get("purpose") == "roleless"]


def test_service_tokens_live_at_most_90_days_and_must_name_projects(api: Api) -> None:
    r = api.post("/v1/tokens", "alice", json={"principal": "ci-bot", "purpose": "ci runs", "projects": ["vision"],
                                              "actions": ["*"], "expires_in_days": 91})
    assert r.status_code == 422 and "at most 90 days" in r.json()["detail"]
    r = api.post("/v1/tokens", "alice", json={"principal": "ci-bot", "purpose": "ci runs", "projects": ["*"],
                                              "actions": ["*"], "expires_in_days": 10})
    assert r.status_code == 422 and "must name its projects" in r.json()["detail"]
    r = api.post("/v1/tokens", "alice", json={"principal": "ci-bot", "purpose": "ci runs", "projects": ["vision"],
                                              "actions": ["*"]})
    assert r.status_code == 422  # expiry is mandatory


def test_only_the_responsible_person_or_an_admin_mints_a_service_token(api: Api) -> None:
    assert api.post("/v1/tokens", "bob", json={"principal": "ci-bot", "purpose": "x runs", "projects": ["vision"],
                                               "actions": ["*"], "expires_in_days": 1}).status_code == 403
    make_token(api, "erin", principal="ci-bot")
    headers = {"X-Jobgate-Trigger": "ci/x#2"}
    assert api.post("/v1/tokens", "ci-bot", headers=headers,
                    json={"purpose": "x runs", "projects": ["vision"], "actions": ["*"],
                          "expires_in_days": 1}).status_code == 403


def test_revoked_token_stops_working_and_revocation_is_ledgered(api: Api) -> None:
    tok = make_token(api, "alice", projects=["vision"], actions=["*"])
    headers = {"Authorization": f"Bearer {tok['token']}"}
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    listed = [t["id"] for t in api.get("/v1/tokens", "alice").json()["tokens"]]
    assert tok["id"] in listed and "token" not in api.get("/v1/tokens", "alice").json()["tokens"][0]
    r = api.post(f"/v1/tokens/{tok['id']}/revoke", "alice", json={"reason": "laptop lost"})
    assert r.status_code == 200 and r.json()["revoked_at"]
    r = api.client.get("/v1/jobs", headers=headers)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert api.post(f"/v1/tokens/{tok['id']}/revoke", "mallory", json={"reason": "mine now"}).status_code == 404
    revocations = [e for e in ledger_entries(api) if e["kind"] == "identity" and e["body"]["action"] == "token.revoke"]
    assert revocations[-1]["body"]["token_id"] == tok["id"]
    assert revocations[-1]["body"]["actor"]["id"] == "alice"


def test_nobody_squats_on_a_nodes_name_and_only_a_platform_admin_enrols_a_node(api: Api) -> None:
    """A researcher could create a service account named `demo-node-3`: read in the ledger as that node, and the
    name taken from the node that would come. Names of the kind nodes use are kept for nodes (H1)."""
    for name in ("demo-node-3", "demo-node-1", "gpu-node-7"):
        r = api.post("/v1/service-accounts", "bob", json={"name": name, "project": "vision"})
        assert r.status_code in (409, 422) and name in r.text, r.text
    assert api.post("/v1/nodes", "mallory", json={"id": "gpu-node-7", "gpus": 8}).status_code == 403
    assert api.post("/v1/nodes", "erin", json={"id": "sweep-bot", "gpus": 8}).status_code == 422  # not a node name
    r = api.post("/v1/nodes", "erin", json={"id": "gpu-node-7", "gpus": 8})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    beat = api.client.post("/v1/agents/gpu-node-7/heartbeat", json={"gpus": 8, "isolation": "none"},
                           headers={"Authorization": f"Bearer {token}"})
    assert beat.status_code == 200, beat.text
    node = next(n for n in api.get("/v1/nodes", "dave").json()["nodes"] if n["id"] == "gpu-node-7")
    assert node["state"] == "alive" and node["isolation"] == "none"
    assert any(e["body"].get("action") == "node.enrol" and e["body"]["node"] == "gpu-node-7"
               for e in ledger_entries(api) if e["kind"] == "identity")
    assert api.post("/v1/nodes", "erin", json={"id": "gpu-node-7", "gpus": 8}).status_code == 409
