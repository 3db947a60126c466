"""The decision pipeline every mutation goes through: build input → decide → record in the ledger.

The decision is durable in the ledger before the caller changes any state (record first); if the ledger
cannot be written the mutation is refused (fail closed).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from gateway.decisions import attempts
from gateway.decisions.deps import Decider
from gateway.decisions.facts import add_gang_facts, add_hold_facts, add_priority_facts, target_facts
from gateway.decisions.policy.engine import BREAK_GLASS_RULE, Decision
from gateway.decisions.queue_snapshot import snapshot_blob
from gateway.decisions.ratelimit import CountsUnavailable, RateBreach
from gateway.decisions.transaction import QUEUED_ENTRIES, REPORTED_ENTRIES, settle_queued_entries
from gateway.errors import Forbidden, Invalid, LedgerUnavailable
from gateway.identity.auth import Caller
from gateway.metrics import DECISION_SECONDS, DECISIONS, LEDGER_APPEND_SECONDS
from gateway.store.models import Job
from ledger.errors import InvalidEntry, LedgerError
from ledger.service import AppendResult, Ticket

RATE_LIMIT_RULE = "H2.rate_limit"

# Actions counted against the caller's calls per minute but not against their projects' (see decide).
PRINCIPAL_LIMIT_ONLY = frozenset({"emergency.stop"})


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


def _refused(gw: Decider, reason: str, rule: str) -> Decision:
    """A deny decided before the policy engine (token scope, rate limit); recorded like any other."""
    return Decision(effect="deny", reasons=(reason,), rules=(rule,), approvals_required={}, obligations=(),
                    policy_hash=gw.policy.policy_hash)


@dataclass(frozen=True)
class Recorded:
    request_id: str
    decision: Decision
    written_seq: int  # the seq of an entry written at once (-1: not recorded); a queued one's is `seq`
    input: dict[str, Any]
    ticket: Ticket | None = None  # decide(wait=False): the entry, queued; not durable until the caller waits
    # H2: the calls-per-minute limit that refused the call before the policy was asked, if one did (a 429, or a
    # 503 when the counts could not be read, rather than the 403 of a policy refusal: see verdict.refuse_if_denied).
    rate_refusal: RateBreach | CountsUnavailable | None = None

    @property
    def seq(self) -> int:
        """The decision entry's seq. A queued entry's on a ledger sequenced in its database (PostgreSQL, several
        replicas) is known only once its batch commits: reading it waits for that, so read it only where the seq
        is needed (a citation), not on the event loop. Raises LedgerError if the entry was not written."""
        return self.ticket.seq if self.ticket is not None else self.written_seq


def decide(
    gw: Decider,
    session: Session,
    caller: Caller,
    action: str,
    *,
    targets: Sequence[Job] = (),
    project: str | None = None,
    params: Mapping[str, Any] | None = None,
    reason: str | None = None,
    ticket: str | None = None,
    granularity: str = "job",
    approvals: Sequence[Mapping[str, Any]] = (),
    context: Mapping[str, Any] | None = None,
    record: bool = True,
    rate_limited: bool = True,
    durable_by_commit: bool = False,
    wait: bool = True,
) -> Recorded:
    """Decide one request and (unless record=False, for reads) append the decision to the ledger.

    `context` adds facts to the ledger entry that are not policy input (e.g. the approval being approved).
    Recorded calls on existing jobs count against the caller's and the projects' rate limits unless
    `rate_limited` is False (an approval executing an earlier, already counted request).
    With `durable_by_commit`, the decision is queued and this returns with its seq at once: the caller's
    business transaction waits for it before it commits (or before an error leaves it), so the fsync
    overlaps the work of carrying the decision out, and the outcome entries that cite it. With `wait=False`,
    the decision is queued and the caller owns the wait: it awaits `durable(rec.ticket)` before it acts on
    the decision or answers (jobs.submit, on the event loop).

    Raises Invalid when the request holds a value the ledger cannot encode, LedgerUnavailable when the
    decision cannot be made durable, PolicyOutOfStep when this replica cannot decide under the policy set in
    force.
    """
    # Replicas: under the policy set and role bindings in force, or not at all (PolicyOutOfStep, 503).
    gw.policy_sync.check(lambda: gw.policy, session)
    now = gw.clock()
    request_id = new_request_id()
    facts = [target_facts(j, now) for j in targets]
    if action == "job.priority" and facts and "priority" in (params or {}):
        add_priority_facts(session, facts)
    if action == "job.stop" and facts and caller.kind == "system":
        add_gang_facts(session, facts)
    if action == "job.resume" and facts:
        add_hold_facts(session, facts, targets)
    decision_input: dict[str, Any] = {
        "action": action,
        "actor": {"id": caller.id, "kind": caller.kind, "responsible": caller.responsible, "trigger": caller.trigger},
        "project": project,
        "targets": facts,
        "params": dict(params or {}),
        "reason": reason,
        "ticket": ticket,
        "granularity": granularity,
        "approvals": list(approvals),
        "now": now.isoformat(),
    }
    projects = sorted({f["project"] for f in facts} | ({project} if project else set()))
    # H2 rate limits guard principals' actions on existing jobs (a runaway script stopping a queue), not
    # submissions, and not the system's own housekeeping (R4 reclaims every expired job, however many).
    limited = record and rate_limited and bool(targets) and gw.limiter is not None and caller.kind != "system"
    # The emergency brake counts against its caller only: the projects' budget may be what a runaway has
    # just spent, and on-call must still be able to stop it.
    counted = [] if action in PRINCIPAL_LIMIT_ONLY else projects
    breach = gw.limiter.hit(caller.real_identity, counted) if limited and gw.limiter is not None else None
    started = time.perf_counter()
    try:
        caller.check_scope(action, projects)
        decision = gw.policy.decide(decision_input) if breach is None else _refused(gw, breach.sentence(),
                                                                                     RATE_LIMIT_RULE)
    except Forbidden as e:
        decision = _refused(gw, e.detail, "token_scope")
    # (a token that does not cover the call is refused for that, even where the call is also over its rate)
    rate_refusal = breach if breach is not None and decision.rules == (RATE_LIMIT_RULE,) else None
    DECISION_SECONDS.observe(time.perf_counter() - started)
    policy_said = None
    if caller.breakglass and decision.effect == "needs_approval":
        # F2: an approved break-glass grant stands in for the second person, nothing else; the policy's
        # own answer is kept beside the override. Where the policy wants more people than one (a scope stop,
        # another's external-rights job), the grant is not a way around the others: the request waits for all
        # of them, as anyone's would.
        policy_said = decision.to_json()
        needed = decision.approvals_required.get("count", 0)
        if needed == 1:
            decision = replace(decision, effect="allow", approvals_required={},
                               reasons=(f"break-glass grant {caller.breakglass} stands in for the second person",
                                        *decision.reasons),
                               rules=(*decision.rules, BREAK_GLASS_RULE))
        else:
            decision = replace(decision, reasons=(
                f"break-glass grant {caller.breakglass} stands in for one second person, not the {needed} this"
                " request needs; it waits for them", *decision.reasons))
    DECISIONS.labels(action, decision.effect).inc()
    if not record:
        return Recorded(request_id, decision, -1, decision_input, rate_refusal=rate_refusal)
    body = {
        "request_id": request_id,
        "actor": caller.to_json(),
        "source": caller.source,
        "input": decision_input,
        "decision": decision.to_json(),
        "policy_hash": decision.policy_hash,
        "bypass": caller.breakglass is not None,
        **({"policy_decision": policy_said} if policy_said else {}),
        **({"context": dict(context)} if context else {}),
    }
    # H3: an action on existing jobs records the queue as it stood; a submission changes no one's job.
    blobs = {"queue_snapshot": snapshot_blob(session)} if targets else {}
    tickets = session.info.get(QUEUED_ENTRIES) if durable_by_commit else None
    try:
        if tickets is not None or not wait:
            queued = gw.ledger.enqueue("decision", body, blobs=blobs)
            attempts.ledgered(queued)  # this request's refusal, if it is one, is this entry (its seq is not awaited)
            if tickets is not None:
                tickets.append(queued)
            return Recorded(request_id, decision, -1, decision_input, queued, rate_refusal)
        started = time.perf_counter()
        appended = gw.ledger.append("decision", body, blobs=blobs)
        attempts.ledgered(appended.seq)
        LEDGER_APPEND_SECONDS.observe(time.perf_counter() - started)
    except InvalidEntry as e:
        # Bad input, not a ledger outage: a parameter canonical JSON cannot carry exactly (an infinity, an
        # integer past 2**53). Refused before anything was written.
        raise Invalid(f"the request holds a value the ledger cannot record ({e}); nothing was changed") from e
    except LedgerError as e:
        raise LedgerUnavailable(f"the decision could not be recorded ({e}); nothing was changed") from e
    return Recorded(request_id, decision, appended.seq, decision_input, rate_refusal=rate_refusal)


async def durable(ticket: Ticket) -> AppendResult:
    """Wait until the ticket's entry is durable, on the event loop and holding no thread: the ledger's
    writer wakes the loop once the entry's batch is committed. Raises LedgerError if it was not written."""
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    settled = loop.create_future()
    ticket.add_done_callback(partial(loop.call_soon_threadsafe, _resolve, settled))
    await settled
    LEDGER_APPEND_SECONDS.observe(time.perf_counter() - started)
    return ticket.wait()  # settled: returns or raises at once


