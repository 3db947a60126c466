"""The SQLite scheduler cycle's plan made in a process of its own (`scheduler_planner = "process"`).

On the embedded default one gateway process serves every request and runs the cycle. The cycle's plan (reading the
snapshot, run_cycle and the explanation of every waiting job) is Python that holds the interpreter for its whole
length: with 1,750 jobs waiting, ~70 ms a cycle on this machine. A request that came meanwhile took turns with it at
the interpreter and ran 2-5 times slower; approvals at a person's pace had a p99 of 50-70 ms with the loop running
against 16-19 ms without it (bench/gateway.py --with-scheduler). Made here, the plan competes with the requests for
a core, not for the interpreter. The plan only reads (scheduler_loop.make_plan, in a read transaction on its own
connection to the same SQLite file, which WAL lets read beside the gateway's writers), so this process writes
nothing: the gateway applies and records the plan, in its own transactions, after checking what changed since
(scheduler_loop._run_planned_apart), exactly as when it planned in its own thread.

A planner process that dies (kill -9, out of memory) costs one cycle nothing: that cycle is planned in the loop's
thread and the next one in a fresh process. A planner process whose gateway died ends within PARENT_CHECK_S.
"""

from __future__ import annotations

import copyreg
import logging
import multiprocessing
import os
import threading
import time
import types
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gateway.native.scheduler_loop import Plan, UnisolatedNodesTake, make_plan
from gateway.store.db import make_engine
from scheduler.model import SchedulerConfig

log = logging.getLogger("jobgate.scheduler")

PARENT_CHECK_S = 1.0  # how often the planner process looks whether the gateway's process still runs



def _read_only(mapping: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(mapping)


# SchedulerConfig keeps its per-queue numbers in read-only mappings, which pickle cannot send as they are.
copyreg.pickle(types.MappingProxyType, lambda m: (_read_only, (dict(m),)))

_sessions: sessionmaker[Session] | None = None  # in the planner process: its read-only sessions


def _open(url: str, gateway_pid: int) -> None:
    global _sessions
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


class PlannerProcess:
    """A scheduler_loop.Planner that makes each plan in one long-lived child process reading the database at `url`
    (SQLite). Started at once, so the first cycle does not wait for its imports; close() ends it."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._pool = self._start()
        self._engine: Engine | None = None  # for a plan made here, when the planner process died

    def _start(self) -> ProcessPoolExecutor:
        # spawn: a fork of a process with threads running (the loops, the ledger's writer) may copy a held lock.
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_open, initargs=(self._url, os.getpid()))
        pool.submit(_pid)  # starts the process and its imports now
        return pool

    @property
    def pid(self) -> int:
        """The planner process's pid (it is started when first asked)."""
        with self._lock:
            pool = self._pool
        return int(pool.submit(_pid).result())

    def __call__(self, now: datetime, config: SchedulerConfig, take: UnisolatedNodesTake) -> Plan:
        """The plan at `now`, made by the planner process; made here if that process died, which is then replaced.
        Raises what make_plan raises (a database error)."""
        with self._lock:
            pool = self._pool
        try:
            return pool.submit(_plan, now, config, take).result()
        except BrokenProcessPool:
            log.warning("the scheduler's planner process ended; this cycle is planned in the gateway, the next one "
                        "in a new planner process")
            with self._lock:
                if self._pool is pool:
                    self._pool = self._start()
            pool.shutdown(wait=False)
            if self._engine is None:
                self._engine = make_engine(self._url)
            with sessionmaker(self._engine)() as session, session.begin():
                return make_plan(session, now, config, take)

    def close(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._engine is not None:
            self._engine.dispose()
