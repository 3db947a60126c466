"""The OPA engine path against a real HTTP server speaking OPA's REST API — a stand-in (see
opa_standin.py: no OPA binary can be installed here). Both engines must agree on the whole suite."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opa_standin import StandInProcess

from gateway.decisions.policy import EmbeddedEngine, PolicyLoadError, PolicySet, load_policy_set
from gateway.decisions.policy.opa import OpaEngine, bundle_modules
from gateway.decisions.policy.testing import load_bindings, load_table_cases, run_case, run_rego_tests

POLICIES = Path(__file__).resolve().parents[2] / "policies"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def standin() -> Iterator[StandInProcess]:
    server = StandInProcess()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def opa(standin: StandInProcess, policy_set: PolicySet) -> Iterator[OpaEngine]:
    engine = OpaEngine(policy_set, load_bindings(POLICIES), url=standin.url)
    yield engine
    engine.close()


def test_both_engines_decide_every_table_case_identically(opa: OpaEngine, engine: EmbeddedEngine) -> None:
    cases = load_table_cases(POLICIES)
    assert len(cases) > 50
    for case in cases:
        assert opa.decide(case.input) == engine.decide(case.input), case.name
        assert run_case(opa, case).passed, case.name


def test_both_engines_agree_on_the_rego_test_inputs(opa: OpaEngine, engine: EmbeddedEngine,
                                                    policy_set: PolicySet) -> None:
    # The Rego tests' `given_` requests carry capabilities directly; compare the raw decision values.
    from regopy import Interpreter

    assert all(r.passed for r in run_rego_tests(policy_set))
    rego = Interpreter()
    rego.add_module("t.rego", (POLICIES / "tests" / "authz_test.rego").read_text())
    rego.add_data(policy_set.data)
    givens: dict[str, Any] = {}
    for line in (POLICIES / "tests" / "authz_test.rego").read_text().splitlines():
        if line.startswith("given_"):
            name = line.split()[0]
            out = rego.query(f"data.jobgate.authz_test.{name}")
            givens[name] = out.results[0].expressions[0]
    assert len(givens) >= 8
    for name, doc in givens.items():
        assert opa.evaluate(doc) == engine.evaluate(doc), name


def test_modules_are_pushed_as_one_per_package(policy_set: PolicySet) -> None:
    bundled = bundle_modules(policy_set.rego_modules)
    assert list(bundled) == ["jobgate/jobgate/authz"]
    source = bundled["jobgate/jobgate/authz"]
    assert source.count("package jobgate.authz") == 1 and "# --- file: guards.rego ---" in source


def test_stopped_server_fails_closed(policy_set: PolicySet) -> None:
    server = StandInProcess()
    engine = OpaEngine(policy_set, load_bindings(POLICIES), url=server.url, timeout_s=0.5)
    case = next(c for c in load_table_cases(POLICIES) if c.expect["effect"] == "allow")
    assert engine.decide(case.input).effect == "allow"
    server.stop()
    decision = engine.decide(case.input)
    assert decision.effect == "deny"
    assert decision.rules == ("fail_closed",)
    assert decision.reasons[0].startswith("policy unavailable: the OPA server at ")
    engine.close()


def test_an_unreachable_server_is_said_to_be_unreachable_not_to_refuse_the_set(policy_set: PolicySet) -> None:
    with pytest.raises(PolicyLoadError) as info:
        OpaEngine(policy_set, [], url="http://127.0.0.1:9", timeout_s=0.5)
    assert "opa:0: the OPA server at http://127.0.0.1:9 could not be reached" in str(info.value)
    with pytest.raises(PolicyLoadError):
        OpaEngine(policy_set, [], url="ftp://nowhere")


def test_undefined_decision_on_the_server_fails_closed(tmp_path: Path, standin: StandInProcess) -> None:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    (target / "authz.rego").write_text(
        "package jobgate.authz\n\nimport rego.v1\n\n"
        'decision := {"effect": "deny", "reasons": ["no"], "rules": ["x"]} if not input.action == "job.stop"\n'
    )
    engine = OpaEngine(load_policy_set(target), [], url=standin.url)
    try:
        case = next(c for c in load_table_cases(POLICIES) if c.input["action"] == "job.stop")
        decision = engine.decide(case.input)
        assert decision.rules == ("fail_closed",)
        assert decision.reasons == ("policy unavailable: the policy defines no decision for this input",)
    finally:
        engine.close()
