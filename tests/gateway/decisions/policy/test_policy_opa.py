"""The OPA engines against OPA's own evaluator (v1.20.2): the server engine (`--policy-engine opa`, HTTP through
opa-python-client) against opa_server.py, which serves OPA's REST API with OPA's evaluator, and the in-process
engine (`--policy-engine opa-inprocess`). Both must decide as the embedded engine (regopy) does, on the whole
policy test suite and on decisions the embedded engine recorded."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opa_server import OpaServerProcess

from gateway.decisions.policy import EmbeddedEngine, PolicyLoadError, PolicySet, load_policy_set
from gateway.decisions.policy.engine import PolicyUnavailable
from gateway.decisions.policy.factory import make_engine
from gateway.decisions.policy.opa import OpaEngine, bundle_modules
from gateway.decisions.policy.opa_inprocess import OPA_GOLIB_PIN, OpaInProcessEngine
from gateway.decisions.policy.testing import load_bindings, load_table_cases, run_case

POLICIES = Path(__file__).resolve().parents[4] / "policies"
RECORDED = Path(__file__).resolve().parents[3] / "assets" / "recorded_decisions.jsonl.gz"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("opa_golib")]


@pytest.fixture(scope="module")
def server(opa_golib: None) -> Iterator[OpaServerProcess]:
    process = OpaServerProcess()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def opa(server: OpaServerProcess, policy_set: PolicySet) -> Iterator[OpaEngine]:
    engine = OpaEngine(policy_set, load_bindings(POLICIES), url=server.url)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def inprocess(opa_golib: None, policy_set: PolicySet) -> Iterator[OpaInProcessEngine]:
    engine = OpaInProcessEngine(policy_set, load_bindings(POLICIES))
    yield engine
    engine.close()


@pytest.fixture(params=["opa", "opa-inprocess"])
def opa_engine(request: pytest.FixtureRequest) -> EmbeddedEngine:
    """Each OPA engine in turn."""
    engine: EmbeddedEngine = request.getfixturevalue("opa" if request.param == "opa" else "inprocess")
    return engine


def test_every_table_case_is_decided_as_the_embedded_engine_decides_it(opa_engine: EmbeddedEngine,
                                                                       engine: EmbeddedEngine) -> None:
    cases = load_table_cases(POLICIES)
    assert len(cases) > 50
    for case in cases:
        assert opa_engine.decide(case.input) == engine.decide(case.input), case.name
        assert run_case(opa_engine, case).passed, case.name


def rego_test_requests(policy_set: PolicySet) -> dict[str, Any]:
    """The `given_` requests of the Rego tests (they carry capabilities directly), evaluated by OPA."""
    from opa_bindings import OpaEngine as Library

    source = (POLICIES / "tests" / "authz_test.rego").read_text()
    library = Library()
    library.add_policy("tests/authz_test.rego", source)
    library.add_data(policy_set.data)
    names = [line.split()[0] for line in source.splitlines() if line.startswith("given_")]
    return {name: library.eval_query("x = data.jobgate.authz_test[input.rule]", {"rule": name})[0]["x"]
            for name in names}


def test_the_rego_tests_requests_are_decided_alike(opa_engine: EmbeddedEngine, engine: EmbeddedEngine,
                                                   policy_set: PolicySet) -> None:
    givens = rego_test_requests(policy_set)
    assert len(givens) >= 8
    for name, doc in givens.items():
        assert opa_engine.evaluate(doc) == engine.evaluate(doc), name


def test_the_rego_tests_pass_when_opa_runs_them(policy_set: PolicySet) -> None:
    """Every `test_` rule, evaluated by OPA as run_rego_tests does with regopy (given_X decided, then test_X on
    {"request", "decision"}), is true, as it is there (test_policy_tables)."""
    from opa_bindings import OpaEngine as Library

    source = (POLICIES / "tests" / "authz_test.rego").read_text()
    rules = re.findall(r"^(test_\w+)\b", source, re.MULTILINE)
    assert len(rules) >= 8
    library = Library()
    for name, module in policy_set.rego_modules.items():
        library.add_policy(name, module)
    library.add_policy("tests/authz_test.rego", source)
    library.add_data(policy_set.data)
    # One query, the rule named in the input: OPA compiles each distinct query once.
    query = "x = data.jobgate.authz_test[input.rule]"
    failed = []
    for rule in rules:
        given = library.eval_query(query, {"rule": f"given_{rule.removeprefix('test_')}"})
        test_input: dict[str, Any] = {}
        if given:
            decision = library.eval_document("jobgate.authz.decision", given[0]["x"])
            test_input = {"request": given[0]["x"], "decision": decision}
        if library.eval_query(query, {**test_input, "rule": rule}) != [{"x": True}]:
            failed.append(rule)
    assert not failed


def recorded_decisions() -> list[dict[str, Any]]:
    """Decision inputs the embedded engine saw (`granted` and `actor.roles` included), one a line, taken from the
    gateway's ledgers over its API, CLI and end-to-end tests (tests/gateway/decisions/policy/recorded_decisions.py made
    them)."""
    with gzip.open(RECORDED, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer(engine: EmbeddedEngine, doc: dict[str, Any]) -> Any:
    """The raw decision, or why there is none (so a failed evaluation is a difference, not a crash)."""
    try:
        return engine.evaluate(doc)
    except PolicyUnavailable as e:
        return f"unavailable: {e}"


def test_recorded_decisions_are_decided_alike(opa_engine: EmbeddedEngine, engine: EmbeddedEngine) -> None:
    recorded = recorded_decisions()
    actions = {r["input"]["action"] for r in recorded}
    assert len(recorded) > 500 and len(actions) > 10, actions
    assert {r["effect"] for r in recorded} == {"allow", "deny", "needs_approval"}
    differ = [f"{r['ledger']}#{r['seq']}" for r in recorded
              if answer(opa_engine, r["input"]) != answer(engine, r["input"])]
    assert not differ, f"{len(differ)} of {len(recorded)} recorded decisions differ: {differ[:10]}"


def test_modules_are_pushed_as_one_per_package(policy_set: PolicySet) -> None:
    bundled = bundle_modules(policy_set.rego_modules)
    assert list(bundled) == ["jobgate/jobgate/authz"]
    source = bundled["jobgate/jobgate/authz"]
    assert source.count("package jobgate.authz") == 1 and "# --- file: guards.rego ---" in source


def test_stopped_server_fails_closed(policy_set: PolicySet) -> None:
    server = OpaServerProcess()
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


@pytest.mark.parametrize("kind", ["opa", "opa-inprocess"])
def test_undefined_decision_fails_closed(tmp_path: Path, server: OpaServerProcess, kind: str) -> None:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    (target / "authz.rego").write_text(
        "package jobgate.authz\n\nimport rego.v1\n\n"
        'decision := {"effect": "deny", "reasons": ["no"], "rules": ["x"]} if not input.action == "job.stop"\n'
    )
    engine = make_engine(load_policy_set(target), [], kind=kind, opa_url=server.url)
    try:
        case = next(c for c in load_table_cases(POLICIES) if c.input["action"] == "job.stop")
        decision = engine.decide(case.input)
        assert decision.rules == ("fail_closed",)
        assert decision.reasons == ("policy unavailable: the policy defines no decision for this input",)
    finally:
        engine.close()


# rego-cpp compiles this; OPA's type checker refuses it (count takes a collection).
MISTYPED = "package jobgate.authz\n\nimport rego.v1\n\nbatch_size_note := count(5)\n"


@pytest.mark.parametrize("kind", ["opa", "opa-inprocess"])
def test_a_set_opa_refuses_is_refused_with_opas_words(tmp_path: Path, server: OpaServerProcess, kind: str) -> None:
    """regopy loads the set; OPA does not compile it, so neither OPA engine starts on it, each saying why."""
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    (target / "notes.rego").write_text(MISTYPED)
    policy_set = load_policy_set(target)
    EmbeddedEngine(policy_set, [])  # the embedded engine takes it
    with pytest.raises(PolicyLoadError) as info:
        make_engine(policy_set, [], kind=kind, opa_url=server.url)
    said = str(info.value)
    assert "count: invalid argument(s)" in said
    if kind == "opa-inprocess":
        assert said.startswith("notes.rego:5: OPA: rego_type_error"), said
    else:
        assert said.startswith(f"opa:0: the OPA server at {server.url} refused the set"), said


def test_a_builtin_error_fails_the_decision_closed_on_both_opa_engines(tmp_path: Path,
                                                                       server: OpaServerProcess) -> None:
    """A guard whose builtin cannot take the input (trim_space of a number): OPA is asked with strict builtin
    errors, so the decision is a fail-closed deny instead of the guard silently not firing (as it does not in
    the embedded engine, where rego-cpp leaves the expression undefined: an allow)."""
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    guards = target / "guards.rego"
    guards.write_text(guards.read_text() + (
        '\ndenials contains {"rule": "T.ticket_format", "reason": "ticket must be short"} if {\n'
        '\tcount(trim_space(input.ticket)) > 40\n}\n'))
    case = next(c for c in load_table_cases(POLICIES) if c.expect["effect"] == "allow")
    request = {**case.input, "ticket": 12345}
    for kind in ("opa", "opa-inprocess"):
        opa_engine = make_engine(load_policy_set(target), load_bindings(POLICIES), kind=kind, opa_url=server.url)
        try:
            decision = opa_engine.decide(request)
        finally:
            opa_engine.close()
        assert decision.rules == ("fail_closed",), (kind, decision)
        assert "trim_space: operand 1 must be string but got number" in decision.reasons[0], (kind, decision)


def test_without_opas_library_the_in_process_engine_says_how_to_install_it(policy_set: PolicySet,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opa_bindings", None)  # what `import` sees when the package is absent
    with pytest.raises(PolicyLoadError) as info:
        make_engine(policy_set, [], kind="opa-inprocess")
    assert str(info.value).startswith("opa-inprocess:0: policy engine opa-inprocess needs OPA's library: pip install"
                                      f" --ignore-requires-python {OPA_GOLIB_PIN}")
    # The pin said is the one `make venv` installs.
    makefile = (POLICIES.parent / "Makefile").read_text()
    assert f"OPA_GOLIB := {OPA_GOLIB_PIN}\n" in makefile
