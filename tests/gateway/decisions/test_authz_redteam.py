"""Adversarial authorization cases: ways to change a job without the rights, the second person, the
reason or the ledger entry the policy asks for. Each test names the hole it closes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient
from gateway_testkit import Api, assert_problem, job_spec, ledger_entries
from sqlalchemy import select

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings
from gateway.store.models import Job, Principal, Project
from gateway.store.service_tables import Approval
from gateway.store.stop_tables import JobDeletion


def running_job(api: Api, who: str = "alice", **spec: object) -> str:
    """Submit a job and mark it running on demo-node-1, as if the agent had started it."""
    headers = {"X-Jobgate-Trigger": "ci/nightly#7"} if who == "ci-bot" else {}
    r = api.post("/v1/jobs", who, json=job_spec(**spec), headers=headers)
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])
    set_state(api, job_id, "running")
    return job_id


def set_state(api: Api, job_id: str, state: str) -> None:
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state = state
        job.placement = [{"node": "demo-node-1", "gpus": [0, 1]}]


def job_row(api: Api, job_id: str) -> dict[str, Any]:
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        return {"state": job.state, "stop_request": dict(job.stop_request)}


def add_partner_project(api: Api) -> None:
    """A tenant of another organisation: a job whose data it holds is external-rights (R3)."""
    with api.gateway.db.transaction() as s:
        s.add(Project(id="partner", organisation="globex", description="rights holder of licensed data"))


def external_job(api: Api, state: str) -> str:
    add_partner_project(api)
    job_id = running_job(api, rights_holder="partner")
    set_state(api, job_id, state)
    return job_id


def scoped_token(api: Api, who: str, *, actions: list[str], projects: list[str]) -> str:
    r = api.post("/v1/tokens", who, json={"purpose": "a narrow token", "projects": projects, "actions": actions,
                                         "expires_in_days": 1})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def grant_role(api: Api, principal: str, role: str, project: str) -> None:
    r = api.post("/v1/roles", "erin", json={"principal": principal, "role": role, "project": project})
    assert r.status_code == 201, r.text


# -- approvals whose re-decision is a deny ---------------------------------------------------------------


def test_quota_change_is_not_executed_when_the_re_decision_denies(api: Api) -> None:
    """A request without target jobs (A7 quota change) used to execute on approval although the policy, asked
    again, denied it: here the requester lost the platform admin role before the second admin approved."""
    grant_role(api, "sam", "platform_admin", "*")
    r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"), json={"gpus": 64, "reason": "more GPUs"})
    assert r.status_code == 202, r.text
    approval_id = r.json()["approval_id"]
    r = api.post("/v1/roles:revoke", "sam", json={"principal": "erin", "role": "platform_admin", "project": "*"})
    assert r.status_code == 200, r.text

    r = api.post(f"/v1/approvals/{approval_id}/approve", "sam")

    assert_problem(r, 403, "policy-denied", "erin holds no role")
    quotas = api.get("/v1/quotas", "sam").json()["quotas"]
    assert [q for q in quotas if q["project"] == "vision" and q["gpus"] == 64] == []
    with api.gateway.db.transaction() as s:
        assert s.get(Approval, approval_id).state == "pending"
    last = [e for e in ledger_entries(api) if e["kind"] == "decision"][-1]["body"]
    assert last["input"]["action"] == "quota.change" and last["decision"]["effect"] == "deny"


# -- needs_approval treated as allow ----------------------------------------------------------------------


def approve(api: Api, approval_id: str, who: str) -> dict[str, Any]:
    r = api.post(f"/v1/approvals/{approval_id}/approve", who, json={"comment": "checked"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_resume_of_an_external_rights_job_waits_for_the_second_person(api: Api) -> None:
    """R3 makes every mutation of an external-rights job one notch stricter; resume (like undelete and
    confirm-stopped below) used to ignore the needs_approval answer and carry the action out at once."""
    job_id = external_job(api, "paused")
    r = api.post(f"/v1/jobs/{job_id}/resume", "alice", json={"reason": "continue the run"})
    assert r.status_code == 202, r.text
    assert r.json()["decision"]["effect"] == "needs_approval" and job_row(api, job_id)["state"] == "paused"
    assert approve(api, r.json()["approval_id"], "carol")["state"] == "executed"
    assert job_row(api, job_id)["state"] == "pending"


def test_undelete_of_an_external_rights_job_waits_for_the_second_person(api: Api) -> None:
    job_id = external_job(api, "stopped")
    r = api.client.request("DELETE", f"/v1/jobs/{job_id}", headers=api.headers("alice"),
                           json={"reason": "not needed any more"})
    assert r.status_code == 202, r.text
    with api.gateway.db.transaction() as s:  # as if the rights holder and a second person had consented
        s.get(Job, job_id).state = "deleted"
        s.add(JobDeletion(job_id=job_id, state="pending", state_before="stopped", requested_by="alice",
                          approvers=["partner-admin"], reason="x", requested_at=api.gateway.clock(),
                          purge_after=api.gateway.clock().replace(year=2100), objects=[]))
    r = api.post(f"/v1/jobs/{job_id}/undelete", "alice", json={"reason": "needed after all"})
    assert r.status_code == 202, r.text
    assert job_row(api, job_id)["state"] == "deleted"
    assert approve(api, r.json()["approval_id"], "carol")["state"] == "executed"
    assert job_row(api, job_id)["state"] == "stopped"


def test_confirm_stopped_of_an_external_rights_job_waits_for_the_second_person(api: Api) -> None:
    job_id = external_job(api, "stop_failed")
    r = api.post(f"/v1/jobs/{job_id}/confirm-stopped", "dave", json={"reason": "node is powered off"})
    assert r.status_code == 202, r.text
    assert job_row(api, job_id)["state"] == "stop_failed"
    assert_problem(api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "dave"), 403, "forbidden",
                   "second person")
    assert approve(api, r.json()["approval_id"], "carol")["state"] == "executed"
    assert job_row(api, job_id)["state"] == "stopped"


# -- token scope on approvals and on minting tokens (F1) -------------------------------------------------


def test_a_view_only_token_cannot_approve_a_stop(api: Api) -> None:
    job_id = running_job(api)
    approval_id = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "urgent eval"}).json()["approval_id"]
    narrow = scoped_token(api, "alice", actions=["job.view"], projects=["vision"])
    r = api.client.post(f"/v1/approvals/{approval_id}/approve", headers=bearer(narrow))
    assert_problem(r, 403, "forbidden", "outside it")
    assert job_row(api, job_id)["state"] == "running"
    approver = scoped_token(api, "alice", actions=["approval.grant"], projects=["vision"])  # scoped to approve
    r = api.client.post(f"/v1/approvals/{approval_id}/approve", headers=bearer(approver))
    assert r.status_code == 200 and r.json()["state"] == "executed", r.text


def test_a_service_account_cannot_be_the_second_person(api: Api) -> None:
    job_id = running_job(api)
    approval_id = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "urgent eval"}).json()["approval_id"]
    r = api.post(f"/v1/approvals/{approval_id}/approve", "ci-bot", headers={"X-Jobgate-Trigger": "ci/x#1"})
    assert_problem(r, 403, "forbidden", "person")
    assert job_row(api, job_id)["state"] == "running"


def test_a_scoped_token_cannot_mint_a_wider_one(api: Api) -> None:
    narrow = scoped_token(api, "alice", actions=["job.view"], projects=["vision"])
    r = api.client.post("/v1/tokens", headers=bearer(narrow),
                        json={"purpose": "escalate", "projects": ["*"], "actions": ["*"], "expires_in_days": 300})
    assert_problem(r, 403, "forbidden", "outside it")
    r = api.client.post("/v1/tokens", headers=bearer(narrow),
                        json={"purpose": "narrower", "projects": ["vision"], "actions": ["job.view"],
                              "expires_in_days": 30})
    assert r.status_code == 201, r.text  # within its own scope it still may, but not past its own end
    tokens = {t["purpose"]: t for t in api.get("/v1/tokens", "alice").json()["tokens"]}
    assert tokens["narrower"]["expires_at"] <= tokens["a narrow token"]["expires_at"]
    mine = [t for t in api.get("/v1/tokens", "alice").json()["tokens"] if t["principal"] == "alice"]
    assert sorted(t["purpose"] for t in mine if "*" in t["actions"]) == ["demo"]  # no wide token was minted


# -- A3: another's priority needs a written reason ------------------------------------------------------


def test_anothers_job_needs_a_written_reason(api: Api) -> None:
    """A3/A4 audit records name a written reason. The policy only attached a `reason_required` obligation that
    nothing carried out, so another's priority changed with no reason, and a stop with a reason of blanks."""
    job_id = running_job(api)
    r = api.post(f"/v1/jobs/{job_id}/priority", "carol", json={"priority": 500})
    assert_problem(r, 403, "policy-denied", "changing its priority needs a written reason")
    r = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "     "})
    assert_problem(r, 403, "policy-denied", "stopping it needs a written reason")
    r = api.post("/v1/jobs:reprioritize", "carol", json={"ids": [job_id], "priority": 3, "reason": "    "})
    assert_problem(r, 403, "policy-denied", "needs a written reason")
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(Approval)).all() == []  # nothing waits for a second person either
    assert job_row(api, job_id)["state"] == "running"


