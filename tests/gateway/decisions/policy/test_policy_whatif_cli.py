"""`jobgate policy whatif`: replay the decisions a real gateway recorded in its ledger under a candidate
set; every flip is listed with counts; the bindings used are named (current DB, or a snapshot)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.cli.main import cli
from gateway.demo import prepare_demo
from gateway.settings import REPO_POLICIES, Settings


def record_some_decisions(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=data_dir, policy_watch_interval_s=0)
    prepare_demo(settings)
    tokens = json.loads((data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        a, b, c = (api.post("/v1/jobs", "alice", json=job_spec()).json()["id"] for _ in range(3))
        assert api.post(f"/v1/jobs/{a}/stop", "alice", json={"reason": "done"}).json()["decision"]["effect"] == "allow"
        assert api.post(f"/v1/jobs/{b}/stop", "carol", json={"reason": "hung"}).status_code == 202  # needs approval
        assert api.post(f"/v1/jobs/{c}/stop", "mallory", json={"reason": "mine"}).status_code == 403


def whatif(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["policy", "whatif", *args])
    return result.exit_code, result.output


def test_whatif_lists_every_flip_with_counts(tmp_path: Path) -> None:
    data = tmp_path / "var"
    record_some_decisions(data)
    candidate = tmp_path / "candidate"
    shutil.copytree(REPO_POLICIES, candidate)
    # Researchers may no longer stop their own jobs, and a job-level stop needs two confirmations.
    matrix = candidate / "matrix.csv"
    matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))
    data_json = candidate / "data.json"
    data_json.write_text(data_json.read_text().replace('"confirmations": {"job": 1,', '"confirmations": {"job": 2,'))

    code, out = whatif("--policies", str(candidate), "--data-dir", str(data), "--json")
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    assert report["bindings"].startswith("current business DB sqlite:///")
    kinds = {(f["actor"], f["action"], f["kind"]) for f in report["flips"]}
    assert ("alice", "job.stop", "allow→deny") in kinds
    assert ("carol", "job.stop", "approvals 1→2") in kinds
    assert not any(f["actor"] == "mallory" for f in report["flips"])  # denied before and after
    assert report["counts"]["allow→deny"] >= 1 and report["counts"]["approvals 1→2"] == 1
    assert report["flipped"] == len(report["flips"]) and report["replayed"] >= 6

    # The unchanged set flips nothing.
    code, out = whatif("--policies", str(REPO_POLICIES), "--data-dir", str(data), "--json")
    assert code == 0 and json.loads(out)["flipped"] == 0, out

    # With a bindings snapshot where carol is no queue admin, her request would be denied.
    snapshot = tmp_path / "bindings.csv"
    snapshot.write_text("g, alice, researcher, vision\ng, carol, researcher, vision\ng, dave, oncall, *\n")
    code, out = whatif("--policies", str(REPO_POLICIES), "--data-dir", str(data), "--bindings", str(snapshot))
    assert code == 0, out
    assert f"bindings: snapshot {snapshot} (3 bindings)" in out
    assert "needs_approval→deny" in out and "decision(s) would flip" in out

    # Nothing recorded since a date in the future.
    code, out = whatif("--policies", str(candidate), "--data-dir", str(data), "--since", "2999-01-01", "--json")
    assert code == 0 and json.loads(out)["replayed"] == 0


def test_whatif_bad_input_is_one_line(tmp_path: Path) -> None:
    code, out = whatif("--policies", str(REPO_POLICIES), "--data-dir", str(tmp_path))
    assert code == 1 and out.startswith("Error: no ledger database at"), out
    code, out = whatif("--policies", str(REPO_POLICIES))
    assert code == 1 and "exactly one of --data-dir or --ledger-url" in out
    data = tmp_path / "var"
    record_some_decisions(data)
    broken = tmp_path / "broken"
    shutil.copytree(REPO_POLICIES, broken)
    (broken / "guards.rego").write_text("package jobgate.authz\nbroken if {\n")
    code, out = whatif("--policies", str(broken), "--data-dir", str(data))
    assert code == 1 and "guards.rego:" in out, out
    code, out = whatif("--policies", str(REPO_POLICIES), "--data-dir", str(data), "--since", "yesterday")
    assert code == 1 and "--since 'yesterday' is not an ISO date" in out


def test_whatif_shows_progress_on_a_terminal_only(
        tmp_path: Path, run_on_a_terminal: Callable[..., tuple[int, bytes, bytes]]) -> None:
    data = tmp_path / "var"
    record_some_decisions(data)
    code, out, seen = run_on_a_terminal("policy", "whatif", "--policies", str(REPO_POLICIES), "--data-dir", str(data))
    assert code == 0, out
    assert b"replaying [" in seen and b"100%" in seen
    # Not a terminal (CliRunner): nothing but the report.
    code, out = whatif("--policies", str(REPO_POLICIES), "--data-dir", str(data))
    assert code == 0 and "replaying [" not in out
