"""Two replicas of one gateway (`jobgate up --port A --data-dir D` and `--port B --data-dir D` on one PostgreSQL
business database and one PostgreSQL ledger) serve one organisation: one leads, a job submitted through one is
stopped through the other with its evidence; and kill -9 of the leader under load: the other leads within the
bound (gateway/leadership.py), no acknowledged ledger entry is lost, the ledger verifies, no job starts twice,
no acknowledged stop is lost."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from e2e_testkit import wait_for
from job_host import JOB_PYTHON, searchable_by_jobs
from replicas_testkit import JOBGATE, Replica, Replicas, failover, seed_demo_without_agents

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

FAILOVER_BOUND_S = 5.0  # the stated bound: another replica leads within this of the leader's kill -9
SLEEPER = [JOB_PYTHON, "-c", "import time; time.sleep(600)"]


def _databases(server: str, n: int) -> list[str]:
    urls = []
    for _ in range(n):
        name = f"jobgate_replicas_{secrets.token_hex(5)}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        urls.append(urlunsplit(urlsplit(server)._replace(path="/" + name)))
    return urls


def _drop(server: str, urls: list[str]) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        for url in urls:
            conn.execute(f'DROP DATABASE IF EXISTS "{urlsplit(url).path[1:]}" WITH (FORCE)')


@pytest.fixture(scope="module")
def pair(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Replicas, Replica, Replica]]:
    """The README's two replicas, each `jobgate up --demo`: the first seeds and runs the agents, the second
    finds the demo seeded."""
    tmp = tmp_path_factory.mktemp("replicas")
    searchable_by_jobs(tmp)
    urls = _databases(pg_server_url, 2)
    replicas = Replicas(tmp / "var", *urls)
    try:
        a = replicas.start(demo=True, wait_ready=False)
        wait_for(lambda: "this replica leads" in a.output() or a.proc.poll() is not None, 120, "the first to lead")
        b = replicas.start(demo=True, wait_ready=False)  # seeded and elected: the second starts beside it
        replicas.wait_ready(a)
        replicas.wait_ready(b)
        replicas.wait_nodes_alive(b)
        yield replicas, a, b
    finally:
        replicas.stop()
        _drop(pg_server_url, urls)


def test_two_replicas_one_leads_and_say_so(pair: tuple[Replicas, Replica, Replica]) -> None:
    _, a, b = pair
    first, second = a.output(), b.output()
    assert "seeded the demo organisation" in first and "this replica leads" in first
    assert "demo organisation already seeded; keeping data" in second and "this replica follows" in second
    assert "node agents: none started here" in second
    ready_a, ready_b = a.readiness(), b.readiness()
    assert ready_a and ready_b and ready_a[0] == ready_b[0] == 200
    status_a, status_b = ready_a[1]["replicas"], ready_b[1]["replicas"]
    assert status_a["role"] == "leader" and status_b["role"] == "follower"
    assert status_a["leader"] == {**status_b["leader"], "alive": True}
    assert status_b["leader"]["id"] == status_a["replica"]
    assert {r["id"] for r in status_b["replicas"] if r["alive"]} == {status_a["replica"], status_b["replica"]}


def test_a_job_submitted_through_one_replica_is_stopped_through_the_other_with_its_evidence(
        pair: tuple[Replicas, Replica, Replica]) -> None:
    replicas, a, b = pair
    with replicas.client(a, "alice") as via_a, replicas.client(b, "alice") as via_b:
        r = via_a.post("/v1/jobs", json={"name": "two-doors", "project": "vision", "gpus_per_node": 1, "nodes": 1,
                                         "command": SLEEPER})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        wait_for(lambda: via_b.get(f"/v1/jobs/{job}").json()["state"] == "running", 60, "the job to run")
        stop = via_b.post(f"/v1/jobs/{job}/stop", json={"reason": "done through the other door"})
        assert stop.status_code == 202, stop.text
        done = wait_for(lambda: (j := via_a.get(f"/v1/jobs/{job}").json())["state"] == "stopped" and j, 60,
                        "the stop to be confirmed")
    (evidence,) = done["evidence"]["nodes"].values()
    assert evidence["process_group_gone"] is True
    assert [h["to"] for h in done["history"]][-3:] == ["stop_requested", "stopping", "stopped"]


def test_replicas_restarted_together_on_a_seeded_database_still_get_the_demo_agents(
        pair: tuple[Replicas, Replica, Replica]) -> None:
    """Both replicas stop; the first to start again, on the demo seeded long ago, runs the demo's node agents
    (they ran only beside the replica that seeded, so after a restart of all of them no node ever came back).
    Last of the tests on `pair`: it stops the pair's replicas."""
    replicas = pair[0]
    replicas.stop()
    again = replicas.start(demo=True)
    beside = replicas.start(demo=True)
    assert "demo organisation already seeded" in again.output() and "none started here" not in again.output()
    assert "none started here" in beside.output()
    replicas.wait_nodes_alive(beside)


