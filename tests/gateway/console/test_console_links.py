"""The console shows nobody a link or a form that answers them 403: what a page offers is derived from the check
the page behind it makes, so a person never walks into a refusal the console could have known about.

One table: every persona of the demo cast × every kind of page, with jobs in each state a form depends on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from console_testkit import Console, links_and_forms, submit
from fastapi.testclient import TestClient
from sqlalchemy import update

from gateway.store.models import Allocation, Job

PERSONAS = ("alice", "bob", "carol", "dave", "erin", "sam", "audrey", "mallory")
PAGES = ("/ui/", "/ui/jobs/{pending}", "/ui/jobs/{running}", "/ui/jobs/{paused}", "/ui/jobs/{speech}",
         "/ui/approvals", "/ui/approvals?state=all", "/ui/admin", "/ui/emergency", "/ui/emergency/{emergency}",
         "/ui/policy", "/ui/ledger", "/ui/ledger/{seq}")
REASON = "checking what the console offers"


def _jobs(con: Console) -> dict[str, str]:
    """alice's jobs waiting, running (placed on a node) and paused; mallory's in project speech."""
    gw = con.gateway
    ids = {"pending": submit(con), "running": submit(con), "paused": submit(con),
           "speech": submit(con, "mallory", project="speech")}
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == ids["running"]).values(
            state="running", started_at=gw.clock(), placement=[{"node": "demo-node-1", "gpus": [0, 1]}]))
        session.add(Allocation(job_id=ids["running"], node="demo-node-1", gpus=[0, 1], state="running",
                               released=False))
        session.execute(update(Job).where(Job.id == ids["paused"]).values(state="paused", ended_at=gw.clock()))
    return ids


@pytest.fixture
def cluster(console: Console) -> Iterator[dict[str, Any]]:
    """Something on every page: jobs in each state, a pending approval (with its notices), an emergency stop."""
    ids = _jobs(console)
    r = console.api("POST", f"/v1/jobs/{ids['pending']}/stop", "carol", json={"reason": "queue hog"})
    assert r.status_code == 202, r.text
    target = submit(console)
    r = console.api("POST", "/v1/emergency-stops", "dave", json={
        "scope": {"kind": "job", "value": target}, "trigger": "safety", "reason": "unsafe outputs"})
    assert r.status_code == 201, r.text
    yield {**ids, "emergency": r.json()["id"], "seq": console.gateway.ledger.size() - 1}


def _get_links(html: str) -> list[str]:
    links, forms = links_and_forms(html)
    return [h for h in links + [f.action for f in forms if f.method == "get"] if h.startswith("/ui")]


def _post_every_form(c: TestClient, csrf: str, page: str) -> list[tuple[str, int]]:
    """Send each form of `page` that acts on it, as a person filling in what it asks for would, reading the
    page again after each (the forms it offers follow the job's state). Returns (form, status) pairs."""
    sent: list[tuple[str, int]] = []
    tried: set[tuple[str, str]] = set()
    prefix = page.rstrip("/") + "/"
    for _ in range(10):
        r = c.get(page)
        if r.status_code != 200:
            return sent
        _, forms = links_and_forms(r.text)
        todo = [(f, s) for f in forms if f.method == "post" and f.action.startswith(prefix)
                for s in (f.submits or [("", "")]) if (f.action, s[0]) not in tried]
        if not todo:
            return sent
        form, (button, value) = todo[0]
        tried.add((form.action, button))
        data = {k: (v or REASON if k == "reason" else v) for k, v in form.fields.items()}
        data["csrf"] = csrf
        if button:
            data[button] = value
        answer = c.post(form.action, data=data, follow_redirects=False)
        sent.append((f"{form.action} {button}".strip(), answer.status_code))
    raise AssertionError(f"{page} kept offering forms")


@pytest.mark.parametrize("console", ["sqlite"], indirect=True)
def test_no_persona_is_shown_a_link_or_a_form_that_answers_403(console: Console, cluster: dict[str, Any]) -> None:
    refused: list[str] = []
    for who in PERSONAS:
        c, csrf = console.sign_in(who)
        status: dict[str, int] = {}
        for template in PAGES:
            page = template.format(**cluster)
            r = c.get(page)
            if r.status_code != 200:
                continue
            for link in _get_links(r.text):
                if link not in status:
                    status[link] = c.get(link).status_code
                if status[link] == 403:
                    refused.append(f"{who} on {template}: link {link}")
        # Forms change what they act on: each persona gets jobs of its own in every state.
        for state, job in _jobs(console).items():
            for form, code in _post_every_form(c, csrf, f"/ui/jobs/{job}"):
                if code == 403:
                    refused.append(f"{who} on the {state} job's page: form {form.replace(job, '{job}')}")
    assert not refused, "\n".join(refused)
