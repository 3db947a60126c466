"""The shipped policy suite: every YAML table case and every Rego `test_` rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.decisions.policy import EmbeddedEngine, PolicySet
from gateway.decisions.policy.testing import load_table_cases, run_case, run_rego_tests

POLICIES = Path(__file__).resolve().parents[4] / "policies"

CASES = load_table_cases(POLICIES)
MATRIX_ROWS = ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_table_case(engine: EmbeddedEngine, case) -> None:  # type: ignore[no-untyped-def]
    result = run_case(engine, case)
    assert result.passed, "\n".join(result.failures)


def test_every_matrix_row_has_allowed_and_denied_cases() -> None:
    effects: dict[str, set[str]] = {}
    for case in CASES:
        effects.setdefault(case.row, set()).add(case.expect["effect"])
    for row in MATRIX_ROWS:
        assert {"allow", "deny"} <= effects.get(row, set()), row
    # Rows whose matrix entry says "second person: yes" must also show the waiting state.
    for row in ("A3", "A4", "A6", "A7", "A8"):
        assert "needs_approval" in effects[row], row


def test_rego_unit_tests(policy_set: PolicySet) -> None:
    results = run_rego_tests(policy_set)
    assert results, "no Rego test_ rules found"
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)
