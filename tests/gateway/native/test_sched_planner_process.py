"""SQLite: the scheduler cycle's plan made in a process of its own (gateway/native/planner_process.py) is the plan the
loop's thread makes, a planner process that dies or hangs costs no cycle, and `jobgate up` plans in one and ends it,
also when it is killed itself."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec, start_api
from sched_testkit import full_cluster_an_hour_on, job, report

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.jobs.scheduler_config import scheduler_config
from gateway.metrics import REGISTRY
from gateway.native import planner_process
from gateway.native.planner_process import PARENT_CHECK_S, PlannerProcess
from gateway.native.scheduler_loop import UnisolatedNodesTake, make_plan, run_once
from gateway.settings import Settings


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from start_api(Settings(data_dir=tmp_path))


@pytest.fixture
def planner(api: Api) -> Iterator[PlannerProcess]:
    p = PlannerProcess(api.gateway.db.url)
    yield p
    p.close()


def a_queue_to_plan(api: Api) -> list[str]:
    """A node freed for one of the waiting jobs (the first urgent one), and a second urgent job that preempts the
    other node's job."""
    running = full_cluster_an_hour_on(api)
    report(api, job(api, running[0])["placement"][0]["node"], running[0], "exited",
           evidence={"process_group_gone": True, "exit_code": 0})
    waiting = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name=f"w{i}")).json()["id"]
               for i in range(3)]
    urgent = [api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name=f"u{i}")).json()["id"]
              for i in range(2)]
    return [*waiting, *urgent]


def test_the_planner_process_makes_the_plan_the_loop_thread_makes(api: Api, planner: PlannerProcess) -> None:
    a_queue_to_plan(api)
    gw = api.gateway
    now, config, take = gw.clock(), scheduler_config(gw), UnisolatedNodesTake.of(gw.policy_set.data)
    with gw.transaction(immediate=False) as session:
        here = make_plan(session, now, config, take)
    there = planner(now, config, take)
    assert planner.pid != os.getpid()
    assert there is not None
    assert there.admits and there.preemptions and there.explanation.rows  # a plan with something in each part
    assert there == here


def plans_made_in(where: str) -> float:
    return REGISTRY.get_sample_value("jobgate_scheduler_plans_total", {"made_in": where}) or 0.0


def planner_killed(planner: PlannerProcess, how: signal.Signals) -> int:
    """Send the planner process `how`; its pid."""
    pid = planner.pid
    assert pid is not None
    os.kill(pid, how)
    return pid


def test_a_cycle_whose_planner_process_died_is_planned_in_the_gateway_and_the_next_in_a_new_one(
        api: Api, planner: PlannerProcess) -> None:
    ids = a_queue_to_plan(api)
    made_here = plans_made_in("gateway")
    first = planner_killed(planner, signal.SIGKILL)
    assert run_once(api.gateway, planner) == 1  # the freed node still takes a waiting job
    assert [job(api, j)["state"] for j in ids].count("pending") == 4
    assert plans_made_in("gateway") == made_here + 1
    assert planner.pid not in (first, os.getpid(), None)


def test_a_planner_process_that_hangs_is_replaced_and_its_cycle_planned_in_the_gateway(
        api: Api, planner: PlannerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_process, "PLAN_TIMEOUT_S", 1.0)
    a_queue_to_plan(api)
    stuck = planner_killed(planner, signal.SIGSTOP)  # as a process whose disk stopped answering
    try:
        assert run_once(api.gateway, planner) == 1
        assert not alive(stuck)
        assert planner.pid not in (stuck, None)
    finally:
        if alive(stuck):
            os.kill(stuck, signal.SIGKILL)


def test_after_planner_processes_fail_in_a_row_the_gateway_plans(
        api: Api, planner: PlannerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_process, "MAX_RESTARTS", 1)
    a_queue_to_plan(api)
    made_here = plans_made_in("gateway")
    planner_killed(planner, signal.SIGKILL)
    assert run_once(api.gateway, planner) == 1
    assert planner.pid is None  # none started again
    run_once(api.gateway, planner)
    assert plans_made_in("gateway") == made_here + 2


def test_jobgate_up_on_sqlite_plans_in_a_process_it_ends_at_shutdown(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    prepare_demo(settings)
    alice = json.loads((tmp_path / "demo-tokens.json").read_text())["alice"]
    before, made = set(multiprocessing.active_children()), plans_made_in("process")
    with TestClient(create_app(settings, run_scheduler=True)) as client:
        started = set(multiprocessing.active_children()) - before
        assert len(started) == 1
        r = client.post("/v1/jobs", json=job_spec(), headers={"Authorization": f"Bearer {alice}"})
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 30
        while plans_made_in("process") == made and time.monotonic() < deadline:  # the submission's cycle
            time.sleep(0.05)
        assert plans_made_in("process") > made
    assert not started & set(multiprocessing.active_children())


def children(pid: int) -> set[int]:
    return {int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_planner_process_ends_when_its_gateway_is_killed(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port), "--data-dir",
                                str(tmp_path / "var")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert gateway.poll() is None and time.monotonic() < deadline, "jobgate up did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        planners = {c for c in children(gateway.pid)
                    if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}
        assert len(planners) == 1
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 10 * PARENT_CHECK_S
    while any(alive(p) for p in planners) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in planners), "the planner process outlived its gateway"
