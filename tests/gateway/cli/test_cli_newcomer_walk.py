"""What the README's three newcomers type, run through the real CLI against a real gateway (uvicorn on a socket).

A researcher lowers her waiting job's priority, takes that back, pauses and resumes it; on-call files a stop of
someone else's job and is told whom to hand the approval to; a workload for an emergency stop is named at submit.
None of these had a command (only API routes whose bodies were in /docs), `job submit` could not name a workload,
and the answers did not say who may confirm or printed Python reprs.
"""

from __future__ import annotations

from typing import Any

import pytest
from cli_testkit import jobgate
from click.testing import CliRunner
from gateway_testkit import Api, job_spec

from gateway.cli.approvals import _summary
from gateway.cli.emergency import _print
from gateway.cli.main import cli
from gateway.native.scheduler_loop import run_once

SQLITE = pytest.mark.parametrize("settings", ["sqlite"], indirect=True)  # the CLI only speaks HTTP


def priority_parts(api: Api, job_id: str) -> dict[str, Any]:
    r = api.get(f"/v1/jobs/{job_id}/queue", "alice")
    assert r.status_code == 200, r.text
    return dict(r.json()["priority"])


def waiting_job(api: Api) -> str:
    """A job of alice's that waits, with its priority parts worked out by a scheduler cycle."""
    r = api.post("/v1/jobs", "alice", json=job_spec())
    assert r.status_code == 201, r.text
    run_once(api.gateway)
    job = str(r.json()["id"])
    assert api.get(f"/v1/jobs/{job}", "alice").json()["state"] == "pending"
    return job


@SQLITE
def test_researcher_lowers_then_restores_her_priority(api: Api, url: str) -> None:
    job = waiting_job(api)
    before = priority_parts(api, job)["effective"]
    code, out = jobgate(url, api, "alice", "job", "priority", job, "100")
    assert code == 0 and f"{job}: priority {before:.1f} -> 100.0" in out, out
    assert priority_parts(api, job)["parts"]["manual"] < -100

    code, out = jobgate(url, api, "alice", "job", "priority", job, "--restore")
    assert code == 0 and "-> 100.0" not in out and f"100.0 -> {before:.1f}" in out, out
    assert abs(priority_parts(api, job)["parts"].get("manual") or 0.0) < 0.005

    code, out = jobgate(url, api, "alice", "job", "priority", job, "--restore")
    assert code == 0 and "nothing to restore" in out, out
    code, out = jobgate(url, api, "alice", "job", "priority", job, "1", "--restore")
    assert code == 2 and "give VALUE or --restore, not both" in out, out
    code, out = jobgate(url, api, "alice", "job", "priority", job)
    assert code == 0 and f"{job}: priority {before:.1f}; the scheduler alone gives it {before:.1f}" in out, out


@SQLITE
def test_researcher_pauses_and_resumes_her_job(api: Api, url: str) -> None:
    job = waiting_job(api)
    code, out = jobgate(url, api, "alice", "job", "pause", job, "--reason", "fix the data loader")
    assert code == 0 and f"\n{job}: paused  [decision recorded at ledger seq " in "\n" + out, out
    assert api.get(f"/v1/jobs/{job}", "alice").json()["state"] == "paused"
    code, out = jobgate(url, api, "alice", "job", "resume", job)
    assert code == 0 and f"\n{job}: pending  [decision recorded" in "\n" + out, out
    assert f"`jobgate job why {job}`" in out


@SQLITE
def test_submit_names_the_workload_an_emergency_stop_selects(api: Api, url: str) -> None:
    code, out = jobgate(
        url,
        api,
        "alice",
        "job",
        "submit",
        "--name",
        "s1",
        "--project",
        "vision",
        "--workload",
        "lr-sweep",
        "--json",
        "--",
        "true",
    )
    assert code == 0, out
    assert '"workload": "lr-sweep"' in out


@SQLITE
def test_a_stop_of_anothers_job_says_who_may_confirm(api: Api, url: str) -> None:
    job = waiting_job(api)
    code, out = jobgate(url, api, "dave", "job", "stop", job, "--reason", "runaway job filling scratch")
    assert code == 0, out
    assert "nothing changes until a second person (alice, or someone holding" in out, out
    assert "cluster-wide) runs `jobgate approve apr-" in out, out


@SQLITE
def test_a_quota_change_is_approved_by_the_demos_second_platform_admin(api: Api, url: str) -> None:
    """A7 needs a second platform admin, and the demo had one (erin): no quota change could ever be approved."""
    code, out = jobgate(url, api, "erin", "quota", "set", "vision", "--gpus", "16", "--reason", "vision deadline week")
    assert code == 0 and "needs a second platform admin: approval apr-" in out, out
    approval = out.rsplit("approval ", 1)[1].split()[0]
    code, out = jobgate(url, api, "frank", "approve", approval)
    assert code == 0 and "[executed]" in out, out
    quotas = api.get("/v1/quotas", "frank").json()["quotas"]
    assert [q["gpus"] for q in quotas if q["project"] == "vision"] == [16], quotas


@SQLITE
def test_a_token_cut_to_the_end_of_the_one_that_made_it_says_so(api: Api, url: str) -> None:
    """The README's `token create --for sweep-bot ... --days 30`, run with a demo token (itself 30 days, made
    earlier), printed an expiry a little short of the 30 days asked for, and nothing said why."""
    code, out = jobgate(url, api, "alice", "token", "create", "--for", "ci-bot", "--project", "vision",
                        "--action", "job.submit", "--purpose", "lr sweep", "--days", "30")
    assert code == 0, out
    note = next(line for line in out.splitlines() if line.startswith("note: "))
    assert "its lifetime was cut to that end (asked: --days 30, until " in note, out
    assert "a token ends no later than the token that made it, and tok-" in note and note.endswith(" expires then")
    code, out = jobgate(url, api, "alice", "token", "create", "--project", "vision", "--purpose", "a day",
                        "--days", "1")
    assert code == 0 and "note: " not in out, out


def test_a_skipped_target_reads_as_words() -> None:
    a = {
        "id": "apr-1",
        "action": "job.stop",
        "state": "executed",
        "requester": "dave",
        "requester_real": "dave",
        "targets": ["j-1"],
        "reason": "runaway",
        "expires_at": "t",
        "approvals": [{"by": "carol"}],
        "resolution": {"skipped": [{"id": "j-1", "state": "stopped"}]},
    }
    assert "  skipped (ended meanwhile): j-1 (stopped)" in _summary(a).splitlines()


def test_an_emergency_stop_waiting_for_approval_says_who_and_what_next(capsys: pytest.CaptureFixture[str]) -> None:
    es = {
        "id": "es-1",
        "state": "pending_approval",
        "trigger": "safety",
        "grace_seconds": 0,
        "scope": {"kind": "workload", "value": "lr-sweep"},
        "requested_by": "dave",
        "deciders": ["dave"],
        "approval_id": "apr-9",
        "jobs": [],
        "summary": {},
    }
    _print(es)
    out = capsys.readouterr().out
    assert "other of the on-call and security-reviewer roles runs `jobgate approve apr-9`" in out, out
    assert "`jobgate emergency-stop show es-1 --watch`" in out, out


def test_break_glass_help_says_action_repeats() -> None:
    out = CliRunner().invoke(cli, ["break-glass", "request", "--help"]).output
    assert "repeatable" in out.split("--action", 1)[1].split("--minutes", 1)[0], out
