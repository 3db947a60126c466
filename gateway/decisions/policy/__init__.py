"""Policy decisions: load a policy set (Casbin matrix + Rego guards) and decide job mutations in-process.

Importable without the rest of the gateway: it needs only casbin, regopy and the policy files.
"""

from __future__ import annotations

from gateway.decisions.policy.engine import Decision, EmbeddedEngine, PolicyEngine, RoleBinding
from gateway.decisions.policy.errors import PolicyError, PolicyLoadError, PolicyProblem
from gateway.decisions.policy.loader import PolicySet, load_policy_set

__all__ = [
    "Decision",
    "EmbeddedEngine",
    "PolicyEngine",
    "PolicyError",
    "PolicyLoadError",
    "PolicyProblem",
    "PolicySet",
    "RoleBinding",
    "load_policy_set",
]
