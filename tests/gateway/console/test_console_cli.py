"""CLI parity: every console view has a command with --json, over real HTTP to the same app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_testkit import Console, submit
from served_app import served as serve_app

# The CLI only speaks HTTP; which database is behind the app is covered by the other console tests.
pytestmark = pytest.mark.parametrize("console", ["sqlite"], indirect=True)


@pytest.fixture
def served(console: Console) -> Iterator[tuple[Console, str]]:
    """The fixture's app behind a real uvicorn socket."""
    with serve_app(console.app) as url:
        yield console, url


def run(url: str, con: Console, who: str, *args: str) -> tuple[int, str]:
    """Run `jobgate ARGS` as its own process; exit code and stdout, or on failure stderr."""
    env = {**os.environ, "JOBGATE_URL": url, "JOBGATE_TOKEN": con.tokens[who]}
    result = subprocess.run([sys.executable, "-m", "gateway.cli", *args], env=env, capture_output=True, text=True,
                            timeout=60)
    return result.returncode, result.stderr if result.returncode else result.stdout


def test_stats_commands_match_the_admin_page(served: tuple[Console, str]) -> None:
    con, url = served
    submit(con, gpus_per_node=4)
    code, out = run(url, con, "erin", "stats", "usage", "--json")
    assert code == 0
    usage = json.loads(out)
    assert [r["tenant"] for r in usage["heatmap"]["rows"]] == ["speech", "vision"]
    assert len(usage["heatmap"]["days"]) == 7
    code, out = run(url, con, "erin", "stats", "waits", "--json")
    assert code == 0 and json.loads(out)["queues"]["normal"]["waiting_now"] == 1
    code, out = run(url, con, "erin", "stats", "fragmentation", "--json")
    assert code == 0 and {"free_gpus", "largest_free_block", "fragmentation"} <= set(json.loads(out))
    code, out = run(url, con, "erin", "stats", "suggestions", "--json")
    assert code == 0 and "suggestions" in json.loads(out)
    code, out = run(url, con, "erin", "stats", "usage")
    assert code == 0 and "quota utilisation" in out and "vision" in out
    # A researcher gets the API's refusal as one line, not a traceback.
    code, out = run(url, con, "alice", "stats", "usage")
    assert code == 1 and out.startswith("Error: 403 alice may not read cluster administration statistics")


def test_notifications_and_ack(served: tuple[Console, str]) -> None:
    con, url = served
    job = submit(con)
    approval = con.api("POST", f"/v1/jobs/{job}/stop", "carol", json={"reason": "queue hog"}).json()["approval_id"]
    con.api("POST", f"/v1/approvals/{approval}/approve", "dave")
    code, out = run(url, con, "alice", "notifications", "--json")
    assert code == 0
    notes = json.loads(out)["notifications"]
    pending = [n for n in notes if n["receipt"] == "pending"]
    assert pending, notes
    code, out = run(url, con, "alice", "notifications", "--ack", pending[0]["id"])
    assert code == 0 and out.strip() == f"{pending[0]['id']}: acknowledged"
    code, out = run(url, con, "alice", "notifications", "--ack", "nope")
    assert code == 1 and out.startswith("Error: 404")


def test_the_notices_table_cuts_details_after_a_whole_item_and_says_so(served: tuple[Console, str]) -> None:
    con, url = served
    job = submit(con)
    approval = con.api("POST", f"/v1/jobs/{job}/stop", "carol", json={"reason": "queue hog " * 20}).json()
    assert approval["approval_id"]
    code, out = run(url, con, "alice", "notifications")
    assert code == 0
    details = [line for line in out.splitlines() if "approval" in line and "=" in line]
    assert details and all(line.endswith(" …") for line in details), out
    assert all(line[:-2].rstrip().split(", ")[-1].count("=") == 1 for line in details), out


def test_audit_entries_show_and_export(served: tuple[Console, str], tmp_path: Path) -> None:
    con, url = served
    job = submit(con)
    code, out = run(url, con, "audrey", "audit", "entries", "--job", job, "--json")
    assert code == 0
    (hit,) = json.loads(out)["entries"]
    code, out = run(url, con, "audrey", "audit", "show", str(hit["seq"]))
    assert code == 0 and "inclusion proof verified" in out
    code, out = run(url, con, "audrey", "audit", "show", str(hit["seq"]), "--json")
    assert code == 0 and json.loads(out)["verified"] is True
    # --limit beyond one page walks the ledger in pages.
    code, out = run(url, con, "audrey", "audit", "entries", "--limit", "1000", "--json")
    assert code == 0 and len(json.loads(out)["entries"]) == con.gateway.ledger.size()
    bundle = tmp_path / "ledger.bundle"
    code, out = run(url, con, "audrey", "audit", "export", "--out", str(bundle), "--json")
    assert code == 0 and json.loads(out)["bytes"] == bundle.stat().st_size > 0
    code, out = run(url, con, "alice", "audit", "entries")
    assert code == 1 and out.startswith("Error: 403")
    code, out = run(url, con, "alice", "audit", "export", "--out", str(tmp_path / "no.bundle"))
    assert code == 1 and out.startswith("Error: 403") and not (tmp_path / "no.bundle").exists()


def test_an_auditor_saves_the_checkpoint_and_verifies_against_it_later(served: tuple[Console, str],
                                                                      tmp_path: Path) -> None:
    """The README saved the trusted checkpoint with curl (which, with a wrong token, saved the 401's body)."""
    con, url = served
    submit(con)
    saved = tmp_path / "saved-checkpoint.txt"
    code, out = run(url, con, "audrey", "audit", "checkpoint", "--out", str(saved))
    assert code == 0 and out == f"saved the checkpoint at tree size {con.gateway.ledger.size()} to {saved}\n", out
    assert saved.read_text() == con.gateway.ledger.latest_checkpoint()
    code, out = run(url, con, "mallory", "audit", "checkpoint", "--out", str(tmp_path / "no.txt"))
    assert code == 1 and out.startswith("Error: 403") and not (tmp_path / "no.txt").exists(), out
    verify = subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", "verify", "--data-dir",
                             str(con.gateway.settings.data_dir), "--trusted-checkpoint", str(saved)],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and "consistent with trusted checkpoint" in verify.stdout, verify.stderr


def test_policy_show(served: tuple[Console, str]) -> None:
    con, url = served
    code, out = run(url, con, "sam", "policy", "show", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["policy_hash"] and data["history"]
    code, out = run(url, con, "sam", "policy", "show")
    assert code == 0 and data["policy_hash"] in out


def test_approvals_list_and_show_say_what_is_approved(served: tuple[Console, str]) -> None:
    """The CLI prints the gateway's summary: the action with before → after, and who must still approve."""
    con, url = served
    job = submit(con)
    approval_id = con.api("POST", f"/v1/jobs/{job}/priority", "carol",
                          json={"priority": 900, "reason": "release blocker"}).json()["approval_id"]
    code, out = run(url, con, "alice", "approvals", "show", approval_id)
    assert code == 0, out
    lines = out.splitlines()
    assert f"  what: set the priority of job {job} from 520 to 900" in lines, out
    assert f"    job {job} (train, owner alice): priority 520 → 900" in lines, out
    assert "  still needed: one more: alice, or a queue admin or on-call in vision (not carol, who asked)" in lines
    code, out = run(url, con, "alice", "approvals", "list")
    assert code == 0, out
    (row,) = [line for line in out.splitlines() if line.startswith(approval_id)]
    assert "  priority 520 → 900  " in row, out
