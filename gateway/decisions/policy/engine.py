"""Decide one request: Casbin says which capabilities the actor holds per project, Rego decides.

DESIGN "One mutation's path" step 4. The engine adds `granted` and `actor.roles` to the gateway's
decision input, so the Rego rules reason about capabilities only and never about role bindings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import casbin
from casbin.model import Model
from regopy import Bundle, Interpreter, RegoError

from gateway.decisions.policy.loader import DECISION_ENTRYPOINT, PolicySet, compile_rego
from gateway.decisions.policy.regoio import UndefinedResult, query_value, rego_input, set_input

EFFECTS = frozenset({"allow", "deny", "needs_approval"})
GLOBAL = "*"
FAIL_CLOSED_RULE = "fail_closed"
# The rule the gateway adds when a break-glass grant stands in for the second person (pipeline.decide).
BREAK_GLASS_RULE = "F2.break_glass"
_ENTRYPOINT = DECISION_ENTRYPOINT.encode()


@dataclass(frozen=True)
class RoleBinding:
    """`principal` holds `role` in `project`; project "*" binds the role globally (on-call)."""

    principal: str
    role: str
    project: str


@dataclass(frozen=True)
class Decision:
    """The policy's answer, deterministic for the same input and policy hash."""

    effect: str
    reasons: tuple[str, ...]
    rules: tuple[str, ...]
    approvals_required: Mapping[str, Any]
    obligations: tuple[Mapping[str, Any], ...]
    policy_hash: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready dict, as recorded in the ledger."""
        return {
            "effect": self.effect,
            "reasons": list(self.reasons),
            "rules": list(self.rules),
            "approvals_required": _thaw(self.approvals_required),
            "obligations": [_thaw(o) for o in self.obligations],
            "policy_hash": self.policy_hash,
        }


class PolicyEngine(Protocol):
    """What the gateway needs from a policy engine: embedded regopy (EmbeddedEngine) or an OPA server
    (gateway.decisions.policy.opa.OpaEngine). Role bindings live beside the engine, so Casbin capabilities are
    computed gateway-side in both and put into the input the same way."""

    policy_hash: str
    policy_set: PolicySet

    def decide(self, request: Mapping[str, Any]) -> Decision:
        """Never raises for evaluation problems: those are a deny with rule `fail_closed`."""
        ...

    def decision_input(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The request plus `granted` and `actor.roles`, as the Rego rules see it."""
        ...

    def grant(self, b: RoleBinding) -> None: ...

    def revoke(self, b: RoleBinding) -> None: ...

    def roles_of(self, principal: str) -> dict[str, list[str]]: ...

    def capabilities(self, principal: str, project: str) -> frozenset[str]: ...

    def holders(self, project: str, capability: str) -> list[str]: ...

    def push(self) -> None:
        """Put the set where it is evaluated (the OPA server); nothing for the embedded engine. A reload that
        fails after a candidate was pushed pushes the active set back with it. Raises PolicyLoadError."""
        ...

    def close(self) -> None:
        """Release connections (OPA); nothing for the embedded engine."""
        ...


class PolicyUnavailable(Exception):
    """The engine could not produce a decision (OPA down, timeout, malformed answer): deny, fail closed."""


