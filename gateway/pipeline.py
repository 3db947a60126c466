"""The decision pipeline every mutation goes through: build input → decide → record in the ledger.

The decision is durable in the ledger before the caller changes any state (record first); if the ledger
cannot be written the mutation is refused (fail closed).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import groupby
from typing import Any

import orjson
from sqlalchemy import BigInteger, Integer, Text, and_, case, cast, func, literal, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from gateway.auth import Caller
from gateway.context import QUEUED_ENTRIES, Gateway, settle_queued_entries
from gateway.errors import Forbidden, LedgerUnavailable
from gateway.metrics import DECISION_SECONDS, DECISIONS, LEDGER_APPEND_SECONDS
from gateway.models import Job
from gateway.policy.engine import Decision
from gateway.states import PENDING_STATES
from ledger.entry import canonical
from ledger.errors import LedgerError


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


def target_facts(job: Job, now: datetime) -> dict[str, Any]:
    """What the policy and the ledger need to know about a target: its four ownerships and flags (R2, R3)."""
    return {
        "id": job.id,
        "name": job.name,
        "project": job.project,
        "creator": job.creator,
        "creator_kind": job.creator_kind,
        "owner": job.owner,
        "beneficiary_project": job.beneficiary_project,
        "rights_holder": job.rights_holder,
        "external_rights": job.external_rights,
        "state": job.state,
        "environment": job.environment,
        "workload": job.workload,
        "valid_until": job.valid_until.isoformat() if job.valid_until else None,
        "expired": bool(job.valid_until and job.valid_until <= now),
        "gpus": job.gpus_per_node * job.nodes,
    }


_SAFE_INT = 2**53 - 1  # the I-JSON integer range; beyond it RFC 8785 prints a number like a float
_JOB = Job.__table__.c
_IS_PENDING = _JOB.state.in_(PENDING_STATES)
# Read in the order of the index ix_jobs_queue_snapshot, which covers it.
_QUEUE_ORDER = (_JOB.queue, _JOB.base_priority.desc(), _JOB.submitted_at, _JOB.id)
_PENDING = (select(_JOB.id, _JOB.project, _JOB.queue, _JOB.base_priority, _JOB.gpus_per_node * _JOB.nodes)
            .where(_IS_PENDING).order_by(*_QUEUE_ORDER))
# The database renders each row as canonical JSON itself and joins them in queue order, so a queue of
# thousands reaches Python as one string. SQLite's json_quote and PostgreSQL's to_json escape strings
# exactly as RFC 8785 does (tests/gateway/test_queue_snapshot.py checks the bytes on both). A whole-number
# priority is written as an int; any other sets `fractional` and the snapshot takes the general path,
# since neither database prints fractions as RFC 8785 does.
_SQLITE_WHOLE = case((and_(_JOB.base_priority == cast(_JOB.base_priority, Integer),
                           func.abs(_JOB.base_priority) <= _SAFE_INT), cast(_JOB.base_priority, Integer)))
# SQLite joins the rows in its FROM subquery's order: it drops such an ORDER BY only when the outer query
# could not tell, which an aggregate other than count, min or max can.
_SQLITE_ROWS = (select(func.json_array(_JOB.id, _JOB.project, _JOB.queue, _SQLITE_WHOLE,
                                       _JOB.gpus_per_node * _JOB.nodes).label("row"),
                       _SQLITE_WHOLE.is_(None).label("fractional"))
                .where(_IS_PENDING).order_by(*_QUEUE_ORDER).subquery())
# PostgreSQL: trunc, not a cast, tests for a whole number (a cast rounds, and fails beyond bigint).
_PG_WHOLE = case((and_(_JOB.base_priority == func.trunc(_JOB.base_priority),
                       func.abs(_JOB.base_priority) <= _SAFE_INT), cast(_JOB.base_priority, BigInteger)))


def _pg_json(column: Any) -> Any:
    return cast(func.to_json(column), Text)


_PG_ROW = (literal("[") + _pg_json(_JOB.id) + "," + _pg_json(_JOB.project) + "," + _pg_json(_JOB.queue) + ","
           + cast(_PG_WHOLE, Text) + "," + cast(_JOB.gpus_per_node * _JOB.nodes, Text) + "]")
_PENDING_JSON = {
    "sqlite": select(func.group_concat(_SQLITE_ROWS.c.row, ","), func.max(_SQLITE_ROWS.c.fractional)),
    "postgresql": select(func.string_agg(_PG_ROW, aggregate_order_by(literal(","), *_QUEUE_ORDER)),
                         func.bool_or(_PG_WHOLE.is_(None))).where(_IS_PENDING),
}
_BY_QUEUE = select(_JOB.queue, func.count()).where(_IS_PENDING).group_by(_JOB.queue)
_SQL: dict[tuple[str, str], str] = {}  # (statement, dialect name) -> SQL; the statements have no parameters
_STATEMENTS: dict[str, Any] = {"pending": _PENDING, "pending_json": _PENDING_JSON, "by_queue": _BY_QUEUE}
SNAPSHOT_COLUMNS = ("id", "project", "queue", "priority", "gpus")
_SNAPSHOT_HEAD = b'{"columns":' + orjson.dumps(SNAPSHOT_COLUMNS) + b',"pending":['


def snapshot_sql(statement: str, dialect: Dialect) -> str:
    """The SQL of one of the snapshot's statements for a dialect, compiled once."""
    if (sql := _SQL.get((statement, dialect.name))) is None:
        stmt = _STATEMENTS[statement]
        stmt = stmt[dialect.name] if isinstance(stmt, dict) else stmt
        sql = _SQL[statement, dialect.name] = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


