"""Refused attempts in the ledger: the entry for a refusal the decision pipeline did not decide.

README, H3: every attempt, allowed or refused, is recorded with the caller's name. The pipeline ledgers the
decisions it makes, refusals among them; this writes one `refusal` entry for every other 4xx answer to a caller
whose identity is known: who (the actor as a decision names it), what was asked (method, route, path
parameters, query, the JSON body or its digest), and what refused it (status, problem type, the policy's rules
if it gave any, else the check in the gateway that raised, and its words). It is called where an error
becomes an answer: the API's problem+json handler (gateway/errors.py) and the console's `page`.

Not entries: answers to callers without an identity (no token, an unknown or expired one, a request malformed
before its token was looked at) — a flood of those must not be able to fill the ledger; they are in the access
log. Nor 5xx answers, which are outages rather than refusals. Writing the entry never changes the answer: if
the ledger cannot take it, the caller still gets the refusal and the log says what was refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.decisions.attempts import Attempt
from gateway.decisions.deps import RefusalRecorder
from gateway.decisions.pipeline import durable
from gateway.decisions.refusal_counts import Window
from gateway.errors import GatewayError, Unauthenticated
from ledger.entry import canonical
from ledger.errors import InvalidEntry, LedgerError
from ledger.service import Ticket

KIND = "refusal"
BODY_KEPT = 4096  # bytes of a JSON request body kept as it came; a larger one (or one not JSON) by its digest
log = logging.getLogger("jobgate.refusals")


def is_refusal(exc: GatewayError) -> bool:
    """A 4xx answer about what was asked, not about who is asking (401) or a server that cannot answer (5xx)."""
    return 400 <= exc.status < 500 and not isinstance(exc, Unauthenticated)


def to_record(attempt: Attempt | None, exc: GatewayError) -> bool:
    """Whether the refusal is to be written: it is one, its caller is known, and nothing recorded it yet."""
    return attempt is not None and attempt.caller is not None and not attempt.ledgered and is_refusal(exc)


async def on_api_refusal(request: Request, exc: GatewayError) -> None:
    """The API's hook (gateway/errors.py install_error_handlers): ledger the refusal of the request's attempt."""
    attempt = getattr(request.state, "attempt", None)
    if isinstance(attempt, Attempt) and to_record(attempt, exc):
        await ledger_refusal(request.app.state.gateway, attempt, exc)


async def ledger_refusal(gw: RefusalRecorder, attempt: Attempt, exc: GatewayError) -> None:
    """Write the refusal (or count it, see gateway/decisions/refusal_counts.py) and add its seq to the answer
    (`ledger_seq`). On the event loop: the entry is queued and awaited without holding a thread. Raises nothing."""
    queued: _Queued | None = None
    try:
        queued = _queue(gw, attempt, exc)
        if queued.ticket is not None:
            await durable(queued.ticket)
    except Exception as e:  # a refusal must stay the refusal, whatever failed here
        _unrecorded(gw, attempt, exc, e, queued)
        return
    exc.extra["ledger_seq"] = queued.seq


def ledger_refusal_sync(gw: RefusalRecorder, attempt: Attempt, exc: GatewayError) -> None:
    """The same from a worker thread (the console's pages). Raises nothing."""
    queued: _Queued | None = None
    try:
        queued = _queue(gw, attempt, exc)
        if queued.ticket is not None:
            queued.ticket.wait()
    except Exception as e:  # as above
        _unrecorded(gw, attempt, exc, e, queued)
        return
    exc.extra["ledger_seq"] = queued.seq


def flush_counts(gw: RefusalRecorder, *, everything: bool = False) -> None:
    """Write the count entries of the windows that have closed (all of them at shutdown). Raises nothing."""
    closed = gw.refusal_counts.take_closed(gw.clock(), gw.settings.refusal_window_s, everything=everything)
    if not closed:
        return
    try:
        gw.ledger.append_many([(KIND, _count_body(w), None) for w in closed])
    except LedgerError as e:
        for w in closed:
            _count_unrecorded(w, e)


@dataclass(frozen=True)
class _Queued:
    key: str
    seq: int  # the entry that records the refusal
    ticket: Ticket | None  # to wait for, when that entry is new (None: counted into one written earlier)
    closed: tuple[Window, ...] = ()  # windows whose counts were queued with it


def _queue(gw: RefusalRecorder, attempt: Attempt, exc: GatewayError) -> _Queued:
    """Queue the refusal's entry, with the counts of windows that have closed, or count it. Raises LedgerError."""
    body = refusal_body(attempt, exc)
    key = hashlib.sha256(json.dumps([body["actor"], body["asked"], body["refusal"]], sort_keys=True,
                                    default=str).encode()).hexdigest()
    now, window_s = gw.clock(), gw.settings.refusal_window_s
    counts = gw.refusal_counts
    seq = counts.counted(key, now, window_s)
    if seq is not None:
        return _Queued(key, seq, None)
    if window_s > 0:
        body["count"] = 1
        body["window_s"] = window_s
        body["repeats"] = (f"identical refusals in the next {window_s:g} s are counted, not written each; one later"
                           " entry (repeats_of this seq) says how many")
    closed = counts.take_closed(now, window_s, room_for=1)
    entries: list[tuple[str, dict[str, Any], None]] = [(KIND, _count_body(w), None) for w in closed]
    try:
        try:
            tickets = gw.ledger.enqueue_many([*entries, (KIND, body, None)])
        except InvalidEntry:
            # A body the ledger cannot encode exactly (a number past 2**53, say): kept by its digest only.
            body["asked"] = _asked(attempt, keep_body=False)
            tickets = gw.ledger.enqueue_many([*entries, (KIND, body, None)])
    except LedgerError as e:  # (closed, or refusing writes): the counts taken out go to the log
        for w in closed:
            _count_unrecorded(w, e)
        raise
    ticket = tickets[-1]
    counts.open(key, ticket.seq, body, now, window_s)
    return _Queued(key, ticket.seq, ticket, tuple(closed))


def refusal_body(attempt: Attempt, exc: GatewayError) -> dict[str, Any]:
    """The entry: who, what was asked, what refused it."""
    caller = attempt.caller
    assert caller is not None
    refusal: dict[str, Any] = {"status": exc.status, "type": exc.kind, "detail": exc.detail,
                               "check": _raised_in(exc)}
    rules = exc.extra.get("rules")
    if isinstance(rules, list) and rules:
        refusal["rules"] = [str(r) for r in rules]
    body: dict[str, Any] = {
        "result": "refused",
        "action": f"{attempt.method} {attempt.route}",
        "actor": caller.to_json(),
        "source": caller.source,
        "asked": _asked(attempt, keep_body=True),
        "refusal": refusal,
        "reason": exc.detail,
        "bypass": caller.breakglass is not None,
    }
    job_id = attempt.path_params.get("job_id")
    if job_id and exc.status != 404:
        # So that a job's history (ledger filter, forensics) lists what was refused on it; a 404 names no job.
        body["job_id"] = job_id
    return body


def _asked(attempt: Attempt, *, keep_body: bool) -> dict[str, Any]:
    asked: dict[str, Any] = {"method": attempt.method, "route": attempt.route}
    if attempt.path_params:
        asked["path_params"] = dict(attempt.path_params)
    if attempt.query:
        asked["query"] = [list(pair) for pair in attempt.query]
    raw = attempt.body
    if raw:
        parsed = _small_json(raw) if keep_body else None
        if parsed is not None:
            asked["body"] = parsed
        else:
            asked["body_sha256"] = hashlib.sha256(raw).hexdigest()
            asked["body_bytes"] = len(raw)
    return asked


def _small_json(raw: bytes) -> Any:
    if len(raw) > BODY_KEPT:
        return None
    try:
        parsed = json.loads(raw)
        canonical(parsed)
    except (ValueError, InvalidEntry, RecursionError):
        return None
    return parsed


def _raised_in(exc: BaseException) -> str:
    """The function that raised, as module.qualname: the check that refused."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_globals.get('__name__', '?')}.{tb.tb_frame.f_code.co_qualname}"


def _count_body(w: Window) -> dict[str, Any]:
    body = {k: v for k, v in w.body.items() if k not in ("count", "window_s", "repeats")}
    return {**body, "count": w.repeats, "repeats_of": w.seq, "first_at": w.opened.isoformat(),
            "last_at": w.last.isoformat()}


def _unrecorded(gw: RefusalRecorder, attempt: Attempt, exc: GatewayError, error: BaseException,
                queued: _Queued | None) -> None:
    """The refusal could not be written: no repeat may be counted against its entry, and the log says what was
    refused, by whom."""
    if queued is not None and queued.ticket is not None:
        gw.refusal_counts.forget(queued.key, queued.seq)
        for w in queued.closed:
            _count_unrecorded(w, error)
    caller = attempt.caller
    log.error("refusal not in the ledger (%s: %s): %s %s by %s: %d %s", type(error).__name__, error,
              attempt.method, attempt.route, caller.real_identity if caller else "?", exc.status, exc.detail,
              extra={"refused": {"route": attempt.route, "path_params": attempt.path_params,
                                 "caller": caller.to_json() if caller else None, "status": exc.status,
                                 "type": exc.kind, "detail": exc.detail}})


def _count_unrecorded(w: Window, error: BaseException) -> None:
    log.error("refused %d more times, not in the ledger (%s): %s", w.repeats, error,
              json.dumps(_count_body(w), sort_keys=True, default=str))
