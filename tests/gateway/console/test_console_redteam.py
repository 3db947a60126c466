"""Red-team tests of the console: what another site (or a string an attacker wrote) can make it do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from console_browser_kit import browser
from console_testkit import Console, submit


@pytest.fixture
def other_site() -> Iterator[tuple[str, dict[str, str]]]:
    """Another web server on the same host (so the same site for cookies, another origin): it serves the
    HTML put in the returned dict under its path."""
    pages: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def _pending_approval(console: Console) -> str:
    """carol files a stop of alice's job; alice is the second person who may approve it."""
    job = submit(console)
    carol, csrf = console.sign_in("carol")
    r = carol.post(f"/ui/jobs/{job}/stop", data={"reason": "queue hog", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/approvals/apr-"), r.text
    return str(r.headers["location"].rsplit("/", 1)[1])


def test_console_pages_forbid_framing_and_scripts(console: Console) -> None:
    approval = _pending_approval(console)
    alice, _ = console.sign_in("alice")
    anonymous = console.browser()
    for client, path in (
        (anonymous, "/ui/login"),
        (alice, "/ui/"),
        (alice, f"/ui/approvals/{approval}"),
        (alice, "/ui/approvals/apr-none"),
        (alice, "/ui/ledger"),
    ):
        r = client.get(path)
        assert r.headers["content-type"].startswith("text/html"), path
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "script-src" not in csp, path
        assert r.headers.get("x-frame-options") == "DENY" and r.headers.get("x-content-type-options") == "nosniff"
        assert r.headers.get("cache-control") == "no-store", path


def test_console_errors_and_unknown_pages_forbid_framing_too(console: Console) -> None:
    """The headers came from the pages' route class, so a 404 for a path no page serves, and an error a page
    raised, went out without them: framable, and cached after sign-out."""
    approval = _pending_approval(console)
    alice, csrf = console.sign_in("alice")
    for r in (
        console.browser().get("/ui/no-such-page"),
        alice.post(f"/ui/approvals/{approval}/reject", data={"reason": "x", "csrf": csrf}, follow_redirects=False),
    ):
        assert r.status_code in (404, 422), r.text
        assert r.headers.get("x-frame-options") == "DENY", r.status_code
        assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", ""), r.status_code
        assert r.headers.get("cache-control") == "no-store", r.status_code


@pytest.mark.parametrize("console", ["sqlite"], indirect=True)
def test_another_site_cannot_frame_the_approve_button(
    console: Console, served: str, other_site: tuple[str, dict[str, str]]
) -> None:
    """Clickjacking: a page on another port of the same host (same site, so the SameSite=Strict cookie
    goes along) frames alice's approval under a decoy. Chromium must refuse to show the console inside."""
    approval = _pending_approval(console)
    site, pages = other_site
    pages["/prize.html"] = (
        f'<p>Click to win</p><iframe id="f" src="{served}/ui/approvals/{approval}"'
        ' onload="document.title = \'framed\'" width="900" height="700"></iframe>'
    )
    with browser() as b:
        page = b.new_page()  # type: ignore[attr-defined]
        page.goto(served + "/ui/login")
        page.fill("input[name=token]", console.tokens["alice"])
        page.click("button[type=submit]")
        page.wait_for_selector("#me")
        assert page.locator(f"#{approval} button[name=approve]").count() == 0  # home page; then her inbox:
        page.goto(f"{served}/ui/approvals/{approval}")
        assert page.locator("button[name=approve]").count() == 1

        page.goto(site + "/prize.html")
        page.wait_for_function("document.title === 'framed'")
        framed = page.frame_locator("#f")
        assert framed.locator("button[name=approve]").count() == 0
        assert framed.locator("#me").count() == 0
    r = console.api("GET", f"/v1/approvals/{approval}", "alice")
    assert r.json()["state"] == "pending"


def test_cross_project_approval_shows_each_approver_only_the_jobs_she_may_view(console: Console) -> None:
    """dave stops a job of alice (vision) and one of mallory (speech) in one batch; each owner is asked.
    mallory may not view vision's jobs (A1): the API gives her the other target's id only, and so must
    the console, not its name, state or size."""
    vision = submit(console, name="alice-secret-run")
    speech = submit(console, "mallory", project="speech", name="mallory-run", gpus_per_node=3)
    r = console.api("POST", "/v1/jobs:stop", "dave", json={"ids": [vision, speech], "reason": "incident 42"})
    assert r.status_code == 202 and r.json()["decision"]["effect"] == "needs_approval", r.text
    assert console.api("GET", f"/v1/jobs/{vision}", "mallory").status_code == 403
    approval = console.api("GET", "/v1/approvals", "mallory").json()["approvals"][0]
    assert "alice-secret-run" not in str(approval)

    mallory, _ = console.sign_in("mallory")
    for path in ("/ui/approvals", f"/ui/approvals/{approval['id']}"):
        page = mallory.get(path).text
        assert "mallory-run" in page and "alice-secret-run" not in page, path
        assert f'href="/ui/jobs/{vision}"' not in page and vision in page, path
        assert "a job of project vision, which you may not view" in page, path
    # alice is a member of vision, not speech: the mirror image.
    alice, _ = console.sign_in("alice")
    page = alice.get(f"/ui/approvals/{approval['id']}").text
    assert "alice-secret-run" in page and "mallory-run" not in page
    # The auditor and dave, who may view both projects, see both.
    for who in ("dave", "audrey"):
        c, _ = console.sign_in(who)
        page = c.get(f"/ui/approvals/{approval['id']}").text
        assert "alice-secret-run" in page and "mallory-run" in page, who


def test_console_answers_are_bounded_like_the_apis(console: Console) -> None:
    """The API takes an approval comment or a rejection reason of at most 2000 characters; the console's
    forms wrote whatever came (up to the 1 MiB body limit) into the signed ledger for ever."""
    approval = _pending_approval(console)
    alice, csrf = console.sign_in("alice")
    size = console.gateway.ledger.size()
    huge = "x" * 5000
    r = alice.post(f"/ui/approvals/{approval}/approve", data={"csrf": csrf, "comment": huge})
    assert r.status_code == 422 and "2000" in r.text
    r = alice.post(f"/ui/approvals/{approval}/reject", data={"csrf": csrf, "reason": huge})
    assert r.status_code == 422 and "2000" in r.text
    # Refused attempts in the ledger, without what the forms held (a form carries its CSRF token too).
    refused = console.gateway.ledger.entries(size, 100)
    assert [e.value["kind"] for e in refused] == ["refusal", "refusal"]
    assert not [e for e in refused if huge.encode() in e.raw or csrf.encode() in e.raw]
    assert console.api("GET", f"/v1/approvals/{approval}", "alice").json()["state"] == "pending"
    r = console.api("POST", f"/v1/approvals/{approval}/approve", "alice", json={"comment": huge})
    assert r.status_code == 422  # the same answer as the API's
    r = alice.post(f"/ui/approvals/{approval}/reject", data={"csrf": csrf, "reason": "not now"}, follow_redirects=False)
    assert r.status_code == 303
    assert console.api("GET", f"/v1/approvals/{approval}", "alice").json()["state"] == "rejected"


# (who, method, route, form without its CSRF token): refused to a signed-in person; the job is alice's, the approval
# carol's stop of it. The API's routes are tests/gateway/api/test_route_guard.py.
CONSOLE_REFUSALS = [
    ("alice", "GET", "/ui/admin", None),  # a check outside the policy
    ("alice", "GET", "/ui/ledger", None),  # the policy, asked without recording
    ("mallory", "GET", "/ui/jobs/{job_id}", None),
    ("mallory", "GET", "/ui/approvals/{approval_id}", None),
    ("mallory", "GET", "/ui/emergency/{emergency_id}", None),
    ("mallory", "POST", "/ui/jobs/{job_id}/stop", {"reason": "I need the GPUs"}),  # a policy decision
    ("carol", "POST", "/ui/approvals/{approval_id}/approve", {}),  # her own request: ledgered by approvals
    ("mallory", "POST", "/ui/notifications/{notification_id}/ack", {}),
]


@pytest.mark.parametrize("case", CONSOLE_REFUSALS, ids=[f"{c[1]} {c[2]} as {c[0]}" for c in CONSOLE_REFUSALS])
def test_a_console_refusal_is_one_ledger_entry_naming_the_person(console: Console,
                                                                 case: tuple[str, str, str, Any]) -> None:
    job = submit(console)
    approval = console.api("POST", f"/v1/jobs/{job}/stop", "carol", json={"reason": "queue hog"}).json()
    who, method, route, form = case
    c, csrf = console.sign_in(who)
    size = console.gateway.ledger.size()
    url = route.format(job_id=job, approval_id=approval["approval_id"], emergency_id="es-unknown",
                       notification_id="n-unknown")
    r = c.request(method, url, data=None if form is None else {**form, "csrf": csrf}, follow_redirects=False)
    assert 400 <= r.status_code < 500 and r.status_code != 401, r.text
    (entry,) = [e.value for e in console.gateway.ledger.entries(size, 100)]
    body = entry["body"]
    assert who in ((body.get("actor") or {}).get("id"), body.get("operator")), entry
    assert f"recorded in the ledger as entry {entry['seq']}" in r.text
    assert entry["kind"] != "refusal" or (body["asked"]["route"], body["refusal"]["status"]) == (route, r.status_code)
