"""Periodic chores beside the scheduler loop: receipts that timed out, decisions left without an outcome by a
transaction that raised (gateway/reconcile.py), and whatever else registers.

Each task runs in its own transaction so one failing chore never blocks the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session

from gateway.approvals import expire_due
from gateway.breakglass import sweep_expired
from gateway.context import Gateway
from gateway.obligations import sweep_timed_out_receipts
from gateway.reconcile import reconcile_task
from gateway.refusals import flush_counts

log = logging.getLogger("jobgate.housekeeping")

Task = Callable[[Gateway, Session], object]
TASKS: list[tuple[str, Task]] = [
    ("receipts", sweep_timed_out_receipts),
    ("break-glass expiry", sweep_expired),
    ("approval expiry", expire_due),
    ("decisions without an outcome", reconcile_task),
    ("counts of repeated refusals", lambda gw, _session: flush_counts(gw)),
]


def register(name: str, task: Task) -> None:
    """Add a periodic chore (e.g. checkpoint retention, R4 auto-offline)."""
    TASKS.append((name, task))


def run_all(gw: Gateway) -> None:
    for name, task in list(TASKS):
        try:
            with gw.transaction() as session:
                task(gw, session)
        except Exception:  # one chore's failure is logged with its trace; the others still run
            log.exception("housekeeping task %s failed", name)


class HousekeepingLoop(threading.Thread):
    def __init__(self, gw: Gateway, interval_s: float = 30.0) -> None:
        super().__init__(name="jobgate-housekeeping", daemon=True)
        self.gw = gw
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            run_all(self.gw)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