class EmbeddedEngine:
    """Casbin + regopy in-process, compiled per policy set (a copy per concurrent decision). Thread-safe.

    Role lookups go through Casbin's domain role manager, which is indexed by project, plus a
    principal -> project -> roles index for `roles_of`; both change together under one lock.
    """

    def __init__(self, policy_set: PolicySet, bindings: Iterable[RoleBinding]) -> None:
        """Raises RegoError if the policy set does not compile (load_policy_set has checked it)."""
        self.policy_set = policy_set
        self.policy_hash = policy_set.hash
        self._state_lock = threading.RLock()
        model = Model()
        model.load_model_from_text(policy_set.model_text)
        self._enforcer = casbin.Enforcer(model)
        rows = [[r.role, r.project, r.capability] for r in policy_set.matrix]
        if rows:
            self._enforcer.add_policies(rows)
        self._roles = self._enforcer.get_role_manager()
        caps: dict[tuple[str, str], set[str]] = {}
        for row in policy_set.matrix:
            caps.setdefault((row.role, row.project), set()).add(row.capability)
        self._role_caps = {k: frozenset(v) for k, v in caps.items()}
        self._by_principal: dict[str, dict[str, set[str]]] = {}
        initial = list(dict.fromkeys(bindings))
        if initial:
            # One batch: Casbin rebuilds role links per call, so 10,000 single adds take seconds.
            self._enforcer.add_grouping_policies([[b.principal, b.role, b.project] for b in initial])
        for b in initial:
            self._by_principal.setdefault(b.principal, {}).setdefault(b.project, set()).add(b.role)
        self._interpreters = InterpreterPool(policy_set)

    # -- role bindings -------------------------------------------------------------------------

    def grant(self, b: RoleBinding) -> None:
        """Bind a role in memory. A role absent from the matrix grants nothing (fails closed)."""
        with self._state_lock:
            self._enforcer.add_grouping_policy(b.principal, b.role, b.project)
            self._by_principal.setdefault(b.principal, {}).setdefault(b.project, set()).add(b.role)

    def revoke(self, b: RoleBinding) -> None:
        """Remove a binding; unknown bindings are ignored."""
        with self._state_lock:
            self._enforcer.remove_grouping_policy(b.principal, b.role, b.project)
            projects = self._by_principal.get(b.principal, {})
            roles = projects.get(b.project)
            if roles is not None:
                roles.discard(b.role)
                if not roles:
                    del projects[b.project]

    def replace_bindings(self, bindings: Iterable[RoleBinding]) -> None:
        """Make the engine hold exactly these bindings (those of the business DB, which another replica changed):
        only the difference is granted and revoked."""
        wanted = set(bindings)
        with self._state_lock:
            held = {RoleBinding(principal=p, role=r, project=proj) for p, projects in self._by_principal.items()
                    for proj, roles in projects.items() for r in roles}
            for b in held - wanted:
                self.revoke(b)
            for b in wanted - held:
                self.grant(b)

    def roles_of(self, principal: str) -> dict[str, list[str]]:
        """Roles per project ("*" for global), sorted, for the decision input and the audit record."""
        with self._state_lock:
            projects = self._by_principal.get(principal, {})
            return {p: sorted(r) for p, r in sorted(projects.items())}

    def capabilities(self, principal: str, project: str) -> frozenset[str]:
        """Capabilities `principal` holds in `project`; the same answer as Casbin's matcher, indexed."""
        with self._state_lock:
            roles = set(self._roles.get_roles(principal, project))
            if project != GLOBAL:
                roles.update(self._roles.get_roles(principal, GLOBAL))
        held: set[str] = set()
        for role in roles:
            held |= self._role_caps.get((role, project), frozenset())
            held |= self._role_caps.get((role, GLOBAL), frozenset())
        return frozenset(held)

    def enforce(self, principal: str, project: str, capability: str) -> bool:
        """Ask Casbin itself (slow path: one matcher evaluation)."""
        with self._state_lock:
            return bool(self._enforcer.enforce(principal, project, capability))

    def holders(self, project: str, capability: str) -> list[str]:
        """Principals holding `capability` in `project`, global roles included (who can approve)."""
        roles = {
            role for (role, dom), caps in self._role_caps.items() if capability in caps and dom in (project, GLOBAL)
        }
        found: set[str] = set()
        with self._state_lock:
            for role in roles:
                found.update(self._roles.get_users(role, project))
                found.update(self._roles.get_users(role, GLOBAL))
        return sorted(found)

    # -- decisions -----------------------------------------------------------------------------

    def decision_input(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The request plus `granted` and `actor.roles`, as Rego sees it. Raises on a malformed request."""
        doc = dict(request)
        actor = dict(request["actor"])
        principal = str(actor["id"])
        roles = self.roles_of(principal)
        # The request's projects, and the actor's own: A4's owner-consent branch asks whether the actor may stop
        # others' jobs in some project of theirs, which a stop in another project never names.
        projects = {GLOBAL, *roles}
        if isinstance(request.get("project"), str):
            projects.add(request["project"])
        for target in request.get("targets") or ():
            projects.add(str(target["project"]))
        # Whatever the caller put in `granted` or `actor.roles` is replaced: only Casbin says.
        doc["granted"] = {p: sorted(self.capabilities(principal, p)) for p in sorted(projects)}
        actor["roles"] = roles
        doc["actor"] = actor
        return doc

    def decide(self, request: Mapping[str, Any]) -> Decision:
        """Decide; any failure to evaluate is a deny with rule `fail_closed` (never an exception)."""
        try:
            return self._decision(self.evaluate(self.decision_input(request)))
        except PolicyUnavailable as e:
            return self._fail_closed(str(e))
        except Exception as e:  # fail closed: a policy problem must never let a mutation through
            return self._fail_closed(f"{type(e).__name__}: {e}")

    def evaluate(self, doc: Mapping[str, Any]) -> Any:
        """The raw value of data.jobgate.authz.decision for a full decision input.

        Raises PolicyUnavailable when it is undefined or evaluation fails.
        """
        prepared = rego_input(doc)  # conversion needs no interpreter
        with self._interpreters.lease() as (rego, bundle):
            set_input(rego, prepared)
            try:
                return query_value(rego, bundle, _ENTRYPOINT)
            except RegoError as e:
                raise PolicyUnavailable(f"evaluation error: {e}") from e
            except UndefinedResult as e:
                raise PolicyUnavailable("the policy defines no decision for this input") from e

    def push(self) -> None:
        """Nothing to put anywhere: the set is compiled in-process."""

    def close(self) -> None:
        """Nothing to release in-process."""

    def _decision(self, value: Any) -> Decision:
        if not isinstance(value, dict) or value.get("effect") not in EFFECTS:
            return self._fail_closed("the policy returned a malformed decision")
        approvals = value.get("approvals_required") or {}
        obligations = value.get("obligations") or []
        if not isinstance(approvals, dict) or not isinstance(obligations, list):
            return self._fail_closed("the policy returned a malformed decision")
        return Decision(
            effect=value["effect"],
            reasons=tuple(str(r) for r in value.get("reasons") or ()),
            rules=tuple(str(r) for r in value.get("rules") or ()),
            approvals_required=_freeze(approvals),
            obligations=tuple(_freeze(o) for o in obligations if isinstance(o, dict)),
            policy_hash=self.policy_hash,
        )

    def _fail_closed(self, why: str) -> Decision:
        return Decision(
            effect="deny",
            reasons=(f"policy unavailable: {why}",),
            rules=(FAIL_CLOSED_RULE,),
            approvals_required=_freeze({"count": 0, "roles": [], "principals": [], "projects": []}),
            obligations=(),
            policy_hash=self.policy_hash,
        )


class InterpreterPool:
    """Compiled copies of one policy set, one per evaluation in progress.

    A regopy interpreter is not safe for concurrent use (the input and the query share its state), and
    sharing one behind a lock made decisions take turns: the holder gives the GIL away while rego-cpp
    evaluates and, under load, waits for it back while every other decision waits for the lock. Each
    caller leases its own instead; a copy is compiled (about 35 ms) only when every existing one is in
    use, so the pool grows to the largest number of concurrent decisions seen (the API's threads) and stays
    there. Copies are never shared, so rego-cpp runs them in parallel without the GIL.
    """

    def __init__(self, policy_set: PolicySet) -> None:
        """Compiles the first copy now. Raises RegoError if the policy set does not compile."""
        self._policy_set = policy_set
        self._free = [self._compile()]

    def _compile(self) -> tuple[Interpreter, Bundle]:
        return compile_rego(self._policy_set.rego_modules, self._policy_set.data)

    @contextmanager
    def lease(self) -> Iterator[tuple[Interpreter, Bundle]]:
        try:
            copy = self._free.pop()  # atomic: list.pop holds the GIL throughout
        except IndexError:
            copy = self._compile()
        try:
            yield copy
        finally:
            self._free.append(copy)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value