def _fetch(session: Session, statement: str) -> Sequence[Any]:
    """Rows of a snapshot statement, read with a plain DB-API cursor on the transaction's connection:
    SQLAlchemy's result rows would double the cost. Sees this transaction's own changes, as an ORM query
    would (the session is flushed first)."""
    session.flush()
    connection = session.connection()
    cursor = connection.connection.cursor()
    try:
        cursor.execute(snapshot_sql(statement, connection.dialect))
        return cursor.fetchall()
    finally:
        cursor.close()


def queue_snapshot(session: Session) -> dict[str, Any]:
    """Which jobs were queued at the moment of a decision and how their priorities were spread (H3).

    One row per queued job, in queue order (queue, then priority, then age), its fields named once in
    `columns`: a queue of thousands is recorded for every decision on existing jobs, and rows of
    objects would repeat every field name in every row of every snapshot."""
    rows = _fetch(session, "pending")
    # A whole-number priority is written as an int: RFC 8785 prints 3.0 as 3 anyway, so the bytes are the
    # same, and a snapshot without floats can skip the general encoder (see snapshot_bytes).
    pending = [[i, project, queue, int(p) if p.is_integer() and abs(p) <= _SAFE_INT else p, gpus]
               for i, project, queue, p, gpus in rows]
    by_queue = {queue: sum(1 for _ in group) for queue, group in groupby(row[2] for row in rows)}
    return {"columns": list(SNAPSHOT_COLUMNS), "pending": pending, "pending_by_queue": dict(sorted(by_queue.items()))}


def snapshot_blob(session: Session) -> bytes:
    """The queue snapshot as the canonical (RFC 8785) JSON blob a ledger entry references (H3)."""
    if session.get_bind().dialect.name in _PENDING_JSON and (blob := rendered_snapshot_blob(session)) is not None:
        return blob
    return snapshot_bytes(queue_snapshot(session))


def rendered_snapshot_blob(session: Session) -> bytes | None:
    """snapshot_blob with every row rendered by the database; None when a priority is fractional."""
    ((pending, fractional),) = _fetch(session, "pending_json")
    if fractional:
        return None
    by_queue = dict(_fetch(session, "by_queue"))
    return b"".join((_SNAPSHOT_HEAD, (pending or "").encode(), b'],"pending_by_queue":', canonical(by_queue), b"}"))


