"""Role bindings as data (M1): only role.manage holders change them; each change is ledgered and takes
effect in the live engine and the role_bindings table together; bad input is a 422 problem."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_testkit import Api, job_spec
from sqlalchemy import select

from gateway.store.models import RoleBinding as Row


def ledger_entries(api: Api) -> list[dict[str, Any]]:
    r = api.get("/v1/ledger/entries", "audrey", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [e["entry"] for e in r.json()["entries"]]


def rows(api: Api, principal: str) -> set[tuple[str, str]]:
    with api.gateway.db.transaction() as s:
        return {(r.role, r.project) for r in s.scalars(select(Row).where(Row.principal_id == principal)).all()}


def test_grant_takes_effect_at_once_and_is_ledgered(api: Api) -> None:
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()
    # mallory (speech) cannot see a vision job...
    assert api.get(f"/v1/jobs/{job['id']}", "mallory").status_code == 403
    r = api.post("/v1/roles", "erin", json={"principal": "mallory", "role": "researcher", "project": "vision",
                                          "reason": "joins the vision team"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["result"] == "granted"
    # ...and can right after the grant, without a restart.
    assert api.get(f"/v1/jobs/{job['id']}", "mallory").status_code == 200
    assert ("researcher", "vision") in rows(api, "mallory")
    assert api.gateway.policy.roles_of("mallory") == {"speech": ["researcher"], "vision": ["researcher"]}

    entries = {e["seq"]: e for e in ledger_entries(api)}
    decision = entries[body["decision_seq"]]["body"]
    assert decision["input"]["action"] == "role.manage" and decision["decision"]["effect"] == "allow"
    assert decision["input"]["params"] == {"change": "grant", "principal": "mallory", "role": "researcher",
                                           "project": "vision"}
    outcome = entries[body["outcome_seq"]]["body"]
    assert outcome["result"] == "granted" and outcome["decision_seq"] == body["decision_seq"]

    listed = api.get("/v1/roles", "erin", params={"principal": "mallory"}).json()["bindings"]
    assert {(b["role"], b["project"]) for b in listed} == {("researcher", "speech"), ("researcher", "vision")}

    r = api.post("/v1/roles:revoke", "erin", json={"principal": "mallory", "role": "researcher", "project": "vision"})
    assert r.status_code == 200 and r.json()["result"] == "revoked"
    assert api.get(f"/v1/jobs/{job['id']}", "mallory").status_code == 403
    assert ("researcher", "vision") not in rows(api, "mallory")


def test_revoke_by_delete_and_global_roles(api: Api) -> None:
    r = api.post("/v1/roles", "erin", json={"principal": "bob", "role": "oncall", "project": "*"})
    assert r.status_code == 201, r.text
    assert "job.stop.service" in api.gateway.policy.capabilities("bob", "speech")
    r = api.client.delete("/v1/roles", headers=api.headers("erin"),
                          params={"principal": "bob", "role": "oncall", "project": "*"})
    assert r.status_code == 200, r.text
    assert "job.stop.service" not in api.gateway.policy.capabilities("bob", "speech")


@pytest.mark.parametrize("who", ["sam", "carol", "dave", "alice"])
def test_only_role_managers_change_bindings(api: Api, who: str) -> None:
    before = len(ledger_entries(api))
    r = api.post("/v1/roles", who, json={"principal": who, "role": "platform_admin", "project": "*"})
    assert r.status_code == 403, r.text
    assert "role.manage" in r.json()["detail"]
    assert ("platform_admin", "*") not in rows(api, who)
    assert "role.manage" not in api.gateway.policy.capabilities(who, "*")
    refusal = ledger_entries(api)[before:]
    assert [e["body"]["decision"]["effect"] for e in refusal if e["kind"] == "decision"] == ["deny"]
    assert api.get("/v1/roles", who).status_code == 403


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"principal": "nobody", "role": "researcher", "project": "vision"}, "unknown principal 'nobody'"),
        ({"principal": "bob", "role": "king", "project": "vision"}, "unknown role 'king'"),
        ({"principal": "bob", "role": "researcher", "project": "atlantis"}, "unknown project 'atlantis'"),
        ({"principal": "demo-node-1", "role": "oncall", "project": "*"}, "node identity"),
    ],
    ids=["principal", "role", "project", "node"],
)
def test_bad_bindings_are_422_and_change_nothing(api: Api, body: dict[str, str], needle: str) -> None:
    before = len(ledger_entries(api))
    r = api.post("/v1/roles", "erin", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert needle in r.json()["detail"]
    # Nothing changed; the refused attempt is in the ledger, once, with what was asked.
    (refused,) = ledger_entries(api)[before:]
    assert refused["kind"] == "refusal" and refused["body"]["actor"]["id"] == "erin", refused
    assert refused["body"]["asked"]["body"] == body and refused["seq"] == r.json()["ledger_seq"]


def test_duplicate_grant_and_missing_revoke(api: Api) -> None:
    binding = {"principal": "alice", "role": "researcher", "project": "vision"}
    assert api.post("/v1/roles", "erin", json=binding).status_code == 409
    missing = {"principal": "alice", "role": "auditor", "project": "*"}
    assert api.post("/v1/roles:revoke", "erin", json=missing).status_code == 404
    assert api.post("/v1/roles", "erin", json={**binding, "extra": 1}).status_code == 422
