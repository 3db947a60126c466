"""The scheduler loop under a stream of kicks (every submission, release and new node kicks it): it keeps
serving them, and its cycles take no more than `scheduler_max_share` of the time, however long each is."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec, start_api
from sched_testkit import full_cluster_an_hour_on

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.metrics import REGISTRY
from gateway.native.scheduler_loop import SchedulerLoop
from gateway.settings import Settings

SHARE = 0.2


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    # Only kicks start cycles here: the periodic one would come after the test has ended.
    yield from start_api(Settings(data_dir=tmp_path, scheduler_max_share=SHARE, scheduler_interval_s=60))


def cycles() -> tuple[float, float]:
    """Cycles run so far in this process, and the seconds they took."""
    count = REGISTRY.get_sample_value("jobgate_scheduler_cycle_seconds_count") or 0.0
    return count, REGISTRY.get_sample_value("jobgate_scheduler_cycle_seconds_sum") or 0.0


def test_kicked_cycles_take_at_most_their_share_of_the_time(api: Api) -> None:
    full_cluster_an_hour_on(api)
    for i in range(40):  # a queue that makes each cycle cost something: it explains every waiting job
        api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=1, name=f"w{i}"))
    loop = SchedulerLoop(api.gateway)
    count0, busy0 = cycles()
    done = threading.Event()

    def kick() -> None:  # a burst of submissions: a kick every millisecond
        while not done.is_set():
            api.gateway.scheduler_kick.set()
            time.sleep(0.001)

    kicker = threading.Thread(target=kick, daemon=True)
    began = time.monotonic()
    loop.start()
    kicker.start()
    time.sleep(1.5)
    done.set()
    loop.stop()
    elapsed = time.monotonic() - began
    count, busy = cycles()
    count, busy = count - count0, busy - busy0
    assert count >= 3, "kicks no longer start cycles"
    # Each cycle is followed by a rest of took × (1 − share) / share before the next may start; the last one's
    # rest may be cut short by the stop, so the bound allows it once.
    assert busy <= SHARE * elapsed + busy / count, (count, busy, elapsed)


def test_where_the_loops_run_threads_take_turns_at_the_interpreter_as_set(tmp_path: Path) -> None:
    """A request waits for the interpreter after every database call; beside a cycle planning a long queue, each
    wait could take Python's whole switch interval (5 ms)."""
    before = sys.getswitchinterval()
    settings = Settings(data_dir=tmp_path, gil_switch_interval_s=0.002)
    prepare_demo(settings)
    try:
        with TestClient(create_app(settings)):
            assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
