"""Q11 statistics for jobs that go back to the queue. A job's row knows only its current run, so a preempted job
lost its first run from the heat map, a resumed job counted its paused hours as GPU use, and the wait statistics
took everything from submission to the last start (runs and pauses included) as one wait."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_testkit import Api, job_spec
from sched_testkit import advance, bring_up_nodes, full_cluster_an_hour_on, job, report

from gateway.native.scheduler_loop import run_once


def vision_gpu_hours(api: Api) -> float:
    r = api.get("/v1/stats/usage", "erin", params={"days": 2})
    assert r.status_code == 200, r.text
    row = next(r for r in r.json()["heatmap"]["rows"] if r["tenant"] == "vision")
    return float(sum(c["gpu_hours"] for c in row["cells"]))


def normal_queue_waits(api: Api) -> dict[str, Any]:
    r = api.get("/v1/stats/waits", "erin")
    assert r.status_code == 200, r.text
    return dict(r.json()["queues"]["normal"])


def start(api: Api, job_id: str) -> str:
    assert run_once(api.gateway) == 1
    node = str(job(api, job_id)["placement"][0]["node"])
    report(api, node, job_id, "started", pid=1)
    return node


def test_a_paused_and_resumed_job_counts_each_run_and_each_wait(api: Api) -> None:
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    advance(api, 600)  # waits 10 min
    node = start(api, j)
    advance(api, 2 * 3600)  # runs 2 h
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the GPUs"}).status_code == 202
    report(api, node, j, "stopped", evidence={"outcome": "graceful", "exit_code": 0})
    advance(api, 3600)  # paused 1 h: neither running nor waiting
    assert api.post(f"/v1/jobs/{j}/resume", "alice", json={"reason": "back to work"}).status_code == 200
    assert job(api, j)["started_at"] is None  # pending again: it has not started
    assert vision_gpu_hours(api) == pytest.approx(8 * 2, abs=0.01)  # the paused hour is not GPU use
    waits = normal_queue_waits(api)
    assert waits["started"] == 1 and waits["max_s"] == pytest.approx(600, abs=1) and waits["waiting_now"] == 1

    advance(api, 1800)  # waits 30 min in the queue again
    start(api, j)
    advance(api, 3600)  # runs 1 h
    assert vision_gpu_hours(api) == pytest.approx(8 * 3, abs=0.01)
    waits = normal_queue_waits(api)
    assert waits["started"] == 2 and waits["waiting_now"] == 0
    assert (waits["p50_s"], waits["max_s"]) == (pytest.approx(600, abs=1), pytest.approx(1800, abs=1))


def test_a_preempted_job_keeps_its_first_run_in_the_heat_map_and_the_waits(api: Api) -> None:
    ids = full_cluster_an_hour_on(api)
    api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u"))
    run_once(api.gateway)
    victim = ids[1]
    node = job(api, victim)["placement"][0]["node"]
    report(api, node, victim, "stopping")
    report(api, node, victim, "stopped", evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, victim)["state"] == "pending"
    assert vision_gpu_hours(api) == pytest.approx(8 * 1 + 8 * 1, abs=0.01)  # both ran an hour
    waits = normal_queue_waits(api)
    assert waits["started"] == 2 and waits["waiting_now"] == 1
