"""`jobgate policy check|test|explain`: the reviewers' tools, run as the CLI (no server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.main import cli

POLICIES = Path(__file__).resolve().parents[4] / "policies"


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    return target


@pytest.fixture(autouse=True)
def away_from_any_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`policy explain` reads the bindings of the gateway beside it (JOBGATE_DATABASE_URL, or var/ here): run
    where there is none, so a demo left in the repository's var/ does not decide these cases."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBGATE_DATABASE_URL", raising=False)
    monkeypatch.delenv("JOBGATE_DATA_DIR", raising=False)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def decision_of(out: str) -> str:
    """explain's decision line: the one after the first, which names the bindings used."""
    first, _, rest = out.partition("\n")
    assert first.startswith("bindings: "), out
    return rest


def test_check_ok_and_broken(policy_dir: Path) -> None:
    code, out = run("policy", "check", str(policy_dir))
    assert code == 0 and out.startswith("ok "), out
    (policy_dir / "extra.rego").write_text("package jobgate.authz\n\nimport rego.v1\n\nbad if {\n  input.a ==\n}\n")
    (policy_dir / "matrix.csv").write_text((policy_dir / "matrix.csv").read_text() + "p, researcher, *, job.fly\n")
    code, out = run("policy", "check", str(policy_dir))
    assert code == 1
    assert "extra.rego:6:" in out and "matrix.csv:" in out and "unknown capability 'job.fly'" in out, out
    code, out = run("policy", "check", str(policy_dir), "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_check_warns_of_a_role_that_looks_like_a_misspelt_one(policy_dir: Path) -> None:
    """`p, reseacher, vision, job.view` was accepted silently: a new role `reseacher` that `role grant` then
    offered, while the researchers it was meant for did not get the capability."""
    matrix = policy_dir / "matrix.csv"
    lines = len(matrix.read_text().splitlines())
    matrix.write_text(matrix.read_text() + "p, reseacher, vision, job.view\n")
    code, out = run("policy", "check", str(policy_dir))
    assert code == 0, out
    assert (f"warning: matrix.csv:{lines + 1}: role 'reseacher' (1 row(s)) looks like a misspelling of"
            " 'researcher'") in out, out
    code, out = run("policy", "check", str(policy_dir), "--strict")
    assert code == 1, out
    assert json.loads(run("policy", "check", str(policy_dir), "--json")[1])["warnings"]
    assert json.loads(run("policy", "check", str(POLICIES), "--json")[1])["warnings"] == []  # the shipped set


def test_check_missing_directory() -> None:
    code, out = run("policy", "check", "/nonexistent/policies")
    assert code == 1 and out.startswith("Error: policy directory /nonexistent/policies does not exist"), out


def test_test_passes_with_coverage(policy_dir: Path) -> None:
    code, out = run("policy", "test", str(policy_dir))
    assert code == 0, out
    assert "PASS  A4      A4 owner stops own job" in out
    assert "PASS  rego    jobgate.authz_test.test_default_is_deny" in out
    assert "  A4  allow, deny, needs_approval" in out
    assert " 0 failed " in out


def test_test_fails_on_a_broken_expectation(policy_dir: Path) -> None:
    matrix = policy_dir / "matrix.csv"
    matrix.write_text(matrix.read_text() + "p, researcher, *, job.stop.any\n")
    code, out = run("policy", "test", str(policy_dir), "--failures-only")
    assert code == 1
    assert "FAIL  A4      A4 a researcher cannot stop another's job" in out
    assert "tests/matrix.yaml:" in out and "effect 'needs_approval' != expected 'deny'" in out
    code, out = run("policy", "test", str(policy_dir), "--json")
    body = json.loads(out)
    assert code == 1 and body["failed"] >= 1


def test_test_reports_coverage_gaps(policy_dir: Path) -> None:
    table = policy_dir / "tests" / "matrix.yaml"
    kept = [block for block in table.read_text().split("\n- name:") if "row: A5" not in block]
    table.write_text("\n- name:".join(kept))
    code, out = run("policy", "test", str(policy_dir))
    assert code == 1 and "gap: row A5 has no allow/deny case" in out, out


def test_explain_shows_rules_reasons_and_where(tmp_path: Path) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"action": "job.stop", "actor": "bob", "reason": "hung",
                                   "targets": [{"creator": "alice", "external_rights": True}]}))
    code, out = run("policy", "explain", "--input", str(request))
    assert code == 0, out
    assert decision_of(out).startswith("decision: NEEDS_APPROVAL")
    assert "A4.second_person" in out and "jobs.rego:" in out
    assert "R3.one_notch_stricter" in out and "approvals.rego:" in out
    assert "2 required, 2 missing" in out
    code, out = run("policy", "explain", "--input", str(request), "--json")
    body = json.loads(out)
    assert body["decision"]["approvals_required"]["count"] == 2
    assert {f["rule"] for f in body["fired"]} == {"A4.second_person", "R3.one_notch_stricter"}