def snapshot_bytes(snapshot: dict[str, Any]) -> bytes:
    """RFC 8785 bytes of a queue snapshot, which grows with the queue and is taken for every decision on
    existing jobs. Made of ASCII keys, strings and I-JSON-safe ints only, orjson's sorted output is already
    canonical (ledger/entry.py shows why; tests/gateway/test_snapshot_blob.py checks it), so the per-value
    check of `canonical` is skipped; a fractional priority, or a string orjson refuses, takes that path."""
    # Queue names are keys too: past ASCII, RFC 8785's UTF-16 order and orjson's code-point order can differ.
    if all(q.isascii() for q in snapshot["pending_by_queue"]) and all(
            type(row[3]) is int for row in snapshot["pending"]):
        try:
            return orjson.dumps(snapshot, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass
    return canonical(snapshot)


def _refused(gw: Gateway, reason: str, rule: str) -> Decision:
    """A deny decided before the policy engine (token scope, rate limit); recorded like any other."""
    return Decision(effect="deny", reasons=(reason,), rules=(rule,), approvals_required={}, obligations=(),
                    policy_hash=gw.policy.policy_hash)


@dataclass(frozen=True)
class Recorded:
    request_id: str
    decision: Decision
    seq: int
    input: dict[str, Any]


def decide(
    gw: Gateway,
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
) -> Recorded:
    """Decide one request and (unless record=False, for reads) append the decision to the ledger.

    `context` adds facts to the ledger entry that are not policy input (e.g. the approval being approved).
    Recorded calls on existing jobs count against the caller's and the projects' rate limits unless
    `rate_limited` is False (an approval executing an earlier, already counted request).
    With `durable_by_commit`, the decision is queued and this returns with its seq at once: the caller's
    Gateway.transaction waits for it before it commits (or before an error leaves it), so the fsync
    overlaps the work of carrying the decision out, and the outcome entries that cite it.

    Raises LedgerUnavailable when the decision cannot be made durable.
    """
    now = gw.clock()
    request_id = new_request_id()
    facts = [target_facts(j, now) for j in targets]
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
    # H2 rate limits guard actions on existing jobs (a runaway script stopping a queue), not submissions.
    limited = record and rate_limited and bool(targets) and gw.limiter is not None
    breach = gw.limiter.hit(caller.real_identity, projects) if limited and gw.limiter is not None else None
    started = time.perf_counter()
    try:
        caller.check_scope(action, projects)
        decision = gw.policy.decide(decision_input) if breach is None else _refused(gw, breach.sentence(),
                                                                                     "H2.rate_limit")
    except Forbidden as e:
        decision = _refused(gw, e.detail, "token_scope")
    DECISION_SECONDS.observe(time.perf_counter() - started)
    policy_said = None
    if caller.breakglass and decision.effect == "needs_approval":
        # F2: an approved break-glass grant stands in for the second person, nothing else; the policy's
        # own answer is kept beside the override.
        policy_said = decision.to_json()
        decision = replace(decision, effect="allow", approvals_required={},
                           reasons=(f"break-glass grant {caller.breakglass} stands in for the second person",
                                    *decision.reasons),
                           rules=(*decision.rules, "F2.break_glass"))
    DECISIONS.labels(action, decision.effect).inc()
    if not record:
        return Recorded(request_id, decision, -1, decision_input)
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
        if tickets is not None:
            queued = gw.ledger.enqueue("decision", body, blobs=blobs)
            tickets.append(queued)
            return Recorded(request_id, decision, queued.seq, decision_input)
        started = time.perf_counter()
        appended = gw.ledger.append("decision", body, blobs=blobs)
        LEDGER_APPEND_SECONDS.observe(time.perf_counter() - started)
    except LedgerError as e:
        raise LedgerUnavailable(f"the decision could not be recorded ({e}); nothing was changed") from e
    return Recorded(request_id, decision, appended.seq, decision_input)


def record_outcome(gw: Gateway, kind: str, body: Mapping[str, Any], blobs: Mapping[str, bytes] | None = None) -> int:
    """Append an outcome or system entry. Raises LedgerUnavailable."""
    try:
        return gw.ledger.append(kind, dict(body), blobs=dict(blobs or {})).seq
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record {kind} ({e})") from e


_LEDGER_BATCH = "ledger_batch"
Pending = tuple[str, Mapping[str, Any], Mapping[str, bytes] | None]


@contextmanager
def ledger_batch(gw: Gateway, session: Session) -> Iterator[None]:
    """Collect the entries `record` is given inside the block and append them, in order, at its end: one
    group commit instead of one fsync each, still before the business transaction commits.

    For the outcomes of an action already decided (its transitions, commands, results). The decision they
    cite is durable first. In a Gateway.transaction they are queued, and the transaction waits for them
    before it commits, after writing its own changes meanwhile; elsewhere this waits for them. A block
    that raises appends nothing, so a rolled-back change leaves no outcome claiming it happened. Raises
    LedgerUnavailable (the caller's transaction then rolls back).
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
    settle_queued_entries(session)  # the decision these outcomes cite is durable first
    queued = session.info.get(QUEUED_ENTRIES)
    try:
        if queued is not None:
            queued.extend(gw.ledger.enqueue_many(pending))
        else:
            gw.ledger.append_many(pending)
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record {len(pending)} outcome entries ({e})") from e


def record(gw: Gateway, session: Session | None, kind: str, body: Mapping[str, Any],
           blobs: Mapping[str, bytes] | None = None) -> int:
    """Append to the ledger now, or at the end of the enclosing `ledger_batch` (then returns -1)."""
    batch = session.info.get(_LEDGER_BATCH) if session is not None else None
    if batch is None:
        if session is not None:
            settle_queued_entries(session)  # the decision this entry may cite is durable first
        return record_outcome(gw, kind, body, blobs)
    batch.append((kind, dict(body), dict(blobs or {})))
    return -1
