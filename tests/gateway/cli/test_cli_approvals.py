"""`jobgate approvals list|show`: the second person sees what they are asked to confirm (M2): the target ids,
or for a request without targets (a quota change, break-glass) what it would do, and in `show` every field the
digest binds.

Answers come from the canned HTTP server of test_cli_newcomer_hints.py; the gateway's own answers (approvals.to_json)
are tested in test_approvals_api.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_testkit import Canned, run

IDS = [f"j-0000000000{i}aaaaaaaa" for i in range(5)]


def approval(**over: Any) -> dict[str, Any]:
    """An approval as GET /v1/approvals/{id} answers it (gateway/decisions/approvals.py to_json)."""
    return {
        "id": "apr-1", "action": "job.stop", "state": "pending", "targets": IDS, "project": "vision",
        "params": {"blast_radius": {"jobs": 5, "gpus": 10}}, "reason": "runaway sweep", "ticket": "INC-7",
        "granularity": "selector", "digest": "9f" * 32, "requester": "carol", "requester_real": "carol",
        "created_at": "2025-01-01T10:00:00+00:00", "expires_at": "2025-01-01T11:00:00+00:00", "decision_seq": 41,
        "required": {"count": 1, "roles": ["queue_admin"], "projects": ["vision"], "principals": ["alice"]},
        "blast_radius": {"jobs": 5, "running": 3, "gpus": 10, "projects": ["vision"]},
        "approvals": [], "resolved_at": None, "resolved_by": None, "resolution": {},
        **over,
    }


QUOTA = approval(id="apr-2", action="quota.change", targets=[], granularity="job", blast_radius={},
                 params={"gpus": 64, "borrow_limit": 8, "lend_limit": None, "users": {}, "effective_from": None,
                         "effective_until": None,
                         "before": {"project": "vision", "gpus": 32, "borrow_limit": 8, "lend_limit": None,
                                    "users": {}, "effective_from": None, "effective_until": None,
                                    "updated_at": "2024-12-01T00:00:00+00:00", "updated_by": "pat"}})
BREAK_GLASS = approval(id="apr-3", action="breakglass.request", targets=[], project=None, granularity="job",
                       blast_radius={},
                       params={"projects": ["vision"], "actions": ["job.stop.any"], "duration_seconds": 7200.0,
                               "max_uses": 3, "grant_id": "bg-1"})


def test_list_names_the_targets_or_what_a_request_without_them_does(canned: Canned) -> None:
    one = approval(id="apr-4", targets=["j-solo"])
    canned.answers[("GET", "/v1/approvals?state=pending")] = (200, {"approvals": [approval(), one, QUOTA,
                                                                                  BREAK_GLASS]})
    code, out = run(canned, "approvals", "list")
    assert code == 0, out
    head, *rows = out.splitlines()
    assert "TARGETS" in head.split() and "JOBS" not in head.split(), head
    assert f"{IDS[0]}, {IDS[1]} +3 more" in rows[0], out
    assert "j-solo  " in rows[1] and "more" not in rows[1], out
    assert "quota vision: gpus 32 -> 64  " in rows[2], out  # borrow_limit unchanged: not listed
    assert "break-glass for vision: job.stop.any, 2h, 3 use(s)  " in rows[3], out


def test_show_prints_every_field_the_second_person_confirms(canned: Canned) -> None:
    given = approval(approvals=[{"by": "dave", "at": "2025-01-01T10:05:00+00:00", "comment": "checked",
                                 "roles_by_project": {}}])
    canned.answers[("GET", "/v1/approvals/apr-1")] = (200, given)
    code, out = run(canned, "approvals", "show", "apr-1")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "apr-1  job.stop  [pending]"
    for line in [
        "  requested by carol at 2025-01-01T10:00:00+00:00; decision recorded at ledger seq 41",
        "  reason: runaway sweep  ticket: INC-7",
        "  project: vision, granularity: selector",
        "  targets (5):",
        *(f"    {i}" for i in IDS),  # every id, not the first few
        "  params:",
        '    blast_radius: {"gpus": 10, "jobs": 5}',
        "  blast radius: 5 job(s), 3 running, 10 GPU(s), project(s) vision",
        f"  digest: {'9f' * 32}",
        "  approvals so far: dave at 2025-01-01T10:05:00+00:00 (checked)",
        "  still required: 1 approval(s), from alice, or someone holding queue_admin in vision",
        "  expires 2025-01-01T11:00:00+00:00",
    ]:
        assert line in lines, out
    code, out = run(canned, "approvals", "show", "apr-1", "--json")
    assert code == 0 and json.loads(out) == given, out


@pytest.mark.parametrize(
    ("answer", "expect"),
    [
        (QUOTA, ["  targets: none; what: quota vision: gpus 32 -> 64", "    gpus: 64", "    lend_limit: null",
                 '    before: {"borrow_limit": 8, "effective_from": null, "effective_until": null, "gpus": 32,'
                 ' "lend_limit": null, "project": "vision", "updated_at": "2024-12-01T00:00:00+00:00",'
                 ' "updated_by": "pat", "users": {}}']),
        (BREAK_GLASS, ["  targets: none; what: break-glass for vision: job.stop.any, 2h, 3 use(s)",
                       '    actions: ["job.stop.any"]', "    duration_seconds: 7200.0", '    grant_id: "bg-1"',
                       "  blast radius: -", "  project: -, granularity: job"]),
        (approval(state="executed", required={"count": 0}, resolved_at="2025-01-01T10:06:00+00:00",
                  resolved_by="dave", resolution={"skipped": [{"id": IDS[4], "state": "succeeded"}]}),
         ["  executed at 2025-01-01T10:06:00+00:00 by dave (it would have expired 2025-01-01T11:00:00+00:00)",
          f"  skipped (ended meanwhile): {IDS[4]} (succeeded)"]),
    ],
    ids=["quota-change", "break-glass", "executed"],
)
def test_show_says_what_a_request_does(canned: Canned, answer: dict[str, Any], expect: list[str]) -> None:
    canned.answers[("GET", f"/v1/approvals/{answer['id']}")] = (200, answer)
    code, out = run(canned, "approvals", "show", answer["id"])
    assert code == 0, out
    assert all(line in out.splitlines() for line in expect), out
    assert ("still required" in out) == (answer["state"] == "pending"), out


def test_no_reason_or_parameter_can_draw_lines_of_its_own(canned: Canned) -> None:
    """The requester writes the reason and some parameters: a newline in them must not fake a target line."""
    # A job's name is its submitter's text too, and the gateway's summary quotes it.
    named = "train\n  still needed: none"
    forged = approval(targets=["j-harmless"], ticket=None, reason="tidy up\n  targets (1):\n    j-harmless",
                      params={"trigger": "pager\n    j-other"},
                      summary={"what": "stop job j-harmless", "short": f"stop {named}",
                               "still_needed": "one more: alice",
                               "changes": [{"text": f"job j-harmless ({named}, owner alice): running → stopped"}]})
    canned.answers[("GET", "/v1/approvals/apr-1")] = (200, forged)
    canned.answers[("GET", "/v1/approvals?state=pending")] = (200, {"approvals": [forged]})
    code, out = run(canned, "approvals", "show", "apr-1")
    assert code == 0, out
    assert '  reason: "tidy up\\n  targets (1):\\n    j-harmless"' in out.splitlines(), out
    assert '    trigger: "pager\\n    j-other"' in out.splitlines(), out
    lines = out.splitlines()
    assert [x for x in lines if x.startswith("  targets")] == ["  targets (1):"] and "    j-other" not in lines, out
    assert [x for x in lines if x.startswith("  still needed")] == ["  still needed: one more: alice"], out
    assert '    "job j-harmless (train\\n  still needed: none, owner alice): running \\u2192 stopped"' in lines, out
    code, out = run(canned, "approvals", "list")
    assert code == 0 and len(out.splitlines()) == 2, out
