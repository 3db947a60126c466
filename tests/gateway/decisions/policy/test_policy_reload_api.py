"""Live policy reload: a broken or failing set is refused with file:line errors and the old set keeps
deciding; a fixed set becomes active; every attempt is in the ledger; the directory watcher does the same."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from gateway_testkit import Api, job_spec, start_api

from gateway.settings import REPO_POLICIES, Settings


def ledger(api: Api) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        r = api.get("/v1/ledger/entries", "audrey", params={"start": len(out), "limit": 1000})
        assert r.status_code == 200, r.text
        batch = [e["entry"] for e in r.json()["entries"]]
        out += batch
        if not batch:
            return out


def stop_decision(api: Api, job_id: str, who: str) -> dict[str, Any]:
    r = api.post(f"/v1/jobs/{job_id}/stop", who, json={"reason": "test"})
    assert r.status_code in (202, 403), r.text
    return r.json()


def break_guards(policy_dir: Path) -> None:
    path = policy_dir / "guards.rego"
    lines = path.read_text().splitlines()
    lines.insert(8, "broken if {")  # line 9; the brace never closes
    path.write_text("\n".join(lines) + "\n")


def test_broken_rego_is_refused_and_old_set_keeps_deciding(papi: Api, policy_dir: Path) -> None:
    before = papi.get("/v1/policy", "sam").json()
    old_hash = before["policy_hash"]
    assert before["history"][0]["trigger"] == "startup"
    original = (policy_dir / "guards.rego").read_text()
    break_guards(policy_dir)

    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"].endswith("/policy-refused")
    assert problem["active_hash"] == old_hash
    assert any(e.startswith("guards.rego:") and not e.startswith("guards.rego:0:") for e in problem["errors"]), problem

    # The old set still decides: a job is still submitted, decisions carry the old hash.
    job = papi.post("/v1/jobs", "alice", json=job_spec()).json()
    decision = stop_decision(papi, job["id"], "mallory")
    assert decision["policy_hash"] == old_hash
    status = papi.get("/v1/policy", "sam").json()
    assert status["policy_hash"] == old_hash
    assert status["history"][0]["result"] == "refused" and status["history"][0]["errors"]

    # Fixed: the new set is active, and the load is in the ledger with its hash.
    (policy_dir / "guards.rego").write_text(original.replace("# H1:", "# H1 (reviewed):"))
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 200, r.text
    new_hash = r.json()["policy_hash"]
    assert new_hash != old_hash
    assert stop_decision(papi, job["id"], "mallory")["policy_hash"] == new_hash

    loads = [e["body"] for e in ledger(papi) if e["kind"] == "policy"]
    expected = [("startup", "loaded"), ("api", "refused"), ("api", "loaded")]
    assert [(b["trigger"], b["result"]) for b in loads] == expected
    assert loads[1]["policy_hash"] != old_hash and loads[1]["errors"]
    assert loads[2]["policy_hash"] == new_hash and loads[2]["previous_hash"] == old_hash
    decisions = [e["body"] for e in ledger(papi) if e["kind"] == "decision"]
    assert decisions[-1]["policy_hash"] == new_hash


def test_a_set_failing_its_own_tests_is_refused(papi: Api, policy_dir: Path) -> None:
    old_hash = papi.get("/v1/policy", "sam").json()["policy_hash"]
    # Compiles, but lets a researcher stop others' jobs: the table case for A4 fails.
    matrix = policy_dir / "matrix.csv"
    matrix.write_text(matrix.read_text() + "p, researcher, *, job.stop.any\n")
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert any(e.startswith("tests/matrix.yaml:") and "A4 a researcher cannot stop" in e for e in errors), errors
    assert papi.get("/v1/policy", "sam").json()["policy_hash"] == old_hash


def test_only_security_reviewers_reload(papi: Api) -> None:
    for who in ("erin", "alice", "dave"):
        r = papi.post("/v1/policy/reload", who)
        assert r.status_code == 403, r.text
        assert "policy.reload" in r.json()["detail"]
    assert papi.post("/v1/policy/reload").status_code == 401
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 200 and r.json()["attempt"]["result"] == "unchanged"


def test_watcher_picks_up_a_changed_directory(settings: Settings, policy_dir: Path) -> None:
    watched = settings.model_copy(update={"policies_dir": policy_dir, "policy_watch_interval_s": 0.1})
    for api in start_api(watched):
        old_hash: str = api.get("/v1/policy", "sam").json()["policy_hash"]
        break_guards(policy_dir)
        status = _wait_for(api, lambda s: s["history"][0]["result"] == "refused")
        assert status["policy_hash"] == old_hash and status["history"][0]["trigger"] == "watch"
        shutil.copy(REPO_POLICIES / "guards.rego", policy_dir / "guards.rego")
        (policy_dir / "data.json").write_text(
            (policy_dir / "data.json").read_text().replace('"jobs_per_batch": 50', '"jobs_per_batch": 40'))
        status = _wait_for(api, lambda s, old=old_hash: s["policy_hash"] != old)
        assert status["history"][0]["result"] == "loaded" and status["history"][0]["trigger"] == "watch"
        assert api.gateway.policy_set.data["limits"]["jobs_per_batch"] == 40


def _wait_for(api: Api, ok: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = api.get("/v1/policy", "sam").json()
        if ok(status):
            return dict(status)
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
