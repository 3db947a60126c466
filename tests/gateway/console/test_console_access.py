"""What each person may see and do in the console: the same answers as the API, from the same pipeline."""

from __future__ import annotations

import re
from pathlib import Path

from console_testkit import Console, submit
from sqlalchemy import update

from gateway.store.models import Job


def test_researcher_cannot_see_admin_ledger_or_emergency_data(console: Console) -> None:
    submit(console)
    c, _ = console.sign_in("alice")
    home = c.get("/ui/").text
    assert 'href="/ui/admin"' not in home and 'href="/ui/ledger"' not in home
    for path, marker in (("/ui/admin", 'id="heatmap"'), ("/ui/ledger", 'id="entries"'),
                         ("/ui/ledger/0", 'id="verdict"'), ("/ui/emergency", "Emergency stops</h1>")):
        r = c.get(path)
        assert r.status_code == 403, path
        assert marker not in r.text, path
    r = c.get("/ui/ledger/export")
    assert r.status_code == 403 and r.headers["content-type"].startswith("text/html")
    # The JSON behind those pages refuses the same way.
    for path in ("/v1/stats/usage", "/v1/stats/waits", "/v1/stats/fragmentation", "/v1/stats/suggestions",
                 "/v1/audit/entries", "/v1/audit/entries/0"):
        r = console.api("GET", path, "alice")
        assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json", path


def test_admin_and_auditor_see_their_pages(console: Console) -> None:
    submit(console, gpus_per_node=4)
    erin, _ = console.sign_in("erin")
    page = erin.get("/ui/admin")
    assert page.status_code == 200
    assert 'id="heatmap"' in page.text and "vision" in page.text and "Fragmentation" in page.text
    audrey, _ = console.sign_in("audrey")
    assert audrey.get("/ui/admin").status_code == 403  # auditors read the ledger, not cluster admin data
    ledger = audrey.get("/ui/ledger")
    assert ledger.status_code == 200 and 'id="entries"' in ledger.text
    r = audrey.get("/ui/ledger/export")
    assert r.status_code == 200 and r.content.startswith(b'{"format": "jobgate-ledger-bundle/1"')


def test_console_refusal_is_the_policys_and_is_ledgered(console: Console) -> None:
    job = submit(console)
    c, csrf = console.sign_in("mallory")  # another tenant
    r = c.post(f"/ui/jobs/{job}/stop", data={"reason": "I need the GPUs", "csrf": csrf})
    assert r.status_code == 403
    m = re.search(r"recorded in the ledger as entry (\d+)", r.text)
    assert m, r.text
    # The page says why once (the detail), not again under "Reasons:", and names the rule that refused.
    assert r.text.count("holds no role in project vision that grants job.stop.any") == 1, r.text
    assert "Reasons:" not in r.text and "Policy rule: A4.no_capability" in r.text, r.text
    entry = console.gateway.ledger.entry(int(m.group(1))).value
    assert entry["body"]["actor"]["id"] == "mallory"
    assert entry["body"]["decision"]["effect"] == "deny"
    assert entry["body"]["source"]["via"] == "console"
    assert console.api("GET", f"/v1/jobs/{job}", "alice").json()["state"] == "pending"
    # Over a calls-per-minute limit the page answers as the API does: 429 with Retry-After, and ledgered.
    console.gateway.limiter.configure({"calls_per_minute_per_principal": 1})
    r = c.post(f"/ui/jobs/{job}/stop", data={"reason": "I need the GPUs", "csrf": csrf})
    assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60, r.text
    assert "may make 1 mutating calls per minute" in r.text and re.search(r"recorded in the ledger as entry", r.text)


