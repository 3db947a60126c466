"""Closing decisions that never got an outcome (DESIGN, one mutation's path, step 7): nothing is silently lost.

The decision is durable before anything changes, so a gateway that dies before the outcome, or a transaction
that raises after an allowed decision (a Conflict found after deciding, a failed commit), leaves an `allow`
that no entry says was carried out, or not. A pass scans the ledger and appends, for each such decision, one
`outcome` entry with result `not_confirmed`, a sentence why, and what the business DB holds now.

The rule (which decisions expect an outcome, and how one cites its decision):
- Expected: every `decision` entry whose effect is `allow` and whose action changes something; that includes
  an approval's final decision (its `executed` outcome cites it), a break-glass override, and the scheduler's
  own preemption decisions (`job.preempt`).
- Not expected: `deny` and `needs_approval` (nothing is to be carried out; an approval's later execution is
  decided again, and that decision is the one expected), reads (READS), and dry runs (never recorded).
- An entry cites a decision when its body holds the decision's `decision_seq` or its `request_id` at the top
  level: outcomes, transitions (a stop's `stop_requested`, written in the stop's own transaction; the node's
  later report is not needed), `emergency`, `break_glass`, and `policy` load entries all do.
- `job.submit` is the one exception: a submission that succeeded writes no outcome entry (its hottest path
  keeps one fsync); the job row, named by the decision's `job_id`, is its outcome. Only a submission whose row
  does not exist is open.

A transaction that rolls back after its outcome entries were written retracts them in one `rolled_back` entry
(gateway/decisions/transaction.py). A decision whose every citing entry was retracted is open again: what was said to be
done was not, so it is closed like any other, with the state the business DB holds, and the why names the
retraction.

The pass runs at start-up before the API serves, and in housekeeping (a transaction that raised is closed
without a restart). It resumes from a watermark in the business DB; a decision younger than the settle time
may still be in flight and is left, with the watermark, for a later pass. The watermark stops at the first
young decision even if it is closed already: the retraction of its outcome may still be on its way. The pass
is idempotent: the entries it appends cite their decisions, so scanning the same range again finds nothing open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.deps import Reconciler
from gateway.errors import LedgerUnavailable
from gateway.housekeeping import ReadFirst
from gateway.store.models import Job
from gateway.store.models import RoleBinding as RoleBindingRow
from gateway.store.scheduler_tables import QuotaRow, quota_json
from gateway.store.service_tables import ReconcileMark
from ledger.errors import LedgerError

log = logging.getLogger("jobgate.reconcile")

# Recorded decisions that change nothing, so no outcome follows (a forensics export's ledger.read).
READS = frozenset({"job.view", "ledger.read"})
SETTLED_BY_ROW = "job.submit"  # see the module docstring
# A decision and its outcome are written in one transaction (a submission: two short ones; a policy reload:
# the load after the decision's). Younger than this, an uncited decision may still be in flight.
SETTLE_S = 120.0
WHY = (
    "no ledger entry records carrying out this allowed decision: the gateway stopped, or the change failed "
    "and was rolled back, before its outcome was written; state_now is what the business database holds"
)
WHY_RETRACTED = (
    "the entries that recorded carrying out this allowed decision were retracted (seq {by}): the change was "
    "rolled back after they were written; state_now is what the business database holds"
)
_PAGE = 1000


@dataclass(frozen=True)
class Decided:
    """An allowed mutation decision, as much of it as closing it needs."""

    seq: int
    at: datetime
    request_id: str | None
    action: str
    body: Mapping[str, Any]
    retracted_by: int | None = None  # the `rolled_back` entry that reopened it, if one did

    @property
    def why(self) -> str:
        return WHY if self.retracted_by is None else WHY_RETRACTED.format(by=self.retracted_by)


@dataclass
class Scan:
    """What one scan found: decisions to close now, and the seq to start from next time (None: the end)."""

    open: list[Decided] = field(default_factory=list)
    resume_at: int | None = None


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def expects_outcome(entry: Mapping[str, Any]) -> bool:
    """Is this ledger entry an allowed decision to change something?"""
    body = entry.get("body") or {}
    if entry.get("kind") != "decision" or not isinstance(body, Mapping):
        return False
    decision, given = body.get("decision") or {}, body.get("input") or {}
    return (
        isinstance(decision, Mapping)
        and decision.get("effect") == "allow"
        and isinstance(given, Mapping)
        and given.get("action") not in READS
    )


def _retracted(entry: Mapping[str, Any]) -> list[int]:
    """The seqs a `rolled_back` outcome retracts (see gateway/decisions/transaction.py); none for any other entry."""
    body = entry.get("body") or {}
    if entry.get("kind") != "outcome" or body.get("result") != "rolled_back":
        return []
    return [s for s in body.get("retracts") or () if isinstance(s, int) and not isinstance(s, bool)]


def find_open(entries: Iterable[Mapping[str, Any]], *, settled_before: datetime) -> Scan:
    """Allowed mutation decisions among `entries` (ledger entries in seq order, from some seq to the end) that
    no later entry cites, or whose every citing entry a later `rolled_back` entry retracts. Those decided at or
    after `settled_before` are not reported; the first decision that young is where the next scan resumes."""
    decided: dict[int, Decided] = {}
    citers: dict[int, set[int]] = {}  # decision seq -> the entries citing it that stand
    cites: dict[int, int] = {}  # citing entry seq -> the decision it cites
    by_request: dict[str, int] = {}
    young: int | None = None
    for entry in entries:
        body = entry.get("body") or {}
        if not isinstance(body, Mapping):
            continue
        seq = int(entry["seq"])
        for gone in _retracted(entry):
            if (of := cites.pop(gone, None)) is not None:
                citers[of].discard(gone)
                if not citers[of]:
                    decided[of] = replace(decided[of], retracted_by=seq)
        cited = body.get("decision_seq")
        request_id = body.get("request_id")
        if not (isinstance(cited, int) and not isinstance(cited, bool) and cited in decided):
            cited = by_request.get(request_id, -1) if isinstance(request_id, str) else -1
        if cited in decided and entry.get("kind") != "decision":
            citers[cited].add(seq)
            cites[seq] = cited
        if expects_outcome(entry):
            rid = request_id if isinstance(request_id, str) else None
            decided[seq] = Decided(seq, _time(entry["time"]), rid, str(body["input"]["action"]), body)
            citers[seq] = set()
            if rid:
                by_request[rid] = seq
            if young is None and decided[seq].at >= settled_before:
                young = seq
    scan = Scan(resume_at=young)
    scan.open = [d for seq, d in decided.items() if not citers[seq] and d.at < settled_before]
    return scan


def _job_ids(d: Decided) -> list[str]:
    given = d.body.get("input") or {}
    ids = [t.get("id") if isinstance(t, Mapping) else t for t in given.get("targets") or []]
    if d.action == SETTLED_BY_ROW:
        ids.append((given.get("params") or {}).get("job_id"))
    return sorted({i for i in ids if isinstance(i, str)})


def state_now(gw: Reconciler, session: Session, d: Decided) -> dict[str, Any]:
    """What holds now for the decision's targets: each job's state (None: no such job), the project's quota,
    whether the role binding is held, the active policy set."""
    given = d.body.get("input") or {}
    params = given.get("params") or {}
    out: dict[str, Any] = {}
    ids = _job_ids(d)
    if ids:
        found = {i: s for i, s in session.execute(select(Job.id, Job.state).where(Job.id.in_(ids))).all()}
        out["jobs"] = {i: found.get(i) for i in ids}
    if d.action == "quota.change" and isinstance(given.get("project"), str):
        out["quota"] = quota_json(session.get(QuotaRow, given["project"]))
    if d.action == "role.manage" and params.get("change") in ("grant", "revoke"):
        held = session.scalars(
            select(RoleBindingRow.id).where(
                RoleBindingRow.principal_id == params.get("principal"),
                RoleBindingRow.role == params.get("role"),
                RoleBindingRow.project == params.get("project"),
            )
        ).first()
        out["binding_held"] = held is not None
    if d.action == "policy.reload":
        out["active_policy_hash"] = gw.policy.policy_hash
    return out


def _read(gw: Reconciler, start: int, end: int) -> Iterable[Mapping[str, Any]]:
    seq = start
    while seq < end:
        page = gw.ledger.entries(seq, min(_PAGE, end - seq))
        if not page:
            return
        for e in page:
            yield e.value
        seq = page[-1].seq + 1


@dataclass(frozen=True)
class Read:
    """The ledger read by a pass before its transaction: from `start` (the watermark then) to `end`, what it found."""

    start: int
    end: int
    scan: Scan


def read_ledger(gw: Reconciler, *, settle_s: float = SETTLE_S) -> Read:
    """A pass's scan, made before its write transaction: from the watermark as it stands to the ledger's end.

    Every young decision's range is scanned again on every pass until it settles (SETTLE_S): at 10 approvals a
    second some 2,400 entries, and more with every submission. Scanned inside the write transaction, on SQLite
    that held the one write lock for 76-130 ms each time, and every stop and approval waited for it; with 1,750
    submissions in the settle time, the pass now holds it 1.0-1.4 ms (it held it 32-44 ms in the same run)."""
    with gw.transaction(immediate=False) as session:
        start = session.scalars(select(ReconcileMark.next_seq).where(ReconcileMark.id == 1)).first() or 0
    end = gw.ledger.size()
    return Read(start, end, find_open(_read(gw, start, end), settled_before=gw.clock() - timedelta(seconds=settle_s)))


def reconcile(gw: Reconciler, session: Session, *, settle_s: float = SETTLE_S, read: Read | None = None) -> int:
    """One pass: close each open allowed decision with a `not_confirmed` outcome, advance the watermark.
    Returns how many were closed. Raises LedgerUnavailable (the watermark then stays).

    With `read` (read_ledger before this transaction), what it found is closed, unless the watermark moved since
    (a pass on another replica): then the ledger is scanned again here. Entries appended after its end are the
    next pass's, as they are for a scan made here."""
    mark = session.scalars(select(ReconcileMark).where(ReconcileMark.id == 1).with_for_update()).first()
    if mark is None:
        mark = ReconcileMark(id=1, next_seq=0)
        session.add(mark)
        session.flush()
    if read is not None and read.start == mark.next_seq:
        end, scan = read.end, read.scan
    else:
        # Read after taking the row lock: a pass on another replica that held it has appended what it closed.
        end = gw.ledger.size()
        scan = find_open(_read(gw, mark.next_seq, end), settled_before=gw.clock() - timedelta(seconds=settle_s))
    submitted = [i for d in scan.open if d.action == SETTLED_BY_ROW for i in _job_ids(d)]
    exist = set(session.scalars(select(Job.id).where(Job.id.in_(submitted))).all()) if submitted else set()
    closing = [d for d in scan.open if not (d.action == SETTLED_BY_ROW and set(_job_ids(d)) <= exist)]
    pending = [
        (
            "outcome",
            {
                "request_id": d.request_id,
                "decision_seq": d.seq,
                "action": d.action,
                "result": "not_confirmed",
                "reconciled": True,
                "why": d.why,
                "state_now": state_now(gw, session, d),
            },
            None,
        )
        for d in closing
    ]
    if pending:
        try:
            gw.ledger.append_many(pending)
        except LedgerError as e:
            raise LedgerUnavailable(f"could not record {len(pending)} reconciliation outcomes ({e})") from e
    mark.next_seq = scan.resume_at if scan.resume_at is not None else end
    return len(closing)


def reconcile_at_startup(gw: Reconciler) -> int:
    """Before the API serves. With SQLite this process is the only writer, so nothing is in flight and every
    open decision is closed; on PostgreSQL other replicas may be mid-transaction, so the settle time holds."""
    settle_s = 0.0 if gw.db.engine.dialect.name == "sqlite" else SETTLE_S
    try:
        with gw.transaction() as session:
            closed = reconcile(gw, session, settle_s=settle_s)
    except Exception:  # a ledger outage must not keep the gateway down: housekeeping tries again
        log.exception("could not reconcile decisions without an outcome at start-up; housekeeping will retry")
        return 0
    log.info("reconciled %d allowed decision(s) that had no outcome entry", closed)
    return closed


def reconcile_chore(gw: Reconciler) -> ReadFirst[Read]:
    """The housekeeping chore: the ledger read before the chore's transaction, closed in it."""
    return ReadFirst(partial(read_ledger, gw), lambda session, read: reconcile(gw, session, read=read))
