"""The SQLite scheduler cycle's plan made in a process of its own (`scheduler_planner = "process"`).

On the embedded default one gateway process serves every request and runs the cycle. The cycle's plan (reading the
snapshot, run_cycle and the explanation of every waiting job) is Python that holds the interpreter for its whole
length: with 1,750 jobs waiting, about 70 ms a cycle on this machine. Requests that came meanwhile took turns with
it at the interpreter: approvals at a person's pace with 1,750 queued had a p99 of 48 and 40 ms with the loop
planning in its thread, 17 and 21 ms with no loop (bench/gateway.py --with-scheduler, one run). Made here, the plan
competes with the requests for a core, not for the interpreter: 23-47 ms in three runs, 17-33 ms with no loop in
those runs. The plan only reads (scheduler_loop.make_plan, in a read transaction on its own connection to the same
SQLite file, which WAL lets read beside the gateway's writers), so this process writes nothing: the gateway applies
and records the plan, in its own transactions, after checking what changed since (scheduler_loop.
_run_planned_apart), exactly as when it planned in its own thread.

A planner process that dies (kill -9, out of memory) or hangs costs no cycle (see PlannerProcess), and one whose
gateway died ends within PARENT_CHECK_S. It costs a second interpreter's memory (about 100 MB here) and
multiprocessing's resource tracker, a small third process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import types
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime
from multiprocessing.reduction import ForkingPickler
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gateway.metrics import SCHEDULER_PLANS
from gateway.native.scheduler_loop import Plan, UnisolatedNodesTake, make_plan
from gateway.store.db import make_engine
from scheduler.model import SchedulerConfig

log = logging.getLogger("jobgate.scheduler")

PARENT_CHECK_S = 1.0  # how often the planner process looks whether the gateway's process still runs
# A plan not made by then is made in the gateway, and the planner process replaced: with 1,750 jobs waiting a plan
# takes about 0.1 s here, so a minute means the process is stuck (stopped, or its disk hangs).
PLAN_TIMEOUT_S = 60.0
# After this many planner processes in a row that died, hung or could not start, the gateway plans itself.
MAX_RESTARTS = 3
START_TIMEOUT_S = 60.0  # how long `pid` waits for a planner process still starting (its imports take a second)
CLOSE_WAIT_S = 5.0  # how long close() waits for the planner process to end before it kills it


def _read_only(mapping: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(mapping)


# SchedulerConfig keeps its per-queue numbers in read-only mappings, which pickle cannot send as they are: sent to the
# planner process as the dicts they show. Registered for what multiprocessing sends only, not for every pickle.
ForkingPickler.register(types.MappingProxyType, lambda m: (_read_only, (dict(m),)))

_sessions: sessionmaker[Session] | None = None  # in the planner process: its read-only sessions


def _open(url: str, gateway_pid: int) -> None:
    global _sessions
    # Ctrl-C in a terminal reaches the whole process group: the gateway shuts down and ends this process then.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _sessions = sessionmaker(make_engine(url), expire_on_commit=False)
    threading.Thread(target=_end_with, args=(gateway_pid,), name="jobgate-planner-watch", daemon=True).start()


def _end_with(gateway_pid: int) -> None:
    """Ends this process once the gateway's has ended: a gateway killed with kill -9 closes nothing, and the pipe
    this process waits on for work stays open (it holds that pipe's other end too)."""
    while os.getppid() == gateway_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _plan(now: datetime, config: SchedulerConfig, take: UnisolatedNodesTake) -> Plan:
    assert _sessions is not None, "the planner process was started without its database"
    with _sessions() as session, session.begin():
        return make_plan(session, now, config, take)


def _pid() -> int:
    return multiprocessing.current_process().pid or 0


def _end(pool: ProcessPoolExecutor, wait_s: float) -> None:
    """Shut `pool` down; its process is killed if it has not ended within `wait_s` (a stuck one never would)."""
    # The executor has no public handle on its processes, nor a way to end one that does not answer (and shutdown()
    # forgets them).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(wait_s)
        if process.is_alive():
            process.kill()
            process.join(1.0)


class PlannerProcess:
    """A scheduler_loop.Planner that makes each plan in one long-lived child process reading the database at `url`
    (SQLite). Started at once, so the first cycle does not wait for its imports; close() ends it.

    A plan the planner process does not give (it died, or has not answered within PLAN_TIMEOUT_S) is left to the
    gateway (None), and the process replaced; after MAX_RESTARTS such processes in a row, or once closed, the gateway
    makes every plan itself. jobgate_scheduler_plans_total counts the plans by where they were made."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = self._start()
        self._failures = 0  # planner processes in a row that gave no plan

    def _start(self) -> ProcessPoolExecutor:
        # spawn: a fork of a process with threads running (the loops, the ledger's writer) may copy a held lock.
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_open, initargs=(self._url, os.getpid()))
        pool.submit(_pid)  # starts the process and its imports now
        return pool

    @property
    def pid(self) -> int | None:
        """The planner process's pid; None when the gateway makes the plans."""
        with self._lock:
            pool = self._pool
        return None if pool is None else int(pool.submit(_pid).result(START_TIMEOUT_S))

    def __call__(self, now: datetime, config: SchedulerConfig, take: UnisolatedNodesTake) -> Plan | None:
        """The plan at `now` made by the planner process; None when it gave none and the gateway is to make it
        (see the class). Raises what make_plan raises (a database error)."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            try:
                plan = pool.submit(_plan, now, config, take).result(PLAN_TIMEOUT_S)
            except (BrokenProcessPool, FuturesTimeout) as e:
                self._replace(pool, "ended" if isinstance(e, BrokenProcessPool) else
                              f"gave no plan within {PLAN_TIMEOUT_S:g} s")
            else:
                self._failures = 0
                SCHEDULER_PLANS.labels("process").inc()
                return plan
        SCHEDULER_PLANS.labels("gateway").inc()
        return None

    def _replace(self, pool: ProcessPoolExecutor, what: str) -> None:
        with self._lock:
            if self._pool is not pool:  # closed, or replaced by another caller meanwhile
                return
            self._failures += 1
            self._pool = self._start() if self._failures < MAX_RESTARTS else None
        if self._pool is None:
            log.error("the scheduler's planner process %s; %d in a row gave no plan: the gateway makes every plan from"
                      " now on", what, self._failures)
        else:
            log.warning("the scheduler's planner process %s; this cycle is planned in the gateway, the next one in a"
                        " new planner process", what)
        _end(pool, 0.0)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            _end(pool, CLOSE_WAIT_S)
