"""The console shows an owner's priority change as the API decided it (A2 within the owner's ceiling, A3 above it):
the ledger entry, the approval a queue admin's own raise opens (approved from the console), and a what-if that
replays these decisions without a flip."""

from __future__ import annotations

import re

from console_testkit import Console, links_and_forms, submit
from sqlalchemy import update

from gateway.store.scheduler_tables import SchedJob


def test_console_shows_the_decisions_of_owners_priority_changes(console: Console) -> None:
    mine = submit(console)
    effective = console.api("GET", f"/v1/jobs/{mine}/queue", "alice").json()["priority"]["effective"]
    refused = console.api("POST", f"/v1/jobs/{mine}/priority", "alice", json={"priority": 1_000_000})
    assert refused.status_code == 403 and refused.json()["rules"] == ["A2.raise_needs_admin"], refused.text
    lowered = console.api("POST", f"/v1/jobs/{mine}/priority", "alice", json={"priority": effective - 50})
    assert lowered.status_code == 200, lowered.text
    admins = submit(console, who="carol")
    asked = console.api(
        "POST", f"/v1/jobs/{admins}/priority", "carol", json={"priority": effective + 500, "reason": "release blocker"}
    )
    assert asked.status_code == 202 and asked.json()["decision"]["rules"] == ["A3.own_raise"], asked.text

    auditor, _ = console.sign_in("audrey")
    entry = auditor.get(f"/ui/ledger/{refused.json()['ledger_seq']}").text
    assert "A2.raise_needs_admin" in entry and "unadjusted_priority" in entry, entry
    assert f"alice may set their own job {mine} at most to" in entry

    dave, csrf = console.sign_in("dave")
    approval_id = asked.json()["approval_id"]
    page = dave.get(f"/ui/approvals/{approval_id}").text
    assert 'data-state="pending"' in page and "release blocker" in page and 'name="approve"' in page
    done = dave.post(f"/ui/approvals/{approval_id}/approve", data={"csrf": csrf, "comment": "ok"})
    assert done.status_code == 200 and 'data-state="executed"' in done.text, done.text
    queue = console.api("GET", f"/v1/jobs/{admins}/queue", "carol").json()
    assert queue["priority"]["effective"] == effective + 500

    sam, sam_csrf = console.sign_in("sam")
    page = sam.post("/ui/policy/whatif", data={"csrf": sam_csrf})
    summary = re.search(r'id="whatif-summary">(\d+) of (\d+) decisions flip', page.text)
    assert summary and summary.group(1) == "0" and int(summary.group(2)) >= 6, page.text


