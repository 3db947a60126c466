"""`jobgate job show|list`: a stop's evidence reads as words, and a state filter with a typo is an error.

Answers come from the canned HTTP server of test_cli_newcomer_hints.py; the gateway's own answers are tested in
test_jobs_api.py and test_stop_lifecycle.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from cli_testkit import Canned, run


def stopped_job(evidence: dict[str, Any]) -> dict[str, Any]:
    """A stopped job as GET /v1/jobs/{id} answers it, with one node's stop evidence."""
    return {
        "id": "j-1", "name": "train", "project": "vision", "queue": "normal", "state": "stopped",
        "state_reason": "forced", "nodes": 1, "gpus_per_node": 2, "placement": [], "command": ["python", "t.py"],
        "ownership": {"creator": "alice", "creator_kind": "person", "owner": "alice",
                      "beneficiary_project": "vision", "rights_holder": "vision", "external_rights": False},
        "stop_request": {"by": "carol", "at": "2025-01-01T10:00:00+00:00", "reason": "urgent eval"},
        "outcome": "forced", "exit_code": None, "evidence": {"nodes": {"node-1": evidence}},
    }


@pytest.mark.parametrize(
    ("evidence", "line"),
    [
        ({"signal": "SIGTERM", "signal_sent_at": 1735725600, "exit_code": None, "exit_signal": "SIGKILL",
          "process_group_gone": True},
         "  evidence from node-1: SIGTERM sent at 2025-01-01T10:00:00+00:00, ended by SIGKILL,"
         " process group gone: yes"),
        ({"signal": "SIGTERM", "signal_sent_at": 1735725600, "exit_code": 143, "exit_signal": None,
          "process_group_gone": False},
         "  evidence from node-1: SIGTERM sent at 2025-01-01T10:00:00+00:00, exit code 143, process group gone: no"),
        ({"process_group_gone": True, "note": "not running on this node", "exit_code": None},
         "  evidence from node-1: no signal sent, exit status unknown, process group gone: yes"
         " (not running on this node)"),
        ({"signal": "SIGTERM", "signal_sent_at": 1735725600, "exit_code": None, "exit_signal": None},
         "  evidence from node-1: SIGTERM sent at 2025-01-01T10:00:00+00:00, exit status unknown,"
         " process group gone: unknown"),
    ],
    ids=["killed", "exited", "agent-had-no-process", "nothing-known"],
)
def test_stop_evidence_reads_as_words(canned: Canned, evidence: dict[str, Any], line: str) -> None:
    canned.answers[("GET", "/v1/jobs/j-1")] = (200, stopped_job(evidence))
    code, out = run(canned, "job", "show", "j-1")
    assert code == 0, out
    assert line in out.splitlines(), out
    assert "True" not in out and "False" not in out and "None" not in out, out


def test_list_refuses_a_state_no_job_can_be_in(canned: Canned) -> None:
    """A typo used to list nothing and exit 0, as if no job were running."""
    canned.answers[("GET", "/v1/jobs?state=running")] = (200, {"jobs": []})
    code, out = run(canned, "job", "list", "--state", "running")
    assert (code, out) == (0, "(none)\n")
    code, out = run(canned, "job", "list", "--state", "runing")
    assert code == 2, out
    assert "Invalid value for '--state': 'runing' is not one of 'pending', 'starting', 'running'" in out, out



@pytest.mark.parametrize(
    ("kept", "line"),
    [
        ({"tier": "normal", "state": "kept", "keep_until": None, "until_next_job_on_quota": "vision"},
         "  checkpoints: kept (normal tier) until the next job on quota vision starts"),
        ({"tier": "important", "state": "kept", "keep_until": "2025-01-15T10:00:00+00:00"},
         "  checkpoints: kept (important tier) until 2025-01-15T10:00:00+00:00"),
        ({"tier": "normal", "state": "cleaned", "cleaned_at": "2025-01-02T08:00:00+00:00"},
         "  checkpoints: removed from the nodes at 2025-01-02T08:00:00+00:00 (normal tier retention ended)"),
    ],
    ids=["until-next-job", "until-a-date", "removed"],
)
def test_show_says_whether_the_checkpoints_are_still_kept(canned: Canned, kept: dict[str, Any],
                                                           line: str) -> None:
    """The checkpoints listed as stop evidence read as still there after retention had removed them."""
    evidence = {"signal": "SIGTERM", "signal_sent_at": 1735725600, "exit_code": 0, "process_group_gone": True,
                "checkpoints": [{"path": "checkpoints/last.ckpt", "size": 7, "sha256": "9a" * 32}]}
    canned.answers[("GET", "/v1/jobs/j-1")] = (200, {**stopped_job(evidence), "checkpoint_retention": kept})
    code, out = run(canned, "job", "show", "j-1")
    assert code == 0 and line in out.splitlines(), out
    assert "sha256 " + "9a" * 32 in out  # whole, to compare with the file


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["job", "submit", "--name", "t", "--project", "vision", "--gpus", "0", "--", "true"], "'--gpus'"),
        (["job", "submit", "--name", "t", "--project", "vision", "--grace", "-1", "--", "true"], "'--grace'"),
        (["job", "submit", "--name", "t", "--project", "vision", "--signal", "SIGFOO", "--", "true"], "'--signal'"),
        (["break-glass", "request", "--project", "vision", "--action", "job.stop", "--minutes", "300",
          "--reason", "the pager went off", "--ticket", "INC-1"], "'--minutes'"),
    ],
    ids=["gpus", "grace", "signal", "minutes"],
)
def test_an_option_out_of_the_apis_bounds_is_named_as_typed(args: list[str], said: str) -> None:
    """These reached the gateway and came back as `422 gpus_per_node: ...`, a field the user never typed."""
    code, out = run(None, *args)
    assert code == 2 and said in out and "422" not in out, out


def test_on_call_confirms_a_stop_from_the_command_line(canned: Canned) -> None:
    """`jobgate nodes` told on-call to confirm with a curl to POST /v1/jobs/ID/confirm-stopped."""
    job = {**stopped_job({}), "state": "stopped", "outcome": "confirmed"}
    canned.answers[("POST", "/v1/jobs/j-1/confirm-stopped")] = (200, {"job": job, "decision": {"ledger_seq": 41}})
    code, out = run(canned, "job", "confirm-stopped", "j-1", "--reason", "node power-cycled, GPUs idle")
    assert (code, out) == (0, "j-1: stopped (confirmed)  [decision recorded at ledger seq 41]\n"), out
    code, out = run(None, "job", "confirm-stopped", "j-1")
    assert code == 2 and "Missing option '--reason'" in out, out
