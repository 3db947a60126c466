"""One business transaction and the ledger entries that speak of it (DESIGN, one mutation's path, steps 5 and 7).

Entries queued in a transaction without waiting (pipeline.decide, pipeline.ledger_batch) are durable before it
commits, and before an error leaves it; if one cannot be written it rolls back with LedgerUnavailable. If it rolls
back after its outcome entries were written, one entry retracts them. Actions registered with `after_commit`
(waking node agents, for one) run once it has committed, never if it rolls back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from gateway.errors import LedgerUnavailable
from gateway.store.db import Database
from ledger.errors import LedgerError
from ledger.service import Ledger, Ticket

log = logging.getLogger("jobgate.ledger")

QUEUED_ENTRIES = "ledger_tickets"  # session.info key: entries queued for this transaction, not yet waited for
# session.info key: the outcome and transition entries this transaction wrote (seqs, or tickets of queued ones),
# which business_transaction retracts if it rolls back. Decisions are not among them: they stand either way.
REPORTED_ENTRIES = "ledger_reported"
_AFTER_COMMIT = "after_commit"


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run `action` once `session`'s business transaction has committed (never if it rolls back). In a plain
    database transaction (no business_transaction around it) there is nothing to run it: it is dropped."""
    actions = session.info.get(_AFTER_COMMIT)
    if actions is not None:
        actions.append(action)


@contextmanager
def business_transaction(db: Database, ledger: Ledger, *, immediate: bool = True) -> Iterator[Session]:
    """One business transaction. Immediate (the write lock up front on SQLite) unless the caller only reads.
    Raises LedgerUnavailable when an entry it queued cannot be written (it then rolls back)."""
    reported: list[Ticket | int] = []
    try:
        with db.transaction(immediate=immediate) as session:
            session.info[_AFTER_COMMIT] = []
            session.info[QUEUED_ENTRIES] = []
            session.info[REPORTED_ENTRIES] = reported
            try:
                yield session
                session.flush()  # this transaction's writes overlap the ledger's fsync of the entries it queued
            finally:
                settle_queued_entries(session)
            after = session.info[_AFTER_COMMIT]
    except Exception as e:
        if reported:
            _retract(ledger, reported, e)
        raise
    for action in after:
        action()


def _retract(ledger: Ledger, reported: list[Ticket | int], error: Exception) -> None:
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
        ledger.append("outcome", body)
    except LedgerError as e:
        log.error("ledger entries %s report a change that was rolled back; the retraction failed: %s", seqs, e)


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