def _ledger(url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        return {seq: json.loads(bytes(data)) for seq, data in conn.execute("SELECT seq, data FROM ledger_entries")}


def test_kill_9_of_the_leader_under_load_another_leads_and_nothing_acknowledged_is_lost_or_done_twice(
        pg_server_url: str, tmp_path: Path) -> None:
    searchable_by_jobs(tmp_path)
    urls = _databases(pg_server_url, 2)
    replicas = Replicas(tmp_path / "var", *urls)
    acked: list[str] = []  # jobs whose submission was answered 201
    stops: dict[str, int] = {}  # job id -> seq of its stop's decision
    lock = threading.Lock()
    quit_load = threading.Event()
    try:
        seed_demo_without_agents(replicas.data_dir, *urls)
        leader = replicas.start(demo=False)
        survivor = replicas.start(demo=False)
        replicas.wait_ready(leader)
        replicas.start_agents(survivor.url)  # the agents' gateway survives; the scheduler's leader does not
        replicas.wait_nodes_alive(survivor)
        assert leader.leads() and not survivor.leads()

        def submit_and_stop(replica: Replica, who: str) -> None:
            with replicas.client(replica, who) as c:
                n = 0
                while not quit_load.is_set():
                    n += 1
                    try:
                        r = c.post("/v1/jobs", json={"name": f"load-{n}", "project": "vision", "gpus_per_node": 1,
                                                     "nodes": 1, "command": SLEEPER})
                        if r.status_code == 201:
                            with lock:
                                acked.append(r.json()["id"])
                        with lock:
                            victim = next((j for j in acked[::3] if j not in stops), None)
                        if victim is not None:
                            s = c.post(f"/v1/jobs/{victim}/stop", json={"reason": "load"})
                            if s.status_code == 202:
                                with lock:
                                    stops[victim] = s.json()["decision"]["ledger_seq"]
                    except httpx.HTTPError:
                        time.sleep(0.05)  # the killed replica: its client gives up on it, the other goes on
                    time.sleep(0.05)

        load = [threading.Thread(target=submit_and_stop, args=(r, who))
                for r, who in ((leader, "alice"), (survivor, "bob"))]
        for t in load:
            t.start()
        wait_for(lambda: len(acked) >= 10, 60, "load to be under way")
        took = failover(replicas, leader, survivor)
        assert took["elected_s"] <= FAILOVER_BOUND_S, took
        wait_for(lambda: len(acked) >= 30, 60, "load to go on through the survivor")
        quit_load.set()
        for t in load:
            t.join(30)

        with replicas.client(survivor, "alice") as c:
            def stopped_all() -> bool:
                states = {j: c.get(f"/v1/jobs/{j}").json()["state"] for j in stops}
                return all(s in ("stopped", "succeeded", "failed") for s in states.values())

            wait_for(stopped_all, 90, "every acknowledged stop to be carried out", interval=0.5)

        entries = _ledger(replicas.ledger_url)
        for job, seq in stops.items():
            assert entries[seq]["kind"] == "decision" and job in json.dumps(entries[seq]["body"]), (job, seq)
        submitted = {e["body"]["input"]["params"].get("job_id") for e in entries.values()
                     if e["kind"] == "decision" and e["body"]["input"]["action"] == "job.submit"}
        assert set(acked) <= submitted, set(acked) - submitted
        verify = subprocess.run([*JOBGATE, "ledger", "verify", "--db", replicas.ledger_url, "--public-key",
                                 str(replicas.data_dir / "keys" / "ledger.vkey")], capture_output=True, text=True,
                                timeout=300, env=replicas.env)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        with psycopg.connect(replicas.database_url) as conn:
            starts = Counter(job for (job,) in conn.execute("SELECT job_id FROM node_commands WHERE kind = 'start'"))
        assert starts and max(starts.values()) == 1, starts.most_common(3)
    finally:
        quit_load.set()
        replicas.stop()
        _drop(pg_server_url, urls)
