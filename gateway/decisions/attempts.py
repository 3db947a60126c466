"""The attempt one request makes: what it asked, who asked once they are known, and whether its decision or
refusal is in the ledger already.

Every refused attempt is an entry (README, H3). The decision pipeline ledgers the refusals it decides; every
other refusal (a 403 of a check outside the policy, a 404, a 409, a 422 of the request's meaning) is ledgered
where the error becomes an answer (gateway/decisions/refusals.py), from what this records. The request context
(gateway/api/deps.py, the console's `page`) begins an attempt; authentication names its caller; pipeline.decide
and any code that ledgers a refusal itself say so here, so that a refusal is one entry, never two.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.identity.auth import Caller
from ledger.service import Ticket


@dataclass
class Attempt:
    """One request as the ledger would name it. `body` is the raw request body (None: not to be recorded,
    e.g. a console form, which carries its CSRF token)."""

    method: str
    route: str  # the route's template, /v1/tokens/{token_id}/revoke
    path_params: dict[str, str] = field(default_factory=dict)
    query: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    caller: Caller | None = None
    # Entries that record this request's decision: seqs, or tickets of entries queued and not yet numbered (on a
    # ledger sequenced in PostgreSQL a ticket's seq is known only once its batch commits: never waited for here).
    ledgered: list[int | Ticket] = field(default_factory=list)

    def authenticated(self, caller: Caller) -> Caller:
        self.caller = caller
        return caller


_current: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("jobgate_attempt", default=None)


def begin(attempt: Attempt) -> Attempt:
    """Make `attempt` the current request's: code it calls (in its worker thread too, which runs in a copy of
    this context) notes into it."""
    _current.set(attempt)
    return attempt


def current() -> Attempt | None:
    return _current.get()


def ledgered(entry: int | Ticket) -> None:
    """The current request's decision, or its refusal, is the ledger entry `entry` (its seq, or the ticket of an
    entry queued): nothing more is written for the refusal. A no-op outside a request (the scheduler,
    housekeeping)."""
    attempt = _current.get()
    if attempt is not None and (not isinstance(entry, int) or entry >= 0):
        attempt.ledgered.append(entry)


def refused_at(exc: GatewayError, seq: int) -> None:
    """Code that ledgers a refusal itself (an approval's confirmation refused) says so: the answer names the
    entry (`ledger_seq`) and no second one is written for it."""
    exc.extra["ledger_seq"] = seq
    ledgered(seq)


def route_of(scope: Any) -> str:
    """The template of the route that matched (its path when none did)."""
    route = scope.get("route")
    return str(getattr(route, "path", None) or scope.get("path", ""))
