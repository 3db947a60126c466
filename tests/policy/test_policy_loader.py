"""Loading refuses bad policy sets with file:line, and never accepts a fail-open default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.policy import PolicyLoadError, load_policy_set

POLICIES = Path(__file__).resolve().parents[2] / "policies"


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
