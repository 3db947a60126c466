"""EmbeddedEngine: Casbin capabilities, fail-closed evaluation, determinism, bindings at run time."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.decisions.policy import EmbeddedEngine, PolicySet, RoleBinding, load_policy_set
from gateway.decisions.policy.loader import CAPABILITIES
from gateway.decisions.policy.testing import expand_input

POLICIES = Path(__file__).resolve().parents[4] / "policies"


def _stop(actor: str, **target: Any) -> dict[str, Any]:
    target = {"creator": "alice", **target}
    return expand_input({"action": "job.stop", "actor": actor, "reason": "hung", "targets": [target]})


def test_decision_input_carries_capabilities_and_roles(engine: EmbeddedEngine) -> None:
    doc = engine.decision_input(_stop("bob", project="vision"))
    assert "job.stop.any" in doc["granted"]["vision"]
    assert doc["granted"]["*"] == []
    assert doc["actor"]["roles"] == {"vision": ["queue_admin"]}


def test_caller_cannot_inject_capabilities(engine: EmbeddedEngine) -> None:
    request = {**_stop("mallory"), "granted": {"vision": ["job.stop.any", "job.stop.own"]}}
    decision = engine.decide(request)
    assert decision.effect == "deny"
    assert decision.reasons == ("mallory holds no role in project vision that grants job.stop.any",)


def test_same_input_same_decision(engine: EmbeddedEngine) -> None:
    request = _stop("olga", external_rights=True)
    first, second = engine.decide(request), engine.decide(request)
    assert first == second
    assert first.to_json() == second.to_json()
    assert first.policy_hash == engine.policy_hash


def test_decision_to_json_is_plain(engine: EmbeddedEngine) -> None:
    body = engine.decide(_stop("bob")).to_json()
    assert body["effect"] == "needs_approval"
    assert body["approvals_required"] == {
        "count": 1,
        "principals": ["alice"],
        "projects": ["*", "vision"],
        "roles": ["oncall", "queue_admin"],
    }
    assert {"kind": "grace_window", "seconds": 300} in body["obligations"]


def test_malformed_request_fails_closed(engine: EmbeddedEngine) -> None:
    decision = engine.decide({"action": "job.stop"})  # no actor
    assert decision.effect == "deny"
    assert decision.rules == ("fail_closed",)
    assert decision.reasons[0].startswith("policy unavailable: ")


def test_undefined_decision_fails_closed(tmp_path: Path) -> None:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    # A decision that exists, and denies by default (so the set loads), but is undefined for job.stop.
    (target / "authz.rego").write_text(
        "package jobgate.authz\n\nimport rego.v1\n\n"
        'decision := {"effect": "deny", "reasons": ["no"], "rules": ["x"]} if not input.action == "job.stop"\n'
    )
    policy_set = load_policy_set(target)
    engine = EmbeddedEngine(policy_set, [RoleBinding("alice", "researcher", "vision")])
    request = expand_input({"action": "job.stop", "actor": "mallory", "targets": [{"creator": "alice"}]})
    decision = engine.decide(request)
    assert decision.effect == "deny"
    assert decision.rules == ("fail_closed",)
    assert decision.reasons == ("policy unavailable: the policy defines no decision for this input",)


def test_conflicting_rules_fail_closed(tmp_path: Path) -> None:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    # Two complete definitions disagreeing for one input is an evaluation error in Rego.
    (target / "conflict.rego").write_text(
        'package jobgate.authz\n\nimport rego.v1\n\nno_approvals := {"count": 1} if input.action == "job.pause"\n'
    )
    engine = EmbeddedEngine(load_policy_set(target), [])
    decision = engine.decide(expand_input({"action": "job.pause", "actor": "alice", "targets": [{"creator": "alice"}]}))
    assert decision.effect == "deny"
    assert decision.rules == ("fail_closed",)


def test_grant_and_revoke_at_run_time(policy_set: PolicySet) -> None:
    engine = EmbeddedEngine(policy_set, [])
    request = _stop("bob")
    assert engine.decide(request).effect == "deny"
    engine.grant(RoleBinding("bob", "queue_admin", "vision"))
    assert engine.decide(request).effect == "needs_approval"
    assert engine.roles_of("bob") == {"vision": ["queue_admin"]}
    engine.revoke(RoleBinding("bob", "queue_admin", "vision"))
    assert engine.decide(request).effect == "deny"
    assert engine.roles_of("bob") == {}


def test_holders_include_global_roles(engine: EmbeddedEngine) -> None:
    assert engine.holders("vision", "approval.grant") == ["bob", "olga", "oscar"]
    assert engine.holders("nlp", "job.stop.service") == ["olga", "oscar"]
    assert engine.holders("vision", "quota.change") == ["pat", "petra"]


ROLES = ["researcher", "queue_admin", "oncall", "platform_admin", "security_reviewer", "auditor", "service", "ghost"]
PROJECTS = ["vision", "nlp", "*"]


@settings(max_examples=60, deadline=None)
@given(
    bindings=st.lists(
        st.tuples(st.sampled_from(["u1", "u2"]), st.sampled_from(ROLES), st.sampled_from(PROJECTS)), max_size=6
    ),
    principal=st.sampled_from(["u1", "u2"]),
    project=st.sampled_from(PROJECTS),
)
def test_indexed_capabilities_match_casbin(
    policy_set: PolicySet, bindings: list[tuple[str, str, str]], principal: str, project: str
) -> None:
    engine = EmbeddedEngine(policy_set, [RoleBinding(*b) for b in bindings])
    held = engine.capabilities(principal, project)
    for capability in CAPABILITIES:
        assert (capability in held) == engine.enforce(principal, project, capability), capability


def test_concurrent_decisions_agree(engine: EmbeddedEngine) -> None:
    service_job = {"creator_kind": "service", "creator": "svc-train", "owner": "alice"}
    requests = [_stop("bob"), _stop("alice"), _stop("mallory"), _stop("olga", **service_job)]
    expected = [engine.decide(r) for r in requests]
    errors: list[str] = []

    def worker() -> None:
        for _ in range(50):
            for request, want in zip(requests, expected, strict=True):
                if engine.decide(request) != want:
                    errors.append(request["actor"]["id"])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_decision_does_not_wait_for_one_in_progress(policy_set: PolicySet) -> None:
    """Each decision evaluates on its own interpreter: one in progress (its interpreter leased) does not hold
    up another, which a single interpreter behind a lock would do until the first finished."""
    engine = EmbeddedEngine(policy_set, [RoleBinding("bob", "queue_admin", "vision")])
    request = _stop("bob", project="vision")
    want = engine.decide(request)
    decided: list[Any] = []
    with engine._interpreters.lease() as busy:
        other = threading.Thread(target=lambda: decided.append(engine.decide(request)))
        other.start()
        other.join(timeout=30)
        assert decided == [want]
    # A second copy was compiled for the other decision, and both are back in the pool for the next ones.
    pooled = [id(copy) for copy in engine._interpreters._free]
    assert len(pooled) == 2 and id(busy) in pooled
    engine.decide(request)
    assert [id(copy) for copy in engine._interpreters._free] == pooled
