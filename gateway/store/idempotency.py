"""Idempotency-Key records (issue 28, the IETF httpapi idempotency-key draft): one row per caller and key, in the
business database, so that a retry on any replica finds the first request's answer.

A row is reserved (`processing`) before the request runs, by this attempt's `holder` token. Every write
transaction the request then opens takes the row in its first statement and marks it `acted` (Database.transaction
calls `claim_row`; a submission on SQLite marks it in the one statement that writes its rows): the mark commits
with the action or rolls back with it, so a crash between the action and the answer being stored leaves `acted`,
never "done but not recorded". The answer is stored (`done`) after the action. `holder` fences: a retry may take
over a reservation whose lease ran out (its replica died before acting), and the first attempt's transactions then
find the row no longer theirs and roll back, so the action happens once.
"""

from __future__ import annotations

import enum
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Connection,
    Integer,
    LargeBinary,
    String,
    Table,
    delete,
    exists,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from gateway.errors import Conflict
from gateway.store.models import Base

RETENTION = timedelta(hours=24)  # a key is remembered this long after its first use, then forgotten (purged)
LEASE = timedelta(seconds=10)  # a reservation nobody acted on may be taken over by a retry after this long
# While its request runs, a reservation's lease is renewed this often (gateway/api/idempotency.py), so that only a
# request whose replica died is taken over, not one that is slow (a stop of many jobs, a policy server that lags).
RENEW_EVERY = LEASE / 3
PROCESSING, ACTED, DONE = "processing", "acted", "done"


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    scope: Mapped[str] = mapped_column(String(160), primary_key=True)  # whose key: `principal:ID` or a credential's
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))  # SHA-256 of method, path, query and body
    holder: Mapped[str] = mapped_column(String(32))  # the attempt that holds the reservation (fencing token)
    state: Mapped[str] = mapped_column(String(16))  # processing | acted | done
    created_at: Mapped[datetime] = mapped_column(index=True)
    lease_until: Mapped[datetime]
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    headers: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # [[name, value], ...] as sent
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


@dataclass(frozen=True)
class Claim:
    """The reservation the current request holds (set by the API's middleware around the request)."""

    scope: str
    key: str
    holder: str


CURRENT: ContextVar[Claim | None] = ContextVar("idempotency_claim", default=None)


class Superseded(Conflict):
    """This attempt's reservation was taken over by a retry (its lease ran out): it must not act."""

    kind, title = "idempotency-key-superseded", "A retry with this Idempotency-Key took over"


SUPERSEDED_DETAIL = ("a retry with the same Idempotency-Key took this request over while it waited; it acts instead,"
                     " and nothing was done here")


class Found(enum.Enum):
    NEW = "new"  # reserved for this attempt: run the request
    REPLAY = "replay"  # answered before: send that answer again
    MISMATCH = "mismatch"  # the key was used for another request
    BUSY = "busy"  # the first request is still being processed
    LOST = "lost"  # the first request acted, and its replica died before its answer was stored


def reserve_fresh(connection: Connection, claim: Claim, fingerprint: str, now: datetime) -> bool:
    """Reserve a key nobody used (the common case) by one statement on a connection that commits each statement
    (Database.single_statement); False when the key has a row, which reserve() then reads. The row is inserted
    only if none is there when the statement starts, so that on PostgreSQL the insert does not wait for a row the
    first request's write transaction holds (reserve() answers that at once, with NOWAIT); only a first use that
    reserves and starts writing within this statement's few microseconds can make it wait, for that write. A
    concurrent first use of the same key raises IntegrityError, as in reserve()."""
    table = cast(Table, IdempotencyKey.__table__)
    fresh = select(*(literal(v, table.c[k].type) for k, v in (
        ("scope", claim.scope), ("key", claim.key), ("fingerprint", fingerprint), ("holder", claim.holder),
        ("state", PROCESSING), ("created_at", now), ("lease_until", now + LEASE)))).where(
        ~exists().where(table.c.scope == claim.scope, table.c.key == claim.key))
    done = connection.execute(insert(table).from_select(
        ["scope", "key", "fingerprint", "holder", "state", "created_at", "lease_until"], fresh)
        .execution_options(preserve_rowcount=True))  # an INSERT's count is otherwise not kept (psycopg: -1)
    return bool(done.rowcount == 1)