def test_researcher_sets_priority_pauses_and_resumes_from_her_pages(console: Console) -> None:
    """README's console table: my jobs (and each job's page) offer priority, pause and resume, posted through the
    API's services with CSRF, decided and ledgered as the API's are, with the figures rounded for people."""
    job = submit(console)
    gw = console.gateway
    with gw.transaction() as session:  # a figure as aging leaves it
        session.execute(update(SchedJob).where(SchedJob.job_id == job).values(
            priority=570.0491041888889, parts={"baseline": 550.0, "aging": 20.0491041888889, "manual": 0.0,
                                               "total": 570.0491041888889}))
    alice, csrf = console.sign_in("alice")
    for page in ("/ui/", f"/ui/jobs/{job}"):
        html = alice.get(page).text
        _, forms = links_and_forms(html)
        assert {f.action for f in forms} >= {f"/ui/jobs/{job}/priority", f"/ui/jobs/{job}/pause",
                                             f"/ui/jobs/{job}/stop"}, page
        assert f"/ui/jobs/{job}/resume" not in {f.action for f in forms}, page  # not paused
        assert "570.05" in html and "570.049" not in html, page
        assert 'max="570.04"' in html and "You may set it up to 570.04 yourself" in html, page

    # Without the session's CSRF token nothing is decided: the refusal is the one entry it adds.
    size = gw.ledger.size()
    assert alice.post(f"/ui/jobs/{job}/priority", data={"priority": "500"}).status_code == 403
    assert [e.value["kind"] for e in gw.ledger.entries(size, 10)] == ["refusal"]
    size = gw.ledger.size()
    # Above what she may set alone: the policy's refusal, its figure rounded down to one she may set.
    r = alice.post(f"/ui/jobs/{job}/priority", data={"csrf": csrf, "priority": "900"})
    assert r.status_code == 403 and f"alice may set their own job {job} at most to 570.04 " in r.text, r.text
    assert alice.post(f"/ui/jobs/{job}/priority", data={"csrf": csrf, "priority": "lots"}).status_code == 422
    # Give way, then take it back.
    r = alice.post(f"/ui/jobs/{job}/priority", data={"csrf": csrf, "priority": "500", "reason": "after bob"},
                   follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{job}"
    assert console.api("GET", f"/v1/jobs/{job}/queue", "alice").json()["priority"]["effective"] == 500
    page = alice.get(f"/ui/jobs/{job}").text
    assert 'name="restore"' in page and "Back to what the scheduler gives it (570.05)" in page
    assert alice.post(f"/ui/jobs/{job}/priority", data={"csrf": csrf, "restore": "1"}).status_code == 200
    assert console.api("GET", f"/v1/jobs/{job}/queue", "alice").json()["priority"]["effective"] == 570.049
    changed = [e.value["body"] for e in gw.ledger.entries(size, gw.ledger.size() - size)
               if e.value["kind"] == "decision" and e.value["body"]["input"]["action"] == "job.priority"]
    assert [c["decision"]["effect"] for c in changed] == ["deny", "allow", "allow"]
    assert {c["source"]["via"] for c in changed} == {"console"}

    # Pause (a queued job is paused at once), then resume: back in its queue.
    assert alice.post(f"/ui/jobs/{job}/pause", data={"csrf": csrf, "reason": "x"}).status_code == 422
    r = alice.post(f"/ui/jobs/{job}/pause", data={"csrf": csrf, "reason": "fix the data loader"})
    assert r.status_code == 200 and 'id="job-state">paused<' in r.text, r.text
    _, forms = links_and_forms(r.text)
    assert f"/ui/jobs/{job}/resume" in {f.action for f in forms}
    assert f"/ui/jobs/{job}/pause" not in {f.action for f in forms}
    r = alice.post(f"/ui/jobs/{job}/resume", data={"csrf": csrf})
    assert r.status_code == 200 and 'id="job-state">pending<' in r.text, r.text
    # bob works in vision too and may see the job, but not change it: no control is offered him.
    bob, _ = console.sign_in("bob")
    _, forms = links_and_forms(bob.get(f"/ui/jobs/{job}").text)
    assert [f.action for f in forms if f.action.startswith("/ui/jobs/")] == []


def test_the_second_person_sees_the_value_they_are_asked_to_approve(console: Console) -> None:
    """Issue 30: carol asks to set alice's job to 900; alice's inbox and the request's page showed no 900, and who
    must still approve as JSON. Both now say what changes, from what to what, and who is still needed, in words."""
    job = submit(console)
    asked = console.api("POST", f"/v1/jobs/{job}/priority", "carol",
                        json={"priority": 900, "reason": "release blocker"})
    assert asked.status_code == 202, asked.text
    approval_id = asked.json()["approval_id"]
    alice, _ = console.sign_in("alice")
    for page in (alice.get("/ui/approvals").text, alice.get(f"/ui/approvals/{approval_id}").text):
        card = page[page.index(f'id="{approval_id}"'):]
        assert f"set the priority of job {job} from 520 to 900" in card
        assert f"job {job} (train, owner alice): priority 520 → 900" in card
        assert "one more: alice, or a queue admin or on-call in vision (not carol, who asked)" in card
        assert "&#34;count&#34;" not in card and '"count"' not in card  # no JSON where a sentence belongs