def _resolve(settled: asyncio.Future[None]) -> None:
    if not settled.done():  # (cancelled: the request went away; its entry is written all the same)
        settled.set_result(None)


def record_outcome(gw: Decider, kind: str, body: Mapping[str, Any], blobs: Mapping[str, bytes] | None = None) -> int:
    """Append an outcome or system entry. Raises LedgerUnavailable."""
    try:
        return gw.ledger.append(kind, dict(body), blobs=dict(blobs or {})).seq
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record {kind} ({e})") from e


_LEDGER_BATCH = "ledger_batch"
Pending = tuple[str, Mapping[str, Any], Mapping[str, bytes] | None]


@contextmanager
def ledger_batch(gw: Decider, session: Session) -> Iterator[None]:
    """Collect the entries `record` is given inside the block and append them, in order, at its end: one
    group commit instead of one fsync each, still before the business transaction commits.

    For the outcomes of an action already decided (its transitions, commands, results). In a
    business transaction they are queued behind the decision they cite, which need not be durable yet (if it
    is not written, neither are they), and the transaction waits for all of them before it commits, after
    writing its own changes meanwhile; elsewhere this waits for them. A block that raises appends nothing,
    so a rolled-back change leaves no outcome claiming it happened. Raises LedgerUnavailable (the caller's
    transaction then rolls back).
    """
    if _LEDGER_BATCH in session.info:  # nested: the outer block appends
        yield
        return
    pending: list[Pending] = []
    session.info[_LEDGER_BATCH] = pending
    try:
        yield
    finally:
        session.info.pop(_LEDGER_BATCH, None)
    queued = session.info.get(QUEUED_ENTRIES)
    try:
        if queued is not None:
            # Behind the decision they cite, without waiting for it: never written without it.
            tickets = gw.ledger.enqueue_many(pending, after=queued)
            queued.extend(tickets)
            session.info.get(REPORTED_ENTRIES, []).extend(tickets)
        else:
            gw.ledger.append_many(pending)
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record {len(pending)} outcome entries ({e})") from e


def record(gw: Decider, session: Session | None, kind: str, body: Mapping[str, Any],
           blobs: Mapping[str, bytes] | None = None) -> int:
    """Append to the ledger now, or at the end of the enclosing `ledger_batch` (then returns -1)."""
    batch = session.info.get(_LEDGER_BATCH) if session is not None else None
    if batch is None:
        if session is None:
            return record_outcome(gw, kind, body, blobs)
        settle_queued_entries(session)  # the decision this entry may cite is durable first
        seq = record_outcome(gw, kind, body, blobs)
        session.info.get(REPORTED_ENTRIES, []).append(seq)
        return seq
    batch.append((kind, dict(body), dict(blobs or {})))
    return -1


def visible_projects(gw: Decider, session: Session, caller: Caller, projects: Sequence[str]) -> set[str]:
    """Projects whose jobs the caller may view (A1), decided by the same policy as everything else."""
    allowed = set()
    for p in projects:
        if decide(gw, session, caller, "job.view", project=p, record=False).decision.effect == "allow":
            allowed.add(p)
    return allowed
