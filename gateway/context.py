"""The running gateway's collaborators, built once in create_app and shared by every request."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import nacl.signing
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.bus import CommandBus
from gateway.db import Database
from gateway.errors import LedgerUnavailable
from gateway.models import RoleBinding as RoleBindingRow
from gateway.policy.engine import EmbeddedEngine, RoleBinding
from gateway.policy.loader import PolicySet
from gateway.ratelimit import RateLimiter
from gateway.refusal_counts import RefusalCounts
from gateway.settings import Settings
from gateway.token_cache import TokenCache
from ledger.errors import LedgerError
from ledger.service import Ledger, Ticket

log = logging.getLogger("jobgate.ledger")


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
    bus: CommandBus = field(default_factory=CommandBus)
    clock: Callable[[], datetime] = utcnow
    scheduler_kick: threading.Event = field(default_factory=threading.Event)
    # Held while the engine is swapped (policy reload) or its role bindings change with the DB.
    policy_lock: threading.RLock = field(default_factory=threading.RLock)
    limiter: RateLimiter | None = None
    token_cache: TokenCache = field(default_factory=lambda: TokenCache(0))
    refusal_counts: RefusalCounts = field(default_factory=RefusalCounts)  # see gateway/refusals.py

    def after_commit(self, session: Session, action: Callable[[], None]) -> None:
        """Run `action` once `session`'s transaction has committed (never if it rolls back)."""
        session.info["after_commit"].append(action)

    @contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator[Session]:
        """One business transaction; node agents are woken only after it commits.

        Immediate (the write lock up front on SQLite) unless the caller only reads. Ledger entries queued
        in it without waiting (pipeline.decide, pipeline.ledger_batch) are durable before it commits, and
        before an error leaves it; if one cannot be written, it rolls back with LedgerUnavailable."""
        reported: list[Ticket | int] = []
        try:
            with self.db.transaction(immediate=immediate) as session:
                session.info["notify_nodes"] = set()
                session.info["after_commit"] = []
                session.info[QUEUED_ENTRIES] = []
                session.info[REPORTED_ENTRIES] = reported
                try:
                    yield session
                    session.flush()  # this transaction's writes overlap the ledger's fsync of the entries it queued
                finally:
                    settle_queued_entries(session)
                notify = session.info["notify_nodes"]
                after = session.info["after_commit"]
        except Exception as e:
            if reported:
                self._retract(reported, e)
            raise
        self.bus.notify(notify)
        for action in after:
            action()

    def _retract(self, reported: list[Ticket | int], error: Exception) -> None:
        """The transaction rolled back (an error after its outcomes were written, or a failed commit), so the
        entries it wrote to say what it changed are untrue: one entry says so, naming them. Its decisions
        stand as decided. If even that cannot be written, the log says which entries are untrue."""
        # Every ticket was waited for before the error left the transaction; one not waited for is one that
        # was never written (settle_queued_entries stops at the first that fails, and those behind it fail).
        seqs = [e if isinstance(e, int) else e.seq for e in reported if isinstance(e, int) or e.waited]
        if not seqs:
            return
        body = {"result": "rolled_back", "retracts": seqs, "error": type(error).__name__,
                "why": "the business transaction these entries report on did not commit: nothing they say it "
                       "changed was changed"}
        try:
            self.ledger.append("outcome", body)
        except LedgerError as e:
            log.error("ledger entries %s report a change that was rolled back; the retraction failed: %s", seqs, e)

    def close(self) -> None:
        self.ledger.close()
        self.db.close()


QUEUED_ENTRIES = "ledger_tickets"  # session.info key: entries queued for this transaction, not yet waited for
# session.info key: the outcome and transition entries this transaction wrote (seqs, or tickets of queued ones),
# which Gateway.transaction retracts if it rolls back. Decisions are not among them: they stand either way.
REPORTED_ENTRIES = "ledger_reported"


def settle_queued_entries(session: Session) -> None:
    """Wait until the ledger entries this transaction queued are durable. Before its
    commit, and before any entry that may cite one is appended: if one cannot be written, the entries
    queued behind it fail too and are numbered again, so a citation appended after that would point at
    another entry. Raises LedgerUnavailable."""
    tickets: list[Ticket] = session.info.get(QUEUED_ENTRIES, [])
    while tickets:
        try:
            tickets[0].wait()
        except LedgerError as e:
            tickets.clear()
            raise LedgerUnavailable(f"the ledger could not record this change ({e}); nothing was changed") from e
        del tickets[0]


def load_bindings(session: Session) -> list[RoleBinding]:
    rows = session.scalars(select(RoleBindingRow)).all()
    return [RoleBinding(principal=r.principal_id, role=r.role, project=r.project) for r in rows]