def reserve(session: Session, claim: Claim, fingerprint: str, now: datetime) -> tuple[Found, IdempotencyKey]:
    """Reserve `claim`'s key for this attempt, or say why not. A concurrent first use of the same key raises
    IntegrityError at the insert, and a row locked by the first request's write transaction (PostgreSQL, NOWAIT)
    OperationalError 55P03, rather than waiting for it: the caller answers both as BUSY."""
    row = session.get(IdempotencyKey, (claim.scope, claim.key), with_for_update={"nowait": True})
    if row is not None and row.created_at <= now - RETENTION:  # expired, not purged yet: forgotten all the same
        session.delete(row)
        session.flush()
        row = None
    if row is None:
        row = IdempotencyKey(scope=claim.scope, key=claim.key, fingerprint=fingerprint, holder=claim.holder,
                             state=PROCESSING, created_at=now, lease_until=now + LEASE)
        session.add(row)
        session.flush()
        return Found.NEW, row
    if row.fingerprint != fingerprint:
        return Found.MISMATCH, row
    if row.state == DONE:
        return Found.REPLAY, row
    if row.lease_until > now:
        return Found.BUSY, row
    if row.state == ACTED:
        return Found.LOST, row
    row.holder, row.lease_until = claim.holder, now + LEASE  # its holder died before acting: this attempt acts
    return Found.NEW, row


def renew(connection: Connection, claim: Claim, now: datetime) -> bool:
    """Extend the lease of a reservation this attempt still holds, by one statement on a connection that commits
    each statement (Database.single_statement). False when a retry has taken it over, or it is answered."""
    table = cast(Table, IdempotencyKey.__table__)
    done = connection.execute(update(table).where(
        table.c.scope == claim.scope, table.c.key == claim.key, table.c.holder == claim.holder,
        table.c.state.in_((PROCESSING, ACTED))).values(lease_until=now + LEASE))
    return bool(done.rowcount == 1)


def claim_row(session: Session) -> None:
    """In a write transaction of a request holding a reservation: take its row (locked until this transaction
    ends) and mark it acted, with this transaction. Raises Superseded when a retry has taken it over."""
    claim = CURRENT.get()
    if claim is None:
        return
    done = session.connection().execute(
        update(IdempotencyKey)
        .where(IdempotencyKey.scope == claim.scope, IdempotencyKey.key == claim.key,
               IdempotencyKey.holder == claim.holder, IdempotencyKey.state.in_((PROCESSING, ACTED)))
        .values(state=ACTED))
    if done.rowcount != 1:
        raise Superseded(SUPERSEDED_DETAIL)


def finish(connection: Connection, claim: Claim, status: int, headers: list[list[str]], body: bytes,
           keep: bool) -> bool:
    """Store the answer under the key; or, when it need not be kept (`keep` False: an answer a retry may
    change, such as a 503) and the request did not act, forget the key so that a retry runs again. Returns
    whether the answer was stored. On a connection that commits each statement (Database.single_statement): each
    statement is fenced by `holder`, so a retry that took the key over keeps it."""
    table = cast(Table, IdempotencyKey.__table__)
    mine = (table.c.scope == claim.scope, table.c.key == claim.key, table.c.holder == claim.holder)
    if not keep and connection.execute(delete(table).where(*mine, table.c.state == PROCESSING)).rowcount:
        return False
    done = connection.execute(update(table).where(*mine).values(state=DONE, status=status, headers=headers,
                                                                 body=body))
    return bool(done.rowcount == 1)


def purge(session: Session, now: datetime) -> int:
    """Forget the keys first used longer ago than RETENTION. Returns how many."""
    result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at <= now - RETENTION))
    return int(getattr(result, "rowcount", 0) or 0)


def held(session: Session, scope: str, key: str) -> IdempotencyKey | None:
    """The row of a key (for tests and forensics)."""
    return session.scalars(select(IdempotencyKey).where(IdempotencyKey.scope == scope,
                                                        IdempotencyKey.key == key)).first()
