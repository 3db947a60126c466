"""Safe retries: an `Idempotency-Key` on any POST, PUT or DELETE of the API (issue 28; the IETF httpapi
idempotency-key draft's semantics).

The key is an sf-string (`"8e03978e-..."`, RFC 8941 §3.3.3) or, as many clients send it, bare (`8e03978e-...`),
of at most 255 characters. It is optional: without one a request is served as it always was. With one, keys are
scoped to the authenticated caller (a key of yours never finds my answer), and a request is fingerprinted by its method,
path, query and body:

- first use: the key is reserved, the request runs (its reservation's lease renewed while it does), and its answer
  is stored before it is sent;
- the same key and fingerprint again, once answered: the stored answer (status, headers, body), marked
  `Idempotent-Replayed: true`; nothing is decided, ledgered or done again;
- the same key with another request: 422; while the first is still being processed: 409 with Retry-After;
- an answer a retry may change (5xx, 408, 409, 429) is not kept unless the request acted: the key is forgotten.

Keys are kept 24 hours from first use (gateway/store/idempotency.py: RETENTION), then purged by a chore. How a
crash between the action and its answer is covered is said there and in gateway/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import anyio.to_thread
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.access.breakglass import PREFIX as BREAKGLASS_PREFIX
from gateway.context import Gateway
from gateway.errors import GatewayError, problem
from gateway.identity.auth import bearer_facts
from gateway.store import idempotency
from gateway.store.idempotency import Claim, Found

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY = 255
METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})  # every mutating method (a PUT is decided and ledgered too)
PREFIX = "/v1/"
# Answers a retry may change: not kept, unless the request acted (then whatever it answered is its answer).
TRANSIENT = frozenset({408, 409, 425, 429})
# A bare key: visible ASCII without quotes, backslashes, commas or spaces. Wider than an sf-token (RFC 8941 §3.3.4,
# which must begin with a letter), since clients commonly send a bare UUID, and one in ten begins with a digit.
_TOKEN = re.compile(r'[!#-+\--\[\]-~]+')
_STRING_CHAR = re.compile(r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*')  # inside an sf-string's quotes
_HEADER_KEY = HEADER.lower().encode()
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL: FOR UPDATE NOWAIT found the row locked
log = logging.getLogger("jobgate.idempotency")
T = TypeVar("T")


class BadKey(GatewayError):
    status, kind, title = 400, "idempotency-key-invalid", "Idempotency-Key header invalid"


def parse_key(values: list[bytes]) -> str:
    """The key of the header's values. Raises BadKey."""
    if len(values) != 1:
        raise BadKey(f"send one {HEADER} header, not {len(values)}")
    try:
        raw = values[0].decode("ascii").strip()
    except UnicodeDecodeError:
        raise BadKey(f"the {HEADER} header must be ASCII: a quoted string such as \"8e03978e-40d5-43e8-bc93-"
                     "6894a57f9324\"") from None
    key = _item(raw)
    if key is None:
        # Two header fields joined into one by a proxy or client (RFC 9110 §5.3) are two keys, not a malformed one.
        if "," in raw and all(_item(part.strip()) is not None for part in raw.split(",")):
            raise BadKey(f"send one {HEADER} header, not {len(raw.split(','))}")
        raise BadKey(f"the {HEADER} header must be a quoted string of printable ASCII (RFC 8941 sf-string), such"
                     " as \"8e03978e-40d5-43e8-bc93-6894a57f9324\"")
    if not key or len(key) > MAX_KEY:
        raise BadKey(f"an {HEADER} holds 1 to {MAX_KEY} characters; this one has {len(key)}")
    return key


