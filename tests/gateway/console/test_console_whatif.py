"""The reviewer's what-if on the policy page: recorded decisions replayed under the files now on disk."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from console_testkit import Console, csrf_of, submit
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import REPO_POLICIES, Settings


def test_whatif_lists_the_decisions_a_policy_change_would_flip(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    # No watcher: the edited files stay on disk, not loaded, as after a refused or pending reload.
    (tmp_path / "var").mkdir()
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0)
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    app = create_app(settings, run_scheduler=False)
    with TestClient(app):
        con = Console(app, tokens)
        submit(con)
        submit(con, who="bob")
        sam, csrf = con.sign_in("sam")
        page = sam.post("/ui/policy/whatif", data={"csrf": csrf})
        assert page.status_code == 200
        summary = re.search(r'id="whatif-summary">(\d+) of (\d+) decisions flip', page.text)
        assert summary and summary.group(1) == "0" and int(summary.group(2)) >= 2
        assert page.text.count('id="whatif"') == 1  # the section renders once, inside the page layout
        assert page.text.lstrip().lower().startswith("<!doctype html")
        assert "(the active set)" in page.text

        matrix = policies / "matrix.csv"
        matrix.write_text(matrix.read_text().replace("p, researcher, *, job.submit\n", ""))
        page = sam.post("/ui/policy/whatif", data={"csrf": csrf})
        summary = re.search(r'id="whatif-summary">(\d+) of (\d+) decisions flip', page.text)
        assert summary and summary.group(1) == "2", page.text
        assert "allow→deny: 2" in page.text and "(the active set)" not in page.text
        # Nothing changed: the active set still allows submissions.
        submit(con)

        assert sam.post("/ui/policy/whatif", data={}).status_code == 403  # CSRF
        alice, alice_csrf = con.sign_in("alice")
        assert alice.post("/ui/policy/whatif", data={"csrf": alice_csrf}).status_code == 403  # no ledger.read
        # ... so her policy page says so instead of offering the button.
        mine, reviewers = alice.get("/ui/policy").text, sam.get("/ui/policy").text
        assert "Run what-if" not in mine and 'id="whatif-not-yours"' in mine
        assert "Run what-if" in reviewers and 'id="whatif-not-yours"' not in reviewers
        (policies / "broken.rego").write_text("package jobgate.authz\nthis is not rego\n")
        page = sam.post("/ui/policy/whatif", data={"csrf": csrf})
        assert page.status_code == 422 and "do not load" in page.text
        assert csrf_of(page) == csrf
        for c in con.clients:
            c.close()