def test_explain_takes_a_ledger_entry_and_bindings(tmp_path: Path) -> None:
    entry = {"kind": "decision", "body": {"input": {
        "action": "job.stop", "actor": {"id": "zoe", "kind": "person"}, "project": "vision", "reason": "x",
        "targets": [{"id": "j-9", "project": "vision", "creator": "alice", "creator_kind": "person",
                     "owner": "alice", "external_rights": False, "gpus": 1, "expired": False}],
        "approvals": [], "granularity": "job", "now": "2026-11-29T10:00:00Z"}}}
    (tmp_path / "entry.json").write_text(json.dumps(entry))
    (tmp_path / "b.csv").write_text("g, zoe, oncall, *\n")
    code, out = run("policy", "explain", "--input", str(tmp_path / "entry.json"), "--bindings", str(tmp_path / "b.csv"))
    assert code == 0 and "A4.second_person" in out and "*: " in out, out
    code, out = run("policy", "explain", "--input", str(tmp_path / "entry.json"))
    assert code == 0 and decision_of(out).startswith("decision: DENY"), out  # zoe holds nothing in the fixture


def test_explain_takes_what_audit_show_json_prints(tmp_path: Path) -> None:
    """`jobgate audit show SEQ --json > entry.json` wraps the entry beside its proof and checkpoint."""
    entry = {"kind": "decision", "body": {"input": {
        "action": "job.stop", "actor": {"id": "mallory", "kind": "person"}, "project": "vision", "reason": "mine",
        "targets": [{"id": "j-9", "project": "vision", "creator": "alice", "creator_kind": "person",
                     "owner": "alice", "external_rights": False, "gpus": 1, "expired": False}],
        "approvals": [], "granularity": "job", "now": "2026-11-29T10:00:00Z"}}}
    shown = {"entry": entry, "checkpoint": "jobgate.local/ledger\n1\n...", "checkpoint_signature": "valid"}
    (tmp_path / "shown.json").write_text(json.dumps(shown))
    code, out = run("policy", "explain", "--input", str(tmp_path / "shown.json"))
    assert code == 0 and decision_of(out).startswith("decision: DENY") and "A4.no_capability" in out, out


@pytest.mark.parametrize(("text", "needle"), [("{not json", "not JSON"), ('{"x": 1}', "at least `action`")])
def test_explain_bad_input_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "bad.json").write_text(text)
    code, out = run("policy", "explain", "--input", str(tmp_path / "bad.json"))
    assert code == 1 and out.startswith("Error: ") and needle in out and out.count("\n") == 1, out