def _item(raw: str) -> str | None:
    """The key an sf-string or bare token says, or None when `raw` is neither."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"' and _STRING_CHAR.fullmatch(raw[1:-1]):
        return re.sub(r'\\(["\\])', r"\1", raw[1:-1])
    return raw if _TOKEN.fullmatch(raw) else None


def fingerprint(scope: Scope, body: bytes) -> str:
    h = hashlib.sha256()
    for part in (scope["method"].encode(), scope["path"].encode(), scope.get("query_string", b""), body):
        h.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two requests share a fingerprint by framing
        h.update(part)
    return h.hexdigest()


def caller_scope(gw: Gateway, session: Session, authorization: str | None) -> str | None:
    """Whose key this is: the authenticated principal, or (break-glass) the credential itself. None when the
    request does not authenticate: it is then served without the key, and refused as it always was."""
    scheme, _, secret = (authorization or "").partition(" ")
    secret = secret.strip()
    if scheme.lower() == "bearer" and secret.startswith(BREAKGLASS_PREFIX):
        return "breakglass:" + hashlib.sha256(secret.encode()).hexdigest()
    try:
        return "principal:" + bearer_facts(session, authorization, gw.clock(), cache=gw.token_cache).principal_id
    except GatewayError:
        return None


Reserved = tuple[Found | None, int, list[list[str]], bytes, float]


def _reserve(gw: Gateway, authorization: str | None, key: str, holder: str, print_: str) -> tuple[Claim | None,
                                                                                                 Reserved]:
    """Who calls and, for them, the key reserved or why not. No claim when the request does not authenticate.
    A fresh key (nearly every request) costs one statement; a key that has a row is read in a transaction."""
    claim = None
    try:
        with gw.db.transaction(immediate=False) as session:
            who = caller_scope(gw, session, authorization)
        if who is None:
            return None, (None, 0, [], b"", 0.0)
        claim = Claim(who, key, holder)
        with gw.db.single_statement() as connection:
            if idempotency.reserve_fresh(connection, claim, print_, gw.clock()):
                return claim, (Found.NEW, 0, [], b"", 0.0)
        with gw.db.transaction() as session:
            found, row = idempotency.reserve(session, claim, print_, gw.clock())
            wait = max(1.0, (row.lease_until - gw.clock()).total_seconds())
            return claim, (found, row.status or 0, list(row.headers or []), bytes(row.body or b""), wait)
    except IntegrityError:  # another attempt inserted the same key a moment ago
        if claim is None:
            raise
        return claim, (Found.BUSY, 0, [], b"", idempotency.LEASE.total_seconds())
    except OperationalError as e:
        if getattr(e.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise  # the database is unreachable: answered 503 as anywhere else
        return claim, (Found.BUSY, 0, [], b"", 1.0)  # the first request's write transaction holds the row: acting


def _finish(gw: Gateway, claim: Claim, status: int, headers: list[list[str]], body: bytes) -> None:
    keep = status < 500 and status not in TRANSIENT
    with gw.db.single_statement() as connection:
        idempotency.finish(connection, claim, status, headers, body, keep)


async def _off_loop(gw: Gateway, fn: Callable[[], T]) -> T:
    """fn() on the event loop where it cannot wait (SQLite, its write lock free: a statement or two on a local
    file), else in a worker thread. The hop there and back cost more than the statements (as for submissions,
    gateway/jobs/submission.py)."""
    if gw.db.is_sqlite and not gw.db.writer_busy:
        return fn()
    return await anyio.to_thread.run_sync(fn)


class IdempotencyMiddleware:
    """See the module's doc. Inside the body limit (a body is read whole here) and outside the routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in METHODS or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == _HEADER_KEY]
        if not values:
            await self.app(scope, receive, send)
            return
        try:
            key = parse_key(values)
        except BadKey as e:
            await problem(e.status, e.kind, e.title, e.detail, scope["path"])(scope, receive, send)
            return
        body, receive = await _read_body(receive)
        gw: Gateway = scope["app"].state.gateway
        authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            claim, (found, status, headers, stored, wait) = await _off_loop(
                gw, partial(_reserve, gw, authorization, key, secrets.token_hex(16), fingerprint(scope, body)))
        except OperationalError as e:  # out here the app's handlers do not answer it: the same 503 they would
            log.error("%s %s: business database unavailable for its Idempotency-Key: %s", scope["method"],
                      scope["path"], e.orig)
            await problem(503, "database-unavailable", "Business database unavailable: request refused",
                          "the business database could not be reached to look up this Idempotency-Key; nothing"
                          " was changed, try again later", scope["path"])(scope, receive, send)
            return
        if claim is None:  # not authenticated: served without the key, and refused as it always was
            await self.app(scope, receive, send)
        elif found is Found.NEW:
            await self._run(gw, claim, scope, receive, send)
        elif found is Found.REPLAY:
            log.info("replayed the answer to %s %s for Idempotency-Key %r", scope["method"], scope["path"], key)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
                        + [(REPLAYED.lower().encode(), b"true")]})
            await send({"type": "http.response.body", "body": stored})
        elif found is Found.MISMATCH:
            await problem(422, "idempotency-key-reused", "Idempotency-Key already used",
                          f"this {HEADER} was used for another request (another method, path or body) in the last"
                          " 24 hours; send a new key for a new request", scope["path"])(scope, receive, send)
        else:
            busy = found is Found.BUSY
            detail = ("the first request with this Idempotency-Key is still being processed; try again shortly"
                      if busy else "the first request with this Idempotency-Key was carried out, but its gateway"
                      " stopped before its answer was kept; read the result (the job, the ledger) instead of"
                      " retrying")
            answer = problem(409, "idempotency-key-in-use" if busy else "idempotency-answer-lost",
                             "A request is outstanding for this Idempotency-Key" if busy
                             else "The answer to this Idempotency-Key was lost", detail, scope["path"])
            if busy:
                answer.headers["Retry-After"] = str(int(wait + 0.999))
            await answer(scope, receive, send)

    async def _run(self, gw: Gateway, claim: Claim, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request holding the reservation; keep its answer, then send it (so that a retry the moment
        the answer arrives finds it stored)."""
        start: Message | None = None
        parts: list[bytes] = []

        async def keep(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        token = idempotency.CURRENT.set(claim)
        renewing = asyncio.create_task(_renew_lease(gw, claim))
        try:
            await self.app(scope, receive, keep)
        except BaseException:  # answered as a 500 further out: not an answer to keep, unless the request acted
            idempotency.CURRENT.reset(token)
            await _stop(renewing)
            await _off_loop(gw, partial(_finish, gw, claim, 500, [], b""))
            raise
        idempotency.CURRENT.reset(token)
        await _stop(renewing)
        assert start is not None, "the app answered nothing"
        body = b"".join(parts)
        headers = [[n.decode("latin-1"), v.decode("latin-1")] for n, v in start.get("headers", [])]
        try:
            await _off_loop(gw, partial(_finish, gw, claim, int(start["status"]), headers, body))
        except Exception:  # the answer still goes out; a retry finds the key acted (409) or reserved until its lease
            log.exception("the answer to Idempotency-Key %r could not be kept", claim.key)
        await send(start)
        await send({"type": "http.response.body", "body": body})


async def _renew_lease(gw: Gateway, claim: Claim) -> None:
    """Keep the reservation while the request runs: a retry takes over only once this replica stops renewing it
    (it died), never from a request that is merely slow, which would then decide twice."""
    every = idempotency.RENEW_EVERY.total_seconds()
    while True:
        await asyncio.sleep(every)
        try:
            if not await _off_loop(gw, partial(_renew, gw, claim)):
                return  # answered, or taken over by a retry: the request's own write then finds out
        except Exception:  # the database is away: the request's own statements will say so
            log.warning("the lease of Idempotency-Key %r could not be renewed", claim.key, exc_info=True)


def _renew(gw: Gateway, claim: Claim) -> bool:
    with gw.db.single_statement() as connection:
        return idempotency.renew(connection, claim, gw.clock())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body (the body limit outside this bounds it), and a receive that hands it to the app again."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(parts)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay
