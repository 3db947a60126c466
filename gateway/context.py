"""The running gateway's collaborators, composed once at start (gateway/bootstrap.py) and shared by every request.

Only the edges (api/, console/, cli/) and the composition root import it. Each room names the part it uses in a
Protocol of its own (gateway/decisions/deps.py, access/deps.py, jobs/deps.py, native/deps.py), which this object
satisfies; no service reaches for the whole of it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import nacl.signing
from sqlalchemy.orm import Session

from gateway.decisions.deps import Executor
from gateway.decisions.policy.engine import EmbeddedEngine
from gateway.decisions.policy.loader import PolicySet
from gateway.decisions.policy_sync import PolicySync
from gateway.decisions.ratelimit import RateLimiter
from gateway.decisions.refusal_counts import RefusalCounts
from gateway.decisions.transaction import after_commit, business_transaction
from gateway.execution.port import Execution
from gateway.housekeeping import Chore, OwnChore
from gateway.identity.token_cache import TokenCache
from gateway.leadership import Leadership, SoleLeadership
from gateway.metrics import Figures
from gateway.native.bus import CommandBus
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.signals import Signals
from ledger.service import Ledger
from scheduler.model import SchedulerConfig


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Gateway:
    settings: Settings
    db: Database
    ledger: Ledger
    policy_set: PolicySet
    policy: EmbeddedEngine
    command_key: nacl.signing.SigningKey
    # Whatever runs the jobs, behind its port: jobgate's own (gateway/native/) unless open_gateway was given another.
    execution: Execution = field(init=False)
    # Signals to and from the other replicas of the business database (PostgreSQL; gateway/store/signals.py).
    signals: Signals = field(default_factory=lambda: Signals(None))
    bus: CommandBus = field(default_factory=CommandBus)
    clock: Callable[[], datetime] = utcnow
    scheduler_kick: threading.Event = field(default_factory=threading.Event)
    # Held while the engine is swapped (policy reload) or its role bindings change with the DB.
    policy_lock: threading.RLock = field(default_factory=threading.RLock)
    # The policy set and bindings in force for every replica, checked before each decision (replicas).
    policy_sync: PolicySync = field(init=False)
    limiter: RateLimiter | None = None
    token_cache: TokenCache = field(default_factory=lambda: TokenCache(0))
    # The scheduler's numbers when set here (tests); otherwise read once from JOBGATE_SCHEDULER_CONFIG.
    scheduler_config: SchedulerConfig | None = None
    # Who carries out each action once a second person approved it (M2); filled at app start (bootstrap.py).
    executors: dict[str, Executor] = field(default_factory=dict)
    # Periodic chores by name, each bound to this gateway; registered at app start (bootstrap.py).
    chores: list[tuple[str, Chore]] = field(default_factory=list)
    # Chores over this process's own memory, run by every replica (gateway/housekeeping.py run_own).
    own_chores: list[tuple[str, OwnChore]] = field(default_factory=list)
    # The /metrics gauges each room reads from the business DB, in the order they are served (bootstrap.py).
    figures: list[Figures] = field(default_factory=list)
    # Refusals repeated within a window, counted into one later entry (gateway/decisions/refusals.py).
    refusal_counts: RefusalCounts = field(default_factory=RefusalCounts)
    # Whether this replica does the leader-only work (gateway/leadership.py); alone on its database it always does.
    leadership: Leadership = field(default_factory=lambda: SoleLeadership("embedded"))

    def __post_init__(self) -> None:
        self.policy_sync = PolicySync(self.signals, self.policy_lock)

    def after_commit(self, session: Session, action: Callable[[], None]) -> None:
        """Run `action` once `session`'s transaction has committed (never if it rolls back)."""
        after_commit(session, action)

    @contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator[Session]:
        """One business transaction (gateway/decisions/transaction.py): what it asked of whatever runs the jobs
        goes out once it commits. Immediate (the write lock up front on SQLite) unless the caller only reads."""
        with business_transaction(self.db, self.ledger, immediate=immediate) as session:
            yield session

    def close(self) -> None:
        self.signals.close()
        self.leadership.stop()
        self.ledger.close()
        self.db.close()

