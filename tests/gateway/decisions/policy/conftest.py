from __future__ import annotations

from pathlib import Path

import pytest

from gateway.decisions.policy import EmbeddedEngine, PolicySet, load_policy_set
from gateway.decisions.policy.testing import load_bindings

POLICIES = Path(__file__).resolve().parents[4] / "policies"


@pytest.fixture(scope="session")
def policy_set() -> PolicySet:
    return load_policy_set(POLICIES)


@pytest.fixture(scope="session")
def engine(policy_set: PolicySet) -> EmbeddedEngine:
    return EmbeddedEngine(policy_set, load_bindings(POLICIES))