def test_two_person_stop_through_the_console(console: Console) -> None:
    job = submit(console)
    carol, carol_csrf = console.sign_in("carol")
    r = carol.post(f"/ui/jobs/{job}/stop", data={"reason": "queue hog", "csrf": carol_csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/approvals/apr-")
    approval_id = r.headers["location"].rsplit("/", 1)[1]
    mine = carol.get(f"/ui/approvals/{approval_id}").text
    assert "a second person must approve it" in mine and 'name="approve"' not in mine
    # carol cannot approve her own request, even by posting the form by hand.
    r = carol.post(f"/ui/approvals/{approval_id}/approve", data={"csrf": carol_csrf})
    assert r.status_code == 403 and "second person" in r.text
    # alice (the owner) sees the exact target in her inbox and approves.
    alice, alice_csrf = console.sign_in("alice")
    inbox = alice.get("/ui/approvals").text
    assert approval_id in inbox and job in inbox and "queue hog" in inbox and "carol" in inbox
    r = alice.post(f"/ui/approvals/{approval_id}/approve", data={"csrf": alice_csrf, "comment": "fine"},
                   follow_redirects=False)
    assert r.status_code == 303
    assert console.api("GET", f"/v1/approvals/{approval_id}", "alice").json()["state"] == "executed"
    assert console.api("GET", f"/v1/jobs/{job}", "alice").json()["state"] == "stopped"
    # Approving again is refused with the API's reason.
    r = alice.post(f"/ui/approvals/{approval_id}/approve", data={"csrf": alice_csrf})
    assert r.status_code == 409 and "already executed" in r.text


def test_auditor_entry_page_verifies_the_inclusion_proof(console: Console) -> None:
    job = submit(console)
    found = console.api("GET", "/v1/audit/entries", "audrey", params={"job": job, "action": "job.submit"}).json()
    (hit,) = found["entries"]
    assert hit["actors"][0] == "alice" and hit["effect"] == "allow"
    detail = console.api("GET", f"/v1/audit/entries/{hit['seq']}", "audrey").json()
    assert detail["verified"] is True and detail["checkpoint_signature"] == "valid"
    assert detail["proof"]["leaf_index"] == hit["seq"] and detail["proof"]["tree_size"] == detail["checkpoint_size"]
    audrey, _ = console.sign_in("audrey")
    page = audrey.get(f"/ui/ledger/{hit['seq']}").text
    assert "verdict-ok" in page and "Inclusion proof verified" in page
    listing = audrey.get("/ui/ledger", params={"job": job, "action": "job.submit"}).text
    assert f'data-seq="{hit["seq"]}"' in listing
    assert audrey.get("/ui/ledger", params={"since": "yesterday"}).status_code == 422
    assert audrey.get("/ui/ledger/999999").status_code == 404


FIRST_SCREEN = re.compile(r'<section class="card first-screen" id="first-screen">(.*?)</section>', re.S)
CONTACT = re.compile(r'<span class="contact" data-role="([a-z_]+)"(?: data-project="([^"]+)")?>([^<]*)</span>')


def test_first_screen_says_what_not_to_do_how_to_ask_what_is_left_and_whom_to_contact(console: Console) -> None:
    """F5: the console opens, above the person's jobs, with what they must not do to others' jobs, how to ask
    for a preemption, what is left of a preempted job, and whom to contact: the people who hold those roles
    for that person's projects now, not names written into the page."""
    submit(console)
    alice, _ = console.sign_in("alice")
    home = alice.get("/ui/").text
    m = FIRST_SCREEN.search(home)
    assert m and m.start() < home.index('id="my-jobs"'), "the first screen comes before anything else"
    screen = m.group(1)
    for says in ("Leave other people's jobs alone", "Do not kill, signal or renice anyone else's processes",
                 "Need GPUs urgently?", "--queue urgent", "If your job is preempted or stopped",
                 "grace window", "checkpoint", "never deleted by a stop", "keeping its priority", "Whom to ask"):
        assert says in screen, says
    assert CONTACT.findall(screen) == [("queue_admin", "vision", "carol"), ("oncall", "", "dave"),
                                       ("security_reviewer", "", "sam")]
    mallory, _ = console.sign_in("mallory")  # project speech has no queue admin
    m = FIRST_SCREEN.search(mallory.get("/ui/").text)
    assert m
    screen = m.group(1)
    assert CONTACT.findall(screen) == [("queue_admin", "speech", "none yet: ask on-call"), ("oncall", "", "dave"),
                                       ("security_reviewer", "", "sam")]
    assert "carol" not in screen


def test_onboarding_doc_opens_with_the_same_four_answers() -> None:
    """F5: the onboarding doc (README.md) opens, within its first screen, with the same four answers."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text().splitlines()
    first = next(i for i, line in enumerate(readme) if line.startswith("## "))
    end = next(i for i, line in enumerate(readme) if i > first and line.startswith("## "))
    assert readme[first] == "## For researchers: read this first" and end <= 40
    section = "\n".join(readme[first:end])
    for lead in ("**What you must not do to other people's jobs.**", "**How to ask for a preemption.**",
                 "**What is left of your job after it is preempted or stopped.**", "**Whom to contact.**"):
        assert lead in section, lead


def test_notice_acknowledged_from_the_console_is_the_ledgered_receipt(console: Console) -> None:
    job = submit(console)
    r = console.api("POST", f"/v1/jobs/{job}/stop", "carol", json={"reason": "queue hog"})
    approval_id = r.json()["approval_id"]
    assert console.api("POST", f"/v1/approvals/{approval_id}/approve", "dave").json()["state"] == "executed"
    alice, csrf = console.sign_in("alice")
    home = alice.get("/ui/").text
    m = re.search(r'action="/ui/notifications/([^/"]+)/ack"', home)
    assert m, "alice has a notice that asks for a receipt"
    assert alice.post(f"/ui/notifications/{m.group(1)}/ack", data={}).status_code == 403
    assert alice.post(f"/ui/notifications/{m.group(1)}/ack", data={"csrf": csrf}).status_code == 200
    notes = console.api("GET", "/v1/notifications", "alice").json()["notifications"]
    assert next(n for n in notes if n["id"] == m.group(1))["receipt"] == "acknowledged"


def test_emergency_stop_page_shows_per_job_progress_and_refreshes_until_done(console: Console) -> None:
    running, queued = submit(console), submit(console)
    gw = console.gateway
    with gw.transaction() as session:  # stand in for the scheduler: one job runs on a node
        session.execute(update(Job).where(Job.id == running).values(
            state="running", started_at=gw.clock(), placement=[{"node": "demo-node-1", "gpus": [0, 1]}]))
    ids = []
    for job in (running, queued):
        r = console.api("POST", "/v1/emergency-stops", "dave", json={
            "scope": {"kind": "job", "value": job}, "trigger": "safety", "reason": "unsafe outputs"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    dave, _ = console.sign_in("dave")
    listing = dave.get("/ui/emergency")
    assert listing.status_code == 200 and all(i in listing.text for i in ids)
    live = dave.get(f"/ui/emergency/{ids[0]}").text
    assert running in live and "in progress" in live and 'http-equiv="refresh"' in live
    done = dave.get(f"/ui/emergency/{ids[1]}").text
    assert queued in done and "cancelled" in done and 'http-equiv="refresh"' not in done
    alice, _ = console.sign_in("alice")
    assert alice.get(f"/ui/emergency/{ids[0]}").status_code == 403


def test_emergency_stop_page_says_whether_the_scope_is_held(console: Console) -> None:
    submit(console, workload="sweep-7")
    r = console.api("POST", "/v1/emergency-stops", "dave", json={
        "scope": {"kind": "workload", "value": "sweep-7"}, "trigger": "security", "reason": "leaked keys"})
    es = r.json()
    dave, _ = console.sign_in("dave")
    assert "from when the stop is carried out" in dave.get(f"/ui/emergency/{es['id']}").text
    assert console.api("POST", f"/v1/approvals/{es['approval_id']}/approve", "sam").status_code == 200
    page = dave.get(f"/ui/emergency/{es['id']}").text
    assert "<strong>in force</strong>" in page and f"jobgate emergency-stop lift {es['id']}" in page
    assert "<td>in force</td>" in dave.get("/ui/emergency").text
    assert console.api("POST", f"/v1/emergency-stops/{es['id']}/lift", "sam", json={"reason": "keys rotated"}
                       ).status_code == 200
    assert "by sam: “keys rotated”" in dave.get(f"/ui/emergency/{es['id']}").text
