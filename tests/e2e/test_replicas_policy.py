"""Two `jobgate up` processes on one PostgreSQL business DB and ledger (issue 28, Deliver 5): a replica on another
policy hash refuses to decide. A reload through one replica makes its set the one in force; the other, whose
policy files are still the old set, refuses every decision (503 `policy-out-of-step`) rather than decide under a
stale hash, and decides again, under the new hash, once its files are the new set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2e_testkit import JOBGATE, free_port, wait_for

from gateway.demo import prepare_demo
from gateway.settings import REPO_POLICIES, Settings

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SPEC = {"name": "replica-e2e", "project": "vision", "gpus_per_node": 1, "nodes": 1, "command": ["true"]}


def _up(tmp_path: Path, name: str, env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    with open(tmp_path / f"{name}.log", "wb") as log:  # the process keeps its own copy of the descriptor
        proc = subprocess.Popen([*JOBGATE, "up", "--port", str(port), "--data-dir", str(tmp_path / "var")],
                                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"replica {name} exited early:\n" + (tmp_path / f"{name}.log").read_text())
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 90, f"replica {name}'s /healthz")
    return url, proc


@pytest.fixture
def replicas(tmp_path: Path, fresh_pg_database: Callable[[str], str]) -> Iterator[tuple[str, str, Path, Path, dict]]:
    biz, led = fresh_pg_database("jobgate_biz"), fresh_pg_database("jobgate_ledger")
    dir_a, dir_b = tmp_path / "policies-a", tmp_path / "policies-b"
    shutil.copytree(REPO_POLICIES, dir_a)
    shutil.copytree(REPO_POLICIES, dir_b)
    prepare_demo(Settings(data_dir=tmp_path / "var", database_url=biz, ledger_url=led))  # the cast, no agents
    tokens = json.loads((tmp_path / "var" / "demo-tokens.json").read_text())
    common = {"JOBGATE_DATABASE_URL": biz, "JOBGATE_LEDGER_URL": led, "JOBGATE_POLICY_WATCH_INTERVAL_S": "0"}
    procs = []
    try:
        url_a, proc = _up(tmp_path, "a", {**common, "JOBGATE_POLICIES_DIR": str(dir_a)})
        procs.append(proc)
        url_b, proc = _up(tmp_path, "b", {**common, "JOBGATE_POLICIES_DIR": str(dir_b)})
        procs.append(proc)
        yield url_a, url_b, dir_a, dir_b, tokens
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_replica_on_another_policy_hash_refuses_to_decide(replicas: tuple[str, str, Path, Path, dict]) -> None:
    url_a, url_b, dir_a, dir_b, tokens = replicas

    def call(url: str, who: str, method: str, path: str, **kw: object) -> httpx.Response:
        return httpx.request(method, url + path, headers={"Authorization": f"Bearer {tokens[who]}"}, timeout=60,
                             **kw)  # type: ignore[arg-type]

    assert call(url_b, "alice", "POST", "/v1/jobs", json=SPEC).status_code == 201
    guards = dir_a / "guards.rego"
    guards.write_text(guards.read_text().replace("# H1:", "# H1 (reviewed on a):", 1))
    reloaded = call(url_a, "sam", "POST", "/v1/policy/reload")
    assert reloaded.status_code == 200, reloaded.text
    new_hash = reloaded.json()["policy_hash"]

    refused = call(url_b, "alice", "POST", "/v1/jobs", json=SPEC)
    assert refused.status_code == 503 and refused.json()["type"].endswith("/policy-out-of-step"), refused.text
    assert new_hash[:12] in refused.json()["detail"] and str(dir_b) in refused.json()["detail"]
    assert call(url_b, "sam", "GET", "/v1/policy").json()["policy_hash"] != new_hash

    shutil.copy(guards, dir_b / "guards.rego")
    accepted = call(url_b, "alice", "POST", "/v1/jobs", json=SPEC)
    assert accepted.status_code == 201, accepted.text
    assert call(url_b, "sam", "GET", "/v1/policy").json()["policy_hash"] == new_hash
    assert call(url_a, "alice", "POST", "/v1/jobs", json=SPEC).status_code == 201  # a decides on, under it
