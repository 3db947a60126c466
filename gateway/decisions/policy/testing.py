"""Run the policy test suite shipped with a policy set: YAML table cases and Rego `test_` rules.

Used by tests/gateway/decisions/policy and by `jobgate policy test`, so a security reviewer runs the same checks CI
does.
Table cases are compact: `expand_input` fills every field the gateway would set (DEFAULT_TARGET,
DEFAULT_REQUEST), so a case states only what matters to its row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from regopy import RegoError

from gateway.decisions.policy.engine import Decision, EmbeddedEngine, RoleBinding
from gateway.decisions.policy.errors import PolicyLoadError, PolicyProblem
from gateway.decisions.policy.loader import (
    DECISION_ENTRYPOINT,
    TESTS_DIR,
    PolicySet,
    compile_rego,
    first_value,
    load_policy_set,
    read_policy_text,
    rego_problems,
)
from gateway.decisions.policy.regoio import rego_input, set_input

BINDINGS_FILE = "bindings.csv"

DEFAULT_REQUEST: dict[str, Any] = {
    "project": None,
    "targets": [],
    "params": {},
    "reason": None,
    "ticket": None,
    "granularity": "job",
    "approvals": [],
    "now": "2026-11-29T10:00:00Z",
}

DEFAULT_TARGET: dict[str, Any] = {
    "project": "vision",
    "creator_kind": "person",
    "external_rights": False,
    "state": "running",
    "environment": "research",
    "valid_until": None,
    "expired": False,
    "gpus": 8,
}


MATRIX_ROWS = ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8")
# Rows whose matrix entry says "second person: yes" must also show the waiting state.
SECOND_PERSON_ROWS = ("A3", "A4", "A6", "A7", "A8")


@dataclass(frozen=True)
class TableCase:
    """One row of a policies/tests/*.yaml table; `line` is where its `- name:` stands (0 if unknown)."""

    name: str
    row: str
    input: dict[str, Any]
    expect: dict[str, Any]
    file: str
    line: int = 0


@dataclass(frozen=True)
class CaseResult:
    case: TableCase
    decision: Decision
    failures: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class RegoTestResult:
    name: str
    passed: bool
    detail: str = ""
    file: str = ""
    line: int = 0


def load_bindings(policy_dir: Path) -> list[RoleBinding]:
    """Fixture role bindings (`g, principal, role, project`) the table cases are written against.

    Raises PolicyLoadError on a malformed line.
    """
    path = policy_dir / TESTS_DIR / BINDINGS_FILE
    bindings: list[RoleBinding] = []
    if not path.is_file():
        return bindings
    for number, raw in enumerate(read_policy_text(path, f"{TESTS_DIR}/{BINDINGS_FILE}").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or fields[0] != "g":
            problem = PolicyProblem(f"{TESTS_DIR}/{BINDINGS_FILE}", number, "expected `g, principal, role, project`")
            raise PolicyLoadError([problem])
        bindings.append(RoleBinding(fields[1], fields[2], fields[3]))
    return bindings


def load_table_cases(policy_dir: Path) -> list[TableCase]:
    """Every case of every policies/tests/*.yaml file, inputs expanded. Raises PolicyLoadError."""
    cases: list[TableCase] = []
    names: set[str] = set()
    for path in sorted((policy_dir / TESTS_DIR).glob("*.yaml")):
        rel = f"{TESTS_DIR}/{path.name}"
        text = read_policy_text(path, rel)
        try:
            entries = yaml.safe_load(text) or []
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise PolicyLoadError([PolicyProblem(rel, mark.line + 1 if mark else 0, str(e))]) from e
        if not isinstance(entries, list):
            raise PolicyLoadError([PolicyProblem(rel, 1, "a table is a list of cases")])
        for entry in entries:
            if not isinstance(entry, dict) or not {"name", "row", "input", "expect"} <= entry.keys():
                raise PolicyLoadError([PolicyProblem(rel, 0, f"case needs name, row, input, expect: {entry!r}")])
            name = entry["name"]
            if not isinstance(name, str):
                raise PolicyLoadError([PolicyProblem(rel, 0, f"a case's name is text, not {name!r}")])
            if name in names:
                raise PolicyLoadError([PolicyProblem(rel, 0, f"duplicate case name {name!r}")])
            names.add(name)
            line = _line_of_case(text, name)
            # A reviewer's malformed case refuses the set naming the case, never as a crash of the reload.
            problem = _expect_problem(entry["expect"])
            if problem is not None:
                raise PolicyLoadError([PolicyProblem(rel, line, f"case {name!r}: {problem}")])
            try:
                request = expand_input(entry["input"])
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                message = f"case {name!r}: malformed input ({type(e).__name__}: {e})"
                raise PolicyLoadError([PolicyProblem(rel, line, message)]) from e
            cases.append(TableCase(name, str(entry["row"]), request, entry["expect"], rel, line))
    return cases


def _expect_problem(expect: Any) -> str | None:
    """What is wrong with a case's `expect` (run_case reads it), or None."""
    if not isinstance(expect, dict) or not isinstance(expect.get("effect"), str):
        return "expect must be a mapping with an effect"
    for key in ("rules", "obligations"):
        if key in expect and not (isinstance(expect[key], list) and all(isinstance(v, str) for v in expect[key])):
            return f"expect.{key} must be a list of names"
    if "reason" in expect and not isinstance(expect["reason"], str):
        return "expect.reason must be text"
    return None


def _line_of_case(text: str, name: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip().removeprefix("- ").strip()
        if stripped.startswith("name:") and stripped.removeprefix("name:").strip().strip("'\"") == name:
            return number
    return 0


def expand_input(compact: dict[str, Any]) -> dict[str, Any]:
    """Fill a compact case input into a full decision input.

    `actor` may be a bare id (a person); a target's `owner` defaults to its `creator` and the reverse;
    `copies: n` on a target repeats it n times with ids `<id>-1 .. <id>-n`.
    """
    request = {**DEFAULT_REQUEST, **compact}
    actor = request["actor"]
    actor = {"id": actor} if isinstance(actor, str) else dict(actor)
    request["actor"] = {"kind": "person", "responsible": None, "trigger": None, **actor}
    targets: list[dict[str, Any]] = []
    for number, raw in enumerate(request["targets"], start=1):
        target = {**DEFAULT_TARGET, "id": f"j-{number}", **raw}
        target.setdefault("creator", target.get("owner", "alice"))
        target.setdefault("owner", target["creator"])
        target.setdefault("beneficiary_project", target["project"])
        target.setdefault("rights_holder", target["project"])
        copies = int(target.pop("copies", 1))
        if copies == 1:
            targets.append(target)
        else:
            targets.extend({**target, "id": f"{target['id']}-{i}"} for i in range(1, copies + 1))
    request["targets"] = targets
    if request["project"] is None and targets and len({t["project"] for t in targets}) == 1:
        request["project"] = targets[0]["project"]
    request["approvals"] = [{"roles_by_project": {}, "is_owner_of": [], **a} for a in request["approvals"]]
    return request


def run_case(engine: EmbeddedEngine, case: TableCase) -> CaseResult:
    """Decide one case and compare with `expect` (effect; rules, approvals, reason text if given)."""
    decision = engine.decide(case.input)
    expect = case.expect
    failures = []
    if decision.effect != expect["effect"]:
        failures.append(f"effect {decision.effect!r} != expected {expect['effect']!r}")
    missing_rules = set(expect.get("rules", ())) - set(decision.rules)
    if missing_rules:
        failures.append(f"rules {sorted(missing_rules)} did not fire")
    if "approvals" in expect and decision.approvals_required.get("count") != expect["approvals"]:
        failures.append(f"approvals {decision.approvals_required.get('count')} != expected {expect['approvals']}")
    if "reason" in expect and not any(expect["reason"] in r for r in decision.reasons):
        failures.append(f"no reason contains {expect['reason']!r}")
    kinds = {o.get("kind") for o in decision.obligations}
    missing_obligations = set(expect.get("obligations", ())) - kinds
    if missing_obligations:
        failures.append(f"obligations {sorted(missing_obligations)} missing")
    if failures:
        failures.append(f"decision: {decision.to_json()}")
    return CaseResult(case, decision, tuple(failures))


def run_table(policy_set: PolicySet, cases: Iterable[TableCase] | None = None) -> list[CaseResult]:
    """Run every table case against an EmbeddedEngine bound to the fixture bindings."""
    engine = EmbeddedEngine(policy_set, load_bindings(policy_set.directory))
    chosen = load_table_cases(policy_set.directory) if cases is None else cases
    return [run_case(engine, c) for c in chosen]


_PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)
_TEST_RULE = re.compile(r"^(test_\w+)\b", re.MULTILINE)


def run_rego_tests(policy_set: PolicySet) -> list[RegoTestResult]:
    """Run every `test_*` rule of policies/tests/*_test.rego; a test passes when it is true.

    rego-cpp 1.x crashes on `with input as` over rules that read input through other rules, so a
    test does not swap inputs itself: `given_X` (if defined) is the request, the runner evaluates
    the decision on it, then queries `test_X` with input {"request": ..., "decision": ...}.
    Raises PolicyLoadError if the test modules do not compile.
    """
    decider, bundle = compile_rego(policy_set.rego_modules, policy_set.data)
    modules = dict(policy_set.rego_modules)
    tests: list[tuple[str, str, str, int]] = []
    for path in sorted((policy_set.directory / TESTS_DIR).glob("*_test.rego")):
        rel = f"{TESTS_DIR}/{path.name}"
        source = read_policy_text(path, rel)
        modules[rel] = source
        package = _PACKAGE.search(source)
        if package is None:
            raise PolicyLoadError([PolicyProblem(rel, 1, "no package line")])
        for m in _TEST_RULE.finditer(source):
            if all(t[1] != m.group(1) or t[0] != package.group(1) for t in tests):
                tests.append((package.group(1), m.group(1), rel, source.count("\n", 0, m.start()) + 1))
    try:
        runner, _ = compile_rego(modules, policy_set.data)
    except RegoError as e:
        raise PolicyLoadError(rego_problems(str(e), modules)) from e
    results = []
    for test_package, rule, file, line in tests:
        name = f"{test_package}.{rule}"
        try:
            given = first_value(runner.query(f"data.{test_package}.given_{rule.removeprefix('test_')}"))
            test_input: dict[str, Any] = {}
            if given is not None:
                set_input(decider, rego_input(given))
                decision = first_value(decider.query_bundle_entrypoint(bundle, DECISION_ENTRYPOINT))
                test_input = {"request": given, "decision": decision}
            set_input(runner, rego_input(test_input))
            value = first_value(runner.query(f"data.{test_package}.{rule}"))
        except (RegoError, ValueError) as e:
            results.append(RegoTestResult(name, False, f"error: {e}", file, line))
            continue
        detail = "" if value is True else "undefined" if value is None else f"evaluated to {value!r}"
        results.append(RegoTestResult(name, value is True, detail, file, line))
    return results


def coverage(cases: Iterable[TableCase]) -> dict[str, list[str]]:
    """Effects exercised per matrix row A1-A8 (and any other row the tables name)."""
    effects: dict[str, set[str]] = {row: set() for row in MATRIX_ROWS}
    for case in cases:
        effects.setdefault(case.row, set()).add(str(case.expect.get("effect")))
    return {row: sorted(found) for row, found in effects.items()}


def coverage_gaps(cov: dict[str, list[str]]) -> list[str]:
    """Matrix rows lacking an allowed or a denied case, or a waiting case where a second person is due."""
    gaps = []
    for row in MATRIX_ROWS:
        needed = {"allow", "deny"} | ({"needs_approval"} if row in SECOND_PERSON_ROWS else set())
        missing = needed - set(cov.get(row, ()))
        if missing:
            gaps.append(f"row {row} has no {'/'.join(sorted(missing))} case")
    return gaps


def run_suite(policy_set: PolicySet) -> list[PolicyProblem]:
    """Every failing table case and Rego test of the set, as file:line problems (empty = all pass).

    Raises PolicyLoadError if the tests themselves are malformed.
    """
    problems = []
    for r in run_table(policy_set):
        if not r.passed:
            problems.append(PolicyProblem(r.case.file, r.case.line, f"case {r.case.name!r} failed: {r.failures[0]}"))
    for t in run_rego_tests(policy_set):
        if not t.passed:
            problems.append(PolicyProblem(t.file, t.line, f"{t.name} failed: {t.detail}"))
    return problems


def load_tested_set(directory: Path) -> PolicySet:
    """The set in `directory` as the gateway accepts it: it loads and passes its own test suite. The gateway's
    start-up and reload and `jobgate policy check` all ask this: check never says ok to a set the gateway
    refuses, and a set a reload refused does not become active at the next restart.

    Raises PolicyLoadError listing every problem, failing cases included.
    """
    policy_set = load_policy_set(directory)
    failures = _SUITE_RESULTS.get(policy_set.hash)
    if failures is None:
        failures = tuple(run_suite(policy_set))
        if len(_SUITE_RESULTS) >= 16:
            _SUITE_RESULTS.clear()
        _SUITE_RESULTS[policy_set.hash] = failures
    if failures:
        raise PolicyLoadError(list(failures))
    return policy_set


# Suite results by policy hash: the hash covers every file the suite reads (its cases, its bindings, its Rego
# tests), so one run answers for every later start or reload of the same set in this process.
_SUITE_RESULTS: dict[str, tuple[PolicyProblem, ...]] = {}