# -- earlier approvals are judged with the approver's roles of now -------------------------------------


def test_an_earlier_approval_stops_counting_when_its_approver_loses_the_role(api: Api) -> None:
    """The re-decision at each approval used the roles earlier approvers held when they approved, so a queue
    admin removed from the role still counted as one of the two people a workload-level stop needs."""
    jobs = [running_job(api), running_job(api)]
    r = api.post("/v1/jobs:stop", "carol", json={"ids": jobs, "reason": "make room for the eval"})
    assert r.status_code == 202, r.text
    approval_id = r.json()["approval_id"]
    grant_role(api, "bob", "queue_admin", "vision")
    r = api.post(f"/v1/approvals/{approval_id}/approve", "bob")
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text
    r = api.post("/v1/roles:revoke", "erin", json={"principal": "bob", "role": "queue_admin", "project": "vision"})
    assert r.status_code == 200, r.text

    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")

    assert r.status_code == 200 and r.json()["state"] == "pending", r.text  # bob's approval no longer counts
    assert [job_row(api, j)["state"] for j in jobs] == ["running", "running"]
    r = api.post(f"/v1/approvals/{approval_id}/approve", "alice")  # the owner is the second eligible approver
    assert r.status_code == 200 and r.json()["state"] == "executed", r.text


