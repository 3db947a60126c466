"""No way around the decision pipeline (F3, H1): every mutating route of the app is enumerated and must
either record a policy decision for its action, or be a ledgered identity/receipt route, or be the node
agents' own channel. A new mutating route that is not classified here fails this test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from gateway_testkit import Api, app_routes, job_spec, ledger_entries, path_objects

from gateway.app import create_app
from gateway.store.models import Job


def mutating_routes(app: Any) -> Iterator[tuple[str, str]]:
    """(method, path) of every route that is not GET/HEAD, including routers included in routers."""
    return app_routes(app, skip=frozenset({"GET", "HEAD"}))


@dataclass(frozen=True)
class Case:
    kind: str  # decision | ledgered | node | console
    who: str = "mallory"
    action: str | None = None
    body: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    job_state: str = "running"  # what the route's precondition needs, so the request reaches the policy


REASON = {"reason": "checking the route guard"}
CASES: dict[tuple[str, str], Case] = {
    ("POST", "/v1/jobs"): Case("decision", action="job.submit", body=job_spec()),
    ("POST", "/v1/jobs/{job_id}/stop"): Case("decision", action="job.stop", body=REASON),
    ("POST", "/v1/jobs:stop"): Case("decision", "carol", "job.stop", body={"ids": ["{job_id}"], **REASON}),
    ("POST", "/v1/jobs:reprioritize"): Case("decision", "carol", "job.priority",
                                           body={"ids": ["{job_id}"], "priority": 3, **REASON}),
    ("DELETE", "/v1/jobs/{job_id}"): Case("decision", action="job.delete", body=REASON, job_state="stopped"),
    ("POST", "/v1/jobs/{job_id}/pause"): Case("decision", action="job.pause", body=REASON),
    ("POST", "/v1/jobs/{job_id}/resume"): Case("decision", action="job.resume", body=REASON, job_state="paused"),
    ("POST", "/v1/jobs/{job_id}/undelete"): Case("decision", action="job.undelete", body=REASON,
                                                 job_state="deleted"),
    ("POST", "/v1/jobs/{job_id}/confirm-stopped"): Case("decision", action="job.confirm_stopped", body=REASON,
                                                        job_state="stop_failed"),
    ("POST", "/v1/jobs/{job_id}/priority"): Case("decision", action="job.priority", body={"priority": 5, **REASON}),
    ("POST", "/v1/jobs/{job_id}/renew"): Case(
        # P3: a renewal is decided as a change of one's own job's priority.
        "decision", "alice", "job.priority", body={"progress": "epoch 3 of 10", "expected_remaining_seconds": 600}),
    ("POST", "/v1/approvals/{approval_id}/approve"): Case("decision", action="job.stop"),
    ("POST", "/v1/emergency-stops"): Case(
        "decision", action="emergency.stop",
        body={"scope": {"kind": "job", "value": "{job_id}"}, "trigger": "safety", **REASON}),
    ("POST", "/v1/emergency-stops/{emergency_id}/lift"): Case("decision", action="emergency.lift", body=REASON),
    ("POST", "/v1/break-glass"): Case(
        "decision", action="breakglass.request",
        body={"projects": ["vision"], "actions": ["job.stop"], "duration_minutes": 5, "ticket": "INC-1",
              "reason": "checking the route guard"}),
    ("PUT", "/v1/quotas/{project}"): Case("decision", action="quota.change", body={"gpus": 8, **REASON}),
    ("POST", "/v1/mounts"): Case("decision", action="role.manage", body={"name": "imagenet", "kind": "dataset"}),
    ("POST", "/v1/policy/reload"): Case("decision", action="policy.reload"),
    ("POST", "/v1/roles"): Case("decision", action="role.manage",
                                body={"principal": "bob", "role": "queue_admin", "project": "vision"}),
    ("POST", "/v1/roles:revoke"): Case("decision", action="role.manage",
                                       body={"principal": "bob", "role": "researcher", "project": "vision"}),
    ("DELETE", "/v1/roles"): Case("decision", action="role.manage",
                                  params={"principal": "bob", "role": "researcher", "project": "vision"}),
    ("POST", "/v1/forensics/exports"): Case("decision", action="ledger.read", body={"job_id": "{job_id}"}),
    # Identity and receipts: not job mutations; each change is ledgered (F1, A4).
    ("POST", "/v1/approvals/{approval_id}/reject"): Case("ledgered", "alice", body=REASON),
    ("POST", "/v1/tokens"): Case("ledgered", "alice", body={"purpose": "route guard", "projects": ["vision"],
                                                         "actions": ["job.view"], "expires_in_days": 1}),
    ("POST", "/v1/tokens/{token_id}/revoke"): Case("ledgered", "alice", body=REASON),
    ("POST", "/v1/service-accounts"): Case("ledgered", "alice", body={"name": "guard-bot", "project": "vision"}),
    ("POST", "/v1/break-glass/{grant_id}/revoke"): Case("ledgered", "dave"),
    ("POST", "/v1/notifications/{notification_id}/ack"): Case("ledgered", "alice"),
    ("POST", "/v1/nodes"): Case("ledgered", "erin", body={"id": "guard-node-1", "gpus": 8}),
    # The node agents' channel: only a node's own token; a person is refused.
    ("POST", "/v1/agents/{node_id}/heartbeat"): Case("node", "dave", body={"gpus": 8}),
    ("POST", "/v1/agents/{node_id}/reports"): Case("node", "dave", body={"reports": []}),
    # The console: session cookie + CSRF token, then the same services as the API (tests/gateway/console).
    ("POST", "/ui/login"): Case("console"),
    ("POST", "/ui/logout"): Case("console"),
    ("POST", "/ui/jobs/{job_id}/stop"): Case("console"),
    ("POST", "/ui/jobs/{job_id}/pause"): Case("console"),
    ("POST", "/ui/jobs/{job_id}/priority"): Case("console"),
    ("POST", "/ui/jobs/{job_id}/resume"): Case("console"),
    ("POST", "/ui/notifications/{notification_id}/ack"): Case("console"),
    ("POST", "/ui/approvals/{approval_id}/approve"): Case("console"),
    ("POST", "/ui/approvals/{approval_id}/reject"): Case("console"),
    ("POST", "/ui/policy/whatif"): Case("console"),  # a read-only replay; POST only to carry the CSRF token
}


def test_every_mutating_route_is_classified() -> None:
    routes = set(mutating_routes(create_app()))
    unclassified = sorted(routes - set(CASES))
    assert not unclassified, f"classify these mutating routes in CASES (how are they gated?): {unclassified}"
    stale = sorted(set(CASES) - routes)
    assert not stale, f"these routes no longer exist: {stale}"


def _fixtures(api: Api, job_state: str) -> dict[str, str]:
    """Objects the path parameters point at (gateway_testkit.path_objects), the job in `job_state`."""
    ids = path_objects(api)
    with api.gateway.db.transaction() as s:
        s.get(Job, ids["job_id"]).state = job_state
    return ids


def _fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**ids) if "{" in value else value
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


@pytest.mark.parametrize(("method", "path"), [k for k, c in CASES.items() if c.kind != "console"],
                         ids=lambda x: str(x))
def test_route_is_gated_as_classified(api: Api, method: str, path: str) -> None:
    case = CASES[(method, path)]
    ids = _fixtures(api, case.job_state)
    before = len(ledger_entries(api))
    url = path.format(**ids)
    r = api.client.request(method, url, json=_fill(case.body, ids) if case.body else None,
                           params=case.params or None, headers=api.headers(case.who))
    assert r.status_code < 500, r.text
    new = ledger_entries(api)[before:]
    if case.kind == "decision":
        actions = [e["body"]["input"]["action"] for e in new if e["kind"] == "decision"]
        assert case.action in actions, f"{method} {path} recorded no {case.action} decision: {r.status_code} {r.text}"
    elif case.kind == "ledgered":
        assert r.status_code < 300, r.text
        assert new, f"{method} {path} changed something without a ledger entry"
    else:  # refused, and only the refusal is in the ledger
        assert r.status_code == 403 and [e["kind"] for e in new] == ["refusal"], (r.text, new)


# --- every refused attempt is an entry (README, H3) ----------------------------------------------------------------

@dataclass(frozen=True)
class Refused:
    """A call on the route that is refused to a caller with an identity: `status`, and one ledger entry naming
    `who` (a policy decision, an approval's refused confirmation, or a `refusal` entry)."""

    who: str
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    job_state: str = "running"


MALLORY_DENIED = Refused("mallory", 403)  # a policy decision, or a check outside the policy, refuses her
OPEN = "any caller with a token may call it; it answers with what that caller may see"
PUBLIC = "no token is asked for: no identity to name"
# Every route of the app: the call that is refused there, or why there is none to a caller with an identity.
REFUSED: dict[tuple[str, str], Refused | str] = {
    **{("GET", p): PUBLIC for p in ("/openapi.json", "/docs", "/redoc", "/healthz", "/readyz",
                                    "/metrics")},
    **{k: Refused("mallory", 403, c.body, c.params, c.job_state) for k, c in CASES.items() if c.kind == "decision"},
    ("POST", "/v1/jobs:stop"): Refused("mallory", 422, {"selector": {"project": "vision"}, **REASON}),  # no job of hers
    ("POST", "/v1/jobs:reprioritize"): Refused("mallory", 403, {"ids": ["{job_id}"], "priority": 3, **REASON}),
    ("POST", "/v1/approvals/{approval_id}/approve"): Refused("carol", 403),  # her own request
    ("POST", "/v1/approvals/{approval_id}/reject"): Refused("mallory", 403, REASON),
    ("POST", "/v1/tokens"): Refused("mallory", 403, {"principal": "alice", "purpose": "not hers",
                                                     "projects": ["vision"], "actions": ["job.view"],
                                                     "expires_in_days": 1}),
    ("POST", "/v1/tokens/{token_id}/revoke"): Refused("mallory", 404, REASON),
    ("POST", "/v1/service-accounts"): Refused("mallory", 403, {"name": "guard-bot", "project": "vision"}),
    ("POST", "/v1/nodes"): Refused("mallory", 403, {"id": "guard-node-2", "gpus": 8}),
    ("POST", "/v1/break-glass/{grant_id}/revoke"): Refused("mallory", 404),
    ("POST", "/v1/notifications/{notification_id}/ack"): Refused("mallory", 404),
    ("POST", "/v1/agents/{node_id}/heartbeat"): Refused("dave", 403, {"gpus": 8}),
    ("POST", "/v1/agents/{node_id}/reports"): Refused("dave", 403, {"reports": []}),
    ("GET", "/v1/agents/{node_id}/commands"): Refused("dave", 403, params={"wait": 0}),
    ("GET", "/v1/jobs"): Refused("mallory", 422, params={"state": "sleeping"}),
    ("GET", "/v1/jobs/{job_id}"): MALLORY_DENIED,
    ("GET", "/v1/jobs/{job_id}/queue"): MALLORY_DENIED,
    ("GET", "/v1/approvals/{approval_id}"): Refused("mallory", 404),
    ("GET", "/v1/emergency-stops"): MALLORY_DENIED,
    ("GET", "/v1/emergency-stops/{emergency_id}"): MALLORY_DENIED,
    ("GET", "/v1/roles"): MALLORY_DENIED,
    **{("GET", p): MALLORY_DENIED for p in ("/v1/ledger/entries", "/v1/ledger/checkpoint", "/v1/audit/entries",
                                            "/v1/audit/entries/{seq}", "/v1/audit/export", "/v1/stats/usage",
                                            "/v1/stats/waits", "/v1/stats/fragmentation", "/v1/stats/suggestions")},
    ("GET", "/v1/ledger/proof/inclusion"): Refused("mallory", 403, params={"seq": 0}),
    ("GET", "/v1/ledger/proof/consistency"): Refused("mallory", 403, params={"old": 1, "new": 2}),
    **{("GET", p): OPEN for p in ("/v1/nodes", "/v1/approvals", "/v1/break-glass", "/v1/tokens",
                                  "/v1/service-accounts", "/v1/notifications", "/v1/queues", "/v1/stats/preemptions",
                                  "/v1/quotas", "/v1/mounts", "/v1/policy")},
    ("GET", "/v1/inventory"): OPEN + " (a malformed label selector is refused before the token is looked at)",
    # The console answers refusals as pages: tests/gateway/console/test_console_redteam.py
    # (test_a_console_refusal_is_one_ledger_entry_naming_the_person) checks that they are ledgered alike.
    **{k: "console" for k, c in CASES.items() if c.kind == "console"},
    **{("GET", p): "console" for p in ("/ui/login", "/ui/", "/ui/jobs/{job_id}", "/ui/approvals",
                                       "/ui/approvals/{approval_id}", "/ui/admin", "/ui/emergency",
                                       "/ui/emergency/{emergency_id}", "/ui/policy", "/ui/ledger", "/ui/ledger/export",
                                       "/ui/ledger/{seq}")},
}


def test_every_route_says_how_it_is_refused() -> None:
    routes = set(app_routes(create_app()))
    unlisted = sorted(routes - set(REFUSED))
    assert not unlisted, f"add to REFUSED the call each of these routes refuses (or why none): {unlisted}"
    stale = sorted(set(REFUSED) - routes)
    assert not stale, f"these routes no longer exist: {stale}"


def _names(entry: dict[str, Any], who: str) -> bool:
    body = entry["body"]
    actor = body.get("actor") or {}
    return who in (actor.get("id"), actor.get("real_identity"), body.get("operator"))


def test_every_refused_call_is_one_ledger_entry_naming_the_caller(api: Api) -> None:
    """On every route: a refused call by a caller with an identity grows the ledger by exactly one entry, which
    names them; one the policy did not decide is a `refusal` entry saying what was asked and what refused it,
    and the answer gives its seq. (Refusals change nothing, so one gateway takes them all in turn.)"""
    ids = {**path_objects(api), "seq": "1"}
    wrong = []
    for (method, path), case in REFUSED.items():
        if not isinstance(case, Refused):
            continue
        with api.gateway.db.transaction() as s:
            s.get(Job, ids["job_id"]).state = case.job_state
        before = len(ledger_entries(api))
        r = api.client.request(method, path.format(**ids), json=_fill(case.body, ids) if case.body else None,
                               params=case.params or None, headers=api.headers(case.who))
        new = ledger_entries(api)[before:]
        seen = f"{method} {path} as {case.who}: {r.status_code}, entries {[(e['kind'], e['body']) for e in new]}"
        if r.status_code != case.status or len(new) != 1 or not _names(new[0], case.who):
            wrong.append(seen)
        elif new[0]["kind"] == "refusal":
            refused = new[0]["body"]
            said = (refused["asked"]["route"], refused["refusal"]["status"], r.json()["ledger_seq"])
            if said != (path, case.status, new[0]["seq"]) or not refused["refusal"]["check"].startswith("gateway."):
                wrong.append(seen)
    assert not wrong, "\n".join(wrong)
