"""Periodic chores beside the scheduler loop: receipts that timed out, expired grants and approvals, decisions left
without an outcome by a transaction that raised (gateway/decisions/reconcile.py), retention, R4 auto-offline and
purges. The rooms that own them register them at app start (gateway/bootstrap.py); this loop knows none of them.

Each task runs in its own transaction so one failing chore never blocks the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

log = logging.getLogger("jobgate.housekeeping")

Chore = Callable[[Session], object]
T = TypeVar("T")


@dataclass(frozen=True)
class ReadFirst(Generic[T]):
    """A chore whose reads need no lock: `read()` runs before its transaction opens, `write(session, what_read)`
    in it. A write transaction on SQLite holds the one write lock, so a chore that read a lot inside one kept every
    request that writes waiting meanwhile."""

    read: Callable[[], T]
    write: Callable[[Session, T], object]

    def __call__(self, session: Session) -> object:
        """Read and write in this one transaction."""
        return self.write(session, self.read())


OwnChore = Callable[[], object]


class Chores(Protocol):
    """The chores registered at app start, by name, and a transaction to run each in; and the chores over this
    process's own memory, which every replica runs, leader or not."""

    chores: list[tuple[str, Chore]]
    own_chores: list[tuple[str, OwnChore]]

    def transaction(self, *, immediate: bool = True) -> AbstractContextManager[Session]: ...


def run_all(gw: Chores) -> None:
    for name, chore in list(gw.chores):
        try:
            if isinstance(chore, ReadFirst):
                read = chore.read()
                with gw.transaction() as session:
                    chore.write(session, read)
                continue
            with gw.transaction() as session:
                chore(session)
        except Exception:  # one chore's failure is logged with its trace; the others still run
            log.exception("housekeeping task %s failed", name)
    run_own(gw)


def run_own(gw: Chores) -> None:
    """The chores over this process's own memory (a follower's refusal counts are its own to write)."""
    for name, chore in list(gw.own_chores):
        try:
            chore()
        except Exception:
            log.exception("housekeeping task %s failed", name)


class HousekeepingLoop(threading.Thread):
    def __init__(self, gw: Chores, interval_s: float = 30.0, *, leads: Callable[[], bool] = lambda: True) -> None:
        super().__init__(name="jobgate-housekeeping", daemon=True)
        self.gw = gw
        self.leads = leads  # chores are the leader's (gateway/leadership.py): a follower's rounds do nothing
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            if self.leads():
                run_all(self.gw)
            else:
                run_own(self.gw)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