# -- disabled principals ------------------------------------------------------------------------------------


def disable(api: Api, principal: str) -> None:
    """As an administrator does in the database (there is no API for it); the token cache is bypassed."""
    api.gateway.token_cache.ttl_s = 0
    with api.gateway.db.transaction() as s:
        s.get(Principal, principal).disabled = True


def test_a_disabled_requesters_request_is_not_carried_out(api: Api) -> None:
    """The re-decision at approval acted as the requester without asking whether they are still allowed to
    act at all: a queue admin disabled after asking still had the stop carried out on the second approval."""
    job_id = running_job(api)
    approval_id = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "urgent eval"}).json()["approval_id"]
    disable(api, "carol")
    r = api.post(f"/v1/approvals/{approval_id}/approve", "alice")
    assert_problem(r, 409, "conflict", "requester carol is disabled")
    assert job_row(api, job_id)["state"] == "running"


def test_a_disabled_approvers_earlier_approval_no_longer_counts(api: Api) -> None:
    jobs = [running_job(api), running_job(api)]
    approval_id = api.post("/v1/jobs:stop", "carol", json={"ids": jobs, "reason": "make room"}).json()["approval_id"]
    assert api.post(f"/v1/approvals/{approval_id}/approve", "alice").json()["state"] == "pending"
    disable(api, "alice")
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text
    assert [job_row(api, j)["state"] for j in jobs] == ["running", "running"]


SUBMIT_NEEDS_A_SECOND_PERSON = """} else := project_grant(
	"test.submit_second_person", "a second person confirms every submission", request_project, 1,
	{"roles": ["queue_admin"], "principals": [], "projects": [request_project]}, [],
) if {
	input.action == "job.submit"
	holds(request_project, "job.submit")
} else := project_grant(
	action_rule[input.action],"""


def expect_submissions_to_wait(policies: Path) -> None:
    """The reviewer's cases follow the rule: a submission they allowed now waits for a second person (the gateway
    starts only a set that passes its own tests, as a reload would)."""
    for table in (policies / "tests").glob("*.yaml"):
        cases = yaml.safe_load(table.read_text())
        for case in cases:
            if case["input"].get("action") == "job.submit" and case["expect"]["effect"] == "allow":
                case["expect"] = {"effect": "needs_approval"}
        table.write_text(yaml.safe_dump(cases, sort_keys=False))


def test_an_action_without_an_approval_path_fails_closed_when_a_rule_asks_for_one(settings: Settings) -> None:
    """A reviewer may add a rule asking for a second person where no code can wait for one (here: every
    submission). The request is then refused and ledgered, not carried out as if allowed."""
    policies = settings.data_dir / "policies"
    shutil.copytree(Path(__file__).resolve().parents[3] / "policies", policies)
    rules = policies / "actions.rego"
    generic = "} else := project_grant(\n\taction_rule[input.action],"
    assert generic in rules.read_text()
    rules.write_text(rules.read_text().replace(generic, SUBMIT_NEEDS_A_SECOND_PERSON))
    expect_submissions_to_wait(policies)
    settings = settings.model_copy(update={"policies_dir": policies})
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        problem = assert_problem(api.post("/v1/jobs", "alice", json=job_spec()), 409, "conflict",
                                 "needs a second person")
        assert api.get("/v1/jobs", "alice").json()["jobs"] == []
        decision = next(e for e in ledger_entries(api) if e["seq"] == problem["ledger_seq"])
        assert decision["body"]["decision"]["effect"] == "needs_approval"
