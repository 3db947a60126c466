"""The console shows an owner's priority change as the API decided it (A2 within the owner's ceiling, A3 above it):
the ledger entry, the approval a queue admin's own raise opens (approved from the console), and a what-if that
replays these decisions without a flip."""

from __future__ import annotations

import re

from console_testkit import Console, submit


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