def test_explain_of_a_ledger_entry_sets_the_recorded_decision_beside_todays_and_reads_a_gateways_bindings(
    tmp_path: Path,
) -> None:
    """By default explain judged a real entry with the policy tests' fixture bindings: carol's recorded
    needs_approval came out as a DENY, with nothing to say that it was not what had happened."""
    from gateway.demo import prepare_demo
    from gateway.settings import Settings

    entry = {"kind": "decision", "body": {
        "decision": {"effect": "needs_approval", "rules": ["A4.second_person"]},
        "input": {"action": "job.stop", "actor": {"id": "carol", "kind": "person"}, "project": "vision",
                  "reason": "urgent eval",
                  "targets": [{"id": "j-9", "project": "vision", "creator": "alice", "creator_kind": "person",
                               "owner": "alice", "external_rights": False, "gpus": 1, "expired": False}],
                  "approvals": [], "granularity": "job", "now": "2026-11-29T10:00:00Z"}}}
    (tmp_path / "entry.json").write_text(json.dumps(entry))
    code, out = run("policy", "explain", "--input", str(tmp_path / "entry.json"))
    assert code == 0 and decision_of(out).startswith("decision: DENY"), out
    no_db = tmp_path / "var" / "jobgate.db"
    assert out.startswith(f"bindings: {POLICIES / 'tests' / 'bindings.csv'} (the policy tests' fixture, not a"
                          f" gateway's: no gateway data dir here ({no_db} does not exist)"), out
    assert "recorded then: NEEDS_APPROVAL (A4.second_person); DIFFERS from the answer above" in out
    prepare_demo(Settings(data_dir=tmp_path / "var"))  # carol is a queue admin of vision there
    code, out = run("policy", "explain", "--input", str(tmp_path / "entry.json"), "--data-dir", str(tmp_path / "var"))
    assert code == 0 and decision_of(out).startswith("decision: NEEDS_APPROVAL"), out
    assert "recorded then: NEEDS_APPROVAL (A4.second_person); the same as now" in out
    code, out = run("policy", "explain", "--input", str(tmp_path / "entry.json"), "--data-dir", str(tmp_path / "no"))
    assert code == 1 and "no business database at" in out, out


@pytest.mark.parametrize("found_by", ["var here", "JOBGATE_DATA_DIR", "JOBGATE_DATABASE_URL"])
def test_explain_reads_the_bindings_of_the_gateway_beside_it_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found_by: str
) -> None:
    """Run beside the demo, explain said DENY for carol stopping alice's job, judged under the policy tests'
    fixture (where carol is a researcher), while the demo asked a second person; only its last line said so."""
    from gateway.demo import prepare_demo
    from gateway.settings import Settings

    data = tmp_path / "var" if found_by == "var here" else tmp_path / "elsewhere"
    prepare_demo(Settings(data_dir=data))
    db_url = f"sqlite:///{data.resolve() / 'jobgate.db'}"
    if found_by == "JOBGATE_DATA_DIR":
        monkeypatch.setenv("JOBGATE_DATA_DIR", str(data))
    elif found_by == "JOBGATE_DATABASE_URL":
        monkeypatch.setenv("JOBGATE_DATABASE_URL", db_url)
    (tmp_path / "req.json").write_text(json.dumps({"action": "job.stop", "actor": "carol", "reason": "urgent eval",
                                                   "targets": [{"creator": "alice"}]}))
    code, out = run("policy", "explain", "--input", str(tmp_path / "req.json"))
    assert code == 0, out
    assert out.startswith(f"bindings: current bindings of {db_url} ("), out
    assert decision_of(out).startswith("decision: NEEDS_APPROVAL"), out
    body = json.loads(run("policy", "explain", "--input", str(tmp_path / "req.json"), "--json")[1])
    assert body["decision"]["effect"] == "needs_approval"
    assert body["bindings"].startswith(f"current bindings of {db_url}")
    # An explicit snapshot still wins over the gateway beside it.
    code, out = run("policy", "explain", "--input", str(tmp_path / "req.json"),
                    "--bindings", str(POLICIES / "tests" / "bindings.csv"))
    assert out.startswith(f"bindings: {POLICIES / 'tests' / 'bindings.csv'} (14 bindings)"), out
    assert decision_of(out).startswith("decision: DENY"), out
