"""The console in a real browser against `jobgate up --demo` with two real node agents.

alice sees her running job and her waiting job's queue position; dave files a stop of a CI job that
needs a second person, carol approves it in her inbox and watches the job reach `stopped`; audrey opens
that stop's ledger entry and sees its inclusion proof verified against the signed checkpoint. A POST
without the CSRF token is refused. Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from console_browser_kit import browser
from e2e_testkit import System, wait_for
from job_host import JOB_PYTHON

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

CHECKPOINTING_JOB = """
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"], "last.ckpt").write_text("weights")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.05)
"""


def sign_in(page: Any, system: System, who: str) -> None:
    page.goto(system.url + "/ui/login")
    page.fill("input[name=token]", system.tokens[who])
    page.click("button[type=submit]")
    page.wait_for_selector("#me")
    assert page.inner_text("#me") == who


def sign_out(page: Any) -> None:
    page.click("text=Sign out")
    page.wait_for_selector("input[name=token]")


def reload_until(page: Any, selector: str, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page.reload()
        if text in page.inner_text(selector):
            return
        time.sleep(0.3)
    raise AssertionError(f"{selector} never showed {text!r}; it shows {page.inner_text(selector)!r}")


def test_console_researcher_approver_auditor(demo_system: System, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTING_JOB)
    alice = demo_system.client("alice")
    # Two 8-GPU nodes: a 16-GPU gang runs, the next 8-GPU job waits first in line.
    big = alice.post("/v1/jobs", json={"name": "resnet-big", "project": "vision", "gpus_per_node": 8, "nodes": 2,
                                       "command": [JOB_PYTHON, str(script)]}).json()["id"]
    wait_for(lambda: alice.get(f"/v1/jobs/{big}").json()["state"] == "running", 30, "the big job to run")
    waiting = alice.post("/v1/jobs", json={"name": "resnet-next", "project": "vision", "gpus_per_node": 8,
                                           "nodes": 1, "command": [JOB_PYTHON, str(script)]}).json()["id"]
    wait_for(lambda: alice.get(f"/v1/jobs/{waiting}/queue").json()["position"] == 1, 30,
             "the waiting job's queue position")

    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 1000})  # type: ignore[attr-defined]

        # alice: her running job, her waiting job at position #1, and the first screen.
        sign_in(page, demo_system, "alice")
        assert "Leave other people's jobs alone" in page.inner_text("#first-screen")
        assert page.inner_text(f"tr[data-job='{big}'] .state") == "running"
        assert page.inner_text(f"tr[data-job='{waiting}'] .position") == "#1"
        page.screenshot(path=str(shots / "1-alice-my-jobs.png"), full_page=True)
        # The console refuses a POST without the session's CSRF token (the browser's own cookies go along).
        r = page.request.post(f"{demo_system.url}/ui/jobs/{big}/stop", form={"reason": "no csrf here"})
        assert r.status == 403 and "CSRF" in r.text()
        assert alice.get(f"/v1/jobs/{big}").json()["state"] == "running"
        # A researcher sees no ledger and no admin data.
        page.goto(demo_system.url + "/ui/ledger")
        assert "403" in page.inner_text("h1")
        sign_out(page)
        # alice makes room: her own jobs stop at once (owner; no second person).
        for job_id in (waiting, big):
            assert alice.post(f"/v1/jobs/{job_id}/stop", json={"reason": "making room"}).status_code == 202
        wait_for(lambda: alice.get(f"/v1/jobs/{big}").json()["state"] == "stopped", 60, "alice's job to stop")

        # The CI pipeline's job (responsible person alice): only on-call may stop it, with a second person.
        ci = demo_system.client("ci-bot")
        ci.headers["X-Jobgate-Trigger"] = "ci/nightly#42"
        ci_job = ci.post("/v1/jobs", json={"name": "nightly-eval", "project": "vision", "gpus_per_node": 4,
                                           "nodes": 1,
                                           "command": [JOB_PYTHON, str(script)]}).json()["id"]
        wait_for(lambda: alice.get(f"/v1/jobs/{ci_job}").json()["state"] == "running", 60,
                 "the CI job to run")

        sign_in(page, demo_system, "dave")
        page.goto(f"{demo_system.url}/ui/jobs/{ci_job}")
        page.fill("#controls form.stop input[name=reason]", "runaway evaluation eating the pool")
        page.click("#controls form.stop button.danger")
        page.wait_for_url(re.compile(r".*/ui/approvals/apr-.*"))
        approval_id = page.url.rsplit("/", 1)[1]
        assert page.get_attribute(f"section[id='{approval_id}']", "data-state") == "pending"
        sign_out(page)

        # carol: the inbox shows the exact target, the requester and the reason; she approves.
        sign_in(page, demo_system, "carol")
        page.goto(demo_system.url + "/ui/approvals")
        card = page.locator(f"section[id='{approval_id}']")
        text = card.inner_text()
        assert ci_job in text and "dave" in text and "runaway evaluation" in text and "expires" in text.lower()
        # What she approves, in words: the job's state before → after with its grace, and who is still needed.
        assert f"job {ci_job} (nightly-eval, owner alice): running → stopped; SIGTERM, then 30 s" in text, text
        assert "one more: " in card.locator(".still-needed").inner_text() and '"count"' not in text
        page.screenshot(path=str(shots / "2-carol-inbox.png"), full_page=True)
        card.locator("input[name=comment]").fill("agreed, stop it")
        card.locator("button[name=approve]").click()
        page.wait_for_selector(f"section[id='{approval_id}'][data-state='executed']")
        page.goto(f"{demo_system.url}/ui/jobs/{ci_job}")
        reload_until(page, "#job-state", "stopped", 60)
        assert page.inner_text("#outcome") == "graceful"
        assert "last.ckpt" in page.inner_text("#evidence")
        page.screenshot(path=str(shots / "3-carol-job-stopped.png"), full_page=True)
        sign_out(page)

        # erin (platform admin): usage, heat map, waits, preemptions, fragmentation, nodes.
        sign_in(page, demo_system, "erin")
        page.goto(demo_system.url + "/ui/admin")
        assert "vision" in page.inner_text("#heatmap")
        assert "demo-node-1" in page.inner_text("main") and "alive" in page.inner_text("main")
        page.screenshot(path=str(shots / "3b-erin-admin.png"), full_page=True)
        sign_out(page)

        # audrey: the stop's decision in the ledger, its inclusion proof verified against the checkpoint.
        sign_in(page, demo_system, "audrey")
        page.goto(f"{demo_system.url}/ui/ledger?job={ci_job}&action=job.stop&kind=decision")
        rows = page.locator("#entries tr[data-seq]")
        assert rows.count() >= 2  # dave's request and the re-decision with carol's approval
        page.screenshot(path=str(shots / "4-audrey-ledger.png"), full_page=True)
        rows.first.locator("a").first.click()
        page.wait_for_selector("#verdict")
        assert page.inner_text("#verdict").startswith("✔ Inclusion proof verified")
        entry = json.loads(page.locator("pre").first.inner_text())
        assert entry["kind"] == "decision" and entry["body"]["input"]["action"] == "job.stop"
        assert [t["id"] for t in entry["body"]["input"]["targets"]] == [ci_job]
        page.screenshot(path=str(shots / "5-audrey-proof-verified.png"), full_page=True)
        # The export button downloads a bundle for offline verification.
        with page.expect_download() as dl:
            page.goto(f"{demo_system.url}/ui/ledger")
            page.click("#export")
        saved = tmp_path / "ledger.bundle"
        dl.value.save_as(saved)
        assert saved.read_bytes().startswith(b'{"format": "jobgate-ledger-bundle/1"')
    assert sorted(p.name for p in shots.iterdir()) == [
        "1-alice-my-jobs.png", "2-carol-inbox.png", "3-carol-job-stopped.png", "3b-erin-admin.png",
        "4-audrey-ledger.png",
        "5-audrey-proof-verified.png"]
    print("screenshots in", shots)
