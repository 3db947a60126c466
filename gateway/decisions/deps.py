"""What the decision services use of the running gateway, named so that they never reach for the whole of it.

app.py composes one object (gateway/context.py) that has all of these; each room names only the part it uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from gateway.decisions.policy.engine import EmbeddedEngine
from gateway.decisions.policy.loader import PolicySet
from gateway.decisions.policy_sync import PolicySync
from gateway.decisions.ratelimit import RateLimiter
from gateway.decisions.refusal_counts import RefusalCounts
from gateway.execution.port import Execution
from gateway.identity.auth import Caller
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Job
from gateway.store.service_tables import Approval
from ledger.service import Ledger

# Carries out an action once it is allowed after approval (M2): the session of the approving transaction, the
# request, its targets still live, and the approver. Each room registers its own at app start (bootstrap).
Executor = Callable[[Session, Approval, list[Job], Caller], dict[str, Any]]


class Decider(Protocol):
    """Deciding and recording: the clock, the ledger, the policy engine and set, the rate limiter, transactions,
    the executors of approved actions, and the execution port (where a job's files are, for an approval's
    summary; gateway/execution/port.py), and the policy set in force for every replica."""

    ledger: Ledger
    policy: EmbeddedEngine
    policy_set: PolicySet
    policy_sync: PolicySync
    limiter: RateLimiter | None
    executors: dict[str, Executor]
    execution: Execution

    @property
    def clock(self) -> Callable[[], datetime]: ...  # injected: tests move it, nothing here reads the wall clock

    def transaction(self, *, immediate: bool = True) -> AbstractContextManager[Session]: ...


class Reconciler(Decider, Protocol):
    """Closing decisions left without an outcome reads which database holds the business rows."""

    db: Database


class PolicyHolder(Decider, Protocol):
    """What swaps the policy set (reload, role bindings changed live): the settings it was loaded by, the
    business DB, and the lock held while the engine or its bindings change."""

    settings: Settings
    db: Database
    policy_lock: threading.RLock


class RefusalRecorder(Protocol):
    """Ledgering refused attempts (gateway/decisions/refusals.py): the ledger, the clock, the window repeats are
    counted in, and the counts of the windows still open."""

    ledger: Ledger
    settings: Settings
    refusal_counts: RefusalCounts

    @property
    def clock(self) -> Callable[[], datetime]: ...
