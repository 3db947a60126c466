"""Build the configured policy engine (embedded regopy by default, an OPA server, or OPA in-process)."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.decisions.policy.engine import EmbeddedEngine, RoleBinding
from gateway.decisions.policy.errors import PolicyLoadError, PolicyProblem
from gateway.decisions.policy.loader import PolicySet

ENGINES = ("embedded", "opa", "opa-inprocess")


def make_engine(
    policy_set: PolicySet,
    bindings: Iterable[RoleBinding],
    *,
    kind: str = "embedded",
    opa_url: str | None = None,
    opa_timeout_s: float = 1.0,
) -> EmbeddedEngine:
    """An engine for `policy_set`; for "opa" the set is pushed to the server first.

    Raises PolicyLoadError for an unknown kind, a missing URL, a server (or OPA in-process) that refuses the set,
    or OPA's library missing for "opa-inprocess".
    """
    if kind == "embedded":
        return EmbeddedEngine(policy_set, bindings)
    if kind == "opa-inprocess":
        from gateway.decisions.policy.opa_inprocess import OpaInProcessEngine

        return OpaInProcessEngine(policy_set, bindings)
    if kind == "opa":
        if not opa_url:
            raise PolicyLoadError([PolicyProblem("opa", 0, "policy engine opa needs an OPA URL (--opa-url)")])
        from gateway.decisions.policy.opa import OpaEngine

        return OpaEngine(policy_set, bindings, url=opa_url, timeout_s=opa_timeout_s)
    raise PolicyLoadError([PolicyProblem("engine", 0, f"unknown policy engine {kind!r}; use one of {ENGINES}")])
