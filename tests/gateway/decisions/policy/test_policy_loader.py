"""Loading refuses bad policy sets with file:line, and never accepts a fail-open default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.decisions.policy import PolicyLoadError, load_policy_set

POLICIES = Path(__file__).resolve().parents[4] / "policies"


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    return target


def _problems(directory: Path) -> list[str]:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_set(directory)
    return [str(p) for p in info.value.errors]


def test_shipped_policies_load() -> None:
    policy_set = load_policy_set(POLICIES)
    assert len(policy_set.hash) == 64
    assert "authz.rego" in policy_set.rego_modules
    assert policy_set.data["limits"]["jobs_per_batch"] == 50


def test_rego_syntax_error_names_file_and_line(policy_dir: Path) -> None:
    path = policy_dir / "guards.rego"
    lines = path.read_text().splitlines()
    lines.insert(8, "broken if {")  # becomes line 9; the brace never closes
    path.write_text("\n".join(lines) + "\n")
    problems = _problems(policy_dir)
    assert any(p.startswith("guards.rego:") for p in problems), problems
    assert all(not p.startswith("guards.rego:0:") for p in problems), problems


def test_rego_error_line_is_exact(policy_dir: Path) -> None:
    (policy_dir / "extra.rego").write_text("package jobgate.authz\n\nimport rego.v1\n\nbad if {\n  input.a ==\n}\n")
    problems = _problems(policy_dir)
    assert any(p.startswith("extra.rego:6:") for p in problems), problems


def test_missing_decision_rule_is_refused(policy_dir: Path) -> None:
    source = (policy_dir / "authz.rego").read_text()
    (policy_dir / "authz.rego").write_text(source.replace("decision :=", "verdict :="))
    problems = _problems(policy_dir)
    assert any("must define rule `decision`" in p for p in problems), problems


def test_fail_open_default_is_refused(policy_dir: Path) -> None:
    source = (policy_dir / "authz.rego").read_text()
    fail_open = source.replace(
        '"effect": "deny",\n\t"reasons": ["no policy', '"effect": "allow",\n\t"reasons": ["no policy'
    )
    assert fail_open != source
    (policy_dir / "authz.rego").write_text(fail_open)
    problems = _problems(policy_dir)
    assert any(p.startswith("authz.rego:") and "must be a deny" in p for p in problems), problems


def test_unknown_capability_in_matrix(policy_dir: Path) -> None:
    path = policy_dir / "matrix.csv"
    path.write_text(path.read_text() + "p, researcher, *, job.stopp.any\n")
    line = len(path.read_text().splitlines())
    assert f"matrix.csv:{line}: unknown capability 'job.stopp.any'" in _problems(policy_dir)


def test_malformed_data_json(policy_dir: Path) -> None:
    (policy_dir / "data.json").write_text('{\n  "limits": {"jobs_per_batch": 50,}\n}\n')
    assert any(p.startswith("data.json:2:") for p in _problems(policy_dir))


def test_missing_limit_in_data_json(policy_dir: Path) -> None:
    path = policy_dir / "data.json"
    path.write_text(path.read_text().replace('"gpus_per_call": 512', '"gpus_per_call": "lots"'))
    assert any("limits.gpus_per_call must be a non-negative integer" in p for p in _problems(policy_dir))


def test_broken_model(policy_dir: Path) -> None:
    (policy_dir / "model.conf").write_text("[request_definition]\nr = sub, dom, act\n")
    assert any(p.startswith("model.conf:") for p in _problems(policy_dir))


def test_hash_covers_every_file(policy_dir: Path) -> None:
    before = load_policy_set(policy_dir).hash
    assert load_policy_set(policy_dir).hash == before
    test_file = policy_dir / "tests" / "matrix.yaml"
    test_file.write_text(test_file.read_text() + "\n")
    assert load_policy_set(policy_dir).hash != before


@pytest.mark.parametrize(
    "value",
    ['"14"', "0", "-1", "true", "1.5", "null", "1000000000"],
    ids=["text", "zero", "negative", "bool", "fraction", "null", "past-any-calendar"],
)
@pytest.mark.parametrize("key", ["important_days", "recovery_window_days"])
def test_a_retention_or_recovery_period_that_is_not_a_number_of_days_is_refused(
    policy_dir: Path, key: str, value: str
) -> None:
    """P1, A6: the important tier's retention and the deletion recovery window are whole days, at least one
    (zero keeps an important checkpoint less than a normal one, and leaves no time to undelete) and within a
    calendar (a billion days is no timedelta, and would crash every stop of an important job)."""
    path = policy_dir / "data.json"
    text = path.read_text()
    for number in ('"important_days": 14', '"recovery_window_days": 7'):
        assert number in text
    text = text.replace(f'"{key}": {14 if key == "important_days" else 7}', f'"{key}": {value}')
    path.write_text(text)
    line = next(n for n, row in enumerate(text.splitlines(), start=1) if f'"{key}": {value}' in row)
    section = "retention" if key == "important_days" else "deletion"
    assert f"data.json:{line}: {section}.{key} must be a whole number of days from 1 to 36500" in _problems(policy_dir)


def test_the_shipped_retention_and_recovery_periods_are_todays() -> None:
    data = load_policy_set(POLICIES).data
    assert data["retention"]["important_days"] == 14
    assert data["deletion"]["recovery_window_days"] == 7
