"""Forensics export (F4): freeze the evidence in a fixed order, then hand out one offline-verifiable bundle.

Order, as F4 asks — each step is frozen as a signed ledger entry (its data a content-addressed blob)
before the next one is read:
  1. the ledger range itself (every entry about the job, or since T), with proofs and checkpoints;
  2. the queue snapshots (the current one; those taken at each decision are already blobs of the range);
  3. the scheduler's job events (each job's state history and placements);
  4. the node-side process records and stop evidence (allocations, signed commands and their acks);
  5. checkpoint write times and integrity: every checkpoint the ledger or the business DB records, oldest
     write first, whether the DB's evidence is what the ledger recorded, and what retention or deletion did.
The file is a `jobgate-ledger-bundle/1` (ledger/bundle.py) covering the range plus those five entries, so
`jobgate ledger verify --bundle FILE --public-key <data-dir>/keys/ledger.vkey` verifies all of it offline.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import rfc8785
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.pipeline import decide, record_outcome
from gateway.decisions.queue_snapshot import queue_snapshot
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Invalid, NotFound
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.store.models import Allocation, Job, Node, NodeCommand
from gateway.store.stop_tables import CheckpointRetention, CommandAck, JobDeletion
from ledger.bundle import export_bundle
from ledger.store import open_store

SECTIONS = ("queue_snapshots", "scheduler_job_events", "node_process_records", "checkpoint_integrity")


def _mentions(entry: dict[str, Any], job_ids: set[str]) -> bool:
    body = entry.get("body") or {}
    if body.get("job_id") in job_ids:
        return True
    targets = (body.get("input") or {}).get("targets") or []
    if any(isinstance(t, dict) and t.get("id") in job_ids for t in targets):
        return True
    listed = body.get("targets") or body.get("executed_on") or []
    return any(isinstance(t, str) and t in job_ids for t in listed)


def _scan(gw: Jobs, job_ids: set[str] | None, since: datetime | None) -> tuple[int, set[str]]:
    """First seq of the range, and (for --since) the jobs the range touches."""
    ledger = gw.ledger
    size = ledger.size()
    start: int | None = None
    touched: set[str] = set()
    seq = 0
    while seq < size:
        batch = ledger.entries(seq, 1000)
        for e in batch:
            entry = json.loads(e.raw)
            if job_ids is not None:
                if start is None and _mentions(entry, job_ids):
                    start = e.seq
            elif since is not None and datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")) >= since:
                if start is None:
                    start = e.seq
                body = entry.get("body") or {}
                if isinstance(body.get("job_id"), str):
                    touched.add(body["job_id"])
        seq += len(batch) or 1
    if start is None:
        raise NotFound("the ledger has no entry for that job" if job_ids is not None else "no ledger entry since then")
    return start, touched


def _section(gw: Jobs, name: str, data: Any, job_ids: list[str]) -> int:
    blob = rfc8785.dumps(data)
    body = {"section": name, "jobs": job_ids, "sha256": hashlib.sha256(blob).hexdigest()}
    return record_outcome(gw, "forensics", body, blobs={name: blob})


def _job_events(session: Session, jobs: list[Job]) -> dict[str, Any]:
    return {j.id: {"state": j.state, "history": j.history, "placement": j.placement, "queue": j.queue,
                   "submitted_at": j.submitted_at.isoformat(), "stop_request": j.stop_request} for j in jobs}


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _node_records(session: Session, ids: list[str]) -> dict[str, Any]:
    parts = session.scalars(select(Allocation).where(Allocation.job_id.in_(ids)).order_by(Allocation.id)).all()
    commands = session.scalars(select(NodeCommand).where(NodeCommand.job_id.in_(ids))
                               .order_by(NodeCommand.created_at)).all()
    acks = {a.nonce: a for a in session.scalars(select(CommandAck).where(
        CommandAck.nonce.in_([c.nonce for c in commands]))).all()}
    nodes = {n.id: n for n in session.scalars(select(Node)).all()}
    return {
        "allocations": [{"job_id": p.job_id, "node": p.node, "gpus": p.gpus, "state": p.state, "pid": p.pid,
                         "exit_code": p.exit_code, "released": p.released, "evidence": p.evidence} for p in parts],
        "commands": [{"nonce": c.nonce, "node": c.node, "job_id": c.job_id, "kind": c.kind, "envelope": c.envelope,
                      "created_at": c.created_at.isoformat(),
                      "delivered_at": c.delivered_at.isoformat() if c.delivered_at else None,
                      "acked": {"at": acks[c.nonce].acked_at.isoformat(), "event": acks[c.nonce].event}
                      if c.nonce in acks else None} for c in commands],
        "nodes": {p.node: {"state": nodes[p.node].state, "running_at_last_heartbeat": nodes[p.node].running,
                           "last_heartbeat": _iso(nodes[p.node].last_heartbeat)} for p in parts if p.node in nodes},
    }


def _digest(data: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(data)).hexdigest()


def _checkpoint_key(c: dict[str, Any]) -> str:
    # Evidence is what a node reported: any JSON, so the key must not assume hashable or well-typed values.
    return json.dumps([c.get("path"), c.get("size"), c.get("mtime"), c.get("sha256")], sort_keys=True, default=str)


def _checkpoint_list(value: Any) -> list[dict[str, Any]]:
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def _mtime(c: dict[str, Any]) -> float | None:
    """The checkpoint's write time on its node, if it is a plausible Unix time."""
    m = c.get("mtime")
    return float(m) if isinstance(m, int | float) and not isinstance(m, bool) and 0 <= m < 253402300800 else None


class _Ledgered:
    """What the whole ledger recorded about the jobs' runs: each node's evidence (digests) and every checkpoint
    (with the seq that first recorded it). The whole ledger, not the exported range: evidence of a run before
    `--since` is still what the business DB must match."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}
        self.node_evidence: dict[tuple[str, str], set[str]] = {}
        self.checkpoints: dict[str, dict[str, dict[str, Any]]] = {}

    def add_evidence(self, job_id: str, node: str, ev: Any, seq: int) -> None:
        if not isinstance(ev, dict):
            return
        self.node_evidence.setdefault((job_id, node), set()).add(_digest(ev))
        self.add_checkpoints(job_id, node, ev.get("checkpoints"), seq)

    def add_checkpoints(self, job_id: str, node: str | None, checkpoints: Any, seq: int) -> None:
        for c in _checkpoint_list(checkpoints):
            self.checkpoints.setdefault(job_id, {}).setdefault(_checkpoint_key(c), {**c, "node": node,
                                                                                     "ledger_seq": seq})


def _read_ledgered(gw: Jobs, ids: set[str]) -> _Ledgered:
    ledger, out = gw.ledger, _Ledgered()
    seq, size = 0, gw.ledger.size()
    while seq < size:
        batch = ledger.entries(seq, 1000)
        for e in batch:
            entry = json.loads(e.raw)
            body = entry.get("body") or {}
            job_id = body.get("job_id")
            if job_id not in ids:
                continue
            if body.get("action") == "job.preempt" and body.get("result") == "requeued":
                out.add_checkpoints(job_id, None, body.get("checkpoints"), e.seq)  # listed in the entry itself
            digest = str((entry.get("blobs") or {}).get("evidence") or "")
            blob = ledger.blob(digest.removeprefix("sha256:")) if digest else None
            if blob is None:
                continue
            evidence = json.loads(blob)
            if not isinstance(evidence, dict):
                continue
            if entry["kind"] == "outcome":  # a finished run: the job's evidence, every node's part in it
                out.latest[job_id] = digest
                nodes = evidence.get("nodes")
                for node, ev in (nodes if isinstance(nodes, dict) else {}).items():
                    out.add_evidence(job_id, str(node), ev, e.seq)
            elif isinstance(body.get("node"), str):  # one node's report (a survivor, late evidence)
                out.add_evidence(job_id, body["node"], evidence, e.seq)
        seq += len(batch) or 1
    return out


def _db_runs(job: Job) -> list[tuple[str, dict[str, Any]]]:
    """Each node's evidence the business DB holds for the job: its last run, and the run a preemption ended."""
    ev = job.evidence if isinstance(job.evidence, dict) else {}
    preempted = ev.get("last_preemption")
    if not isinstance(preempted, dict):
        preempted = {}
    return [(str(node), part) for source in (ev.get("nodes"), preempted.get("nodes")) if isinstance(source, dict)
            for node, part in source.items() if isinstance(part, dict) and part]


def _integrity(gw: Jobs, session: Session, jobs: list[Job]) -> dict[str, Any]:
    """Checkpoint write times and integrity (F4): every checkpoint the ledger or the business DB records for each
    job, oldest write first, and whether the DB's evidence is what the ledger recorded. The DB's evidence may
    legitimately be newer than the last ledgered blob (a stop while queued, a confirmation by on-call), so each
    node's evidence and each checkpoint is looked up among all the ledger holds, never only the latest."""
    ledgered = _read_ledgered(gw, {j.id for j in jobs})
    out: dict[str, Any] = {}
    for job in jobs:
        retention = session.get(CheckpointRetention, job.id)
        deletion = session.get(JobDeletion, job.id)
        status = ("deleted" if deletion is not None and deletion.state == "purged"
                  else "cleaned" if retention is not None and retention.state == "cleaned" else "kept")
        runs = _db_runs(job)
        in_ledger = ledgered.checkpoints.get(job.id, {})
        in_db = {_checkpoint_key(c): {**c, "node": node} for node, part in runs
                 for c in _checkpoint_list(part.get("checkpoints"))}
        evidence_ok = [_digest(part) in ledgered.node_evidence.get((job.id, node), set()) for node, part in runs]
        checks = evidence_ok + [key in in_ledger for key in in_db]
        listed = []
        records = {**in_db, **in_ledger}
        for key, c in sorted(records.items(), key=lambda kv: (_mtime(kv[1]) or 0.0, kv[0])):
            written = _mtime(c)
            listed.append({"node": c.get("node"), "path": c.get("path"), "sha256": c.get("sha256"),
                           "size": c.get("size"), "mtime": c.get("mtime"),
                           "written_at": datetime.fromtimestamp(written, UTC).isoformat() if written else None,
                           "ledger_seq": c.get("ledger_seq"), "in_ledger": key in in_ledger, "in_db": key in in_db,
                           "status": status})
        out[job.id] = {
            "evidence_in_ledger": ledgered.latest.get(job.id),
            "evidence_in_db": _digest(job.evidence) if job.evidence else None,
            # None: the DB holds no run evidence to compare (e.g. cancelled while queued).
            "db_matches_ledger": all(checks) if checks else None,
            "checkpoints": listed,
            "retention": {"tier": retention.tier, "state": retention.state} if retention else None,
        }
    return out


def export(gw: Jobs, session: Session, caller: Caller, *, job_id: str | None, since: datetime | None,
           exported_at: str) -> tuple[bytes, dict[str, Any]]:
    """Freeze the sections, export the bundle; returns (file bytes, summary).

    Raises Invalid (neither or both of job/since), NotFound, PolicyDenied, LedgerUnavailable, ledger BundleError.
    """
    if (job_id is None) == (since is None):
        raise Invalid("give exactly one of job_id or since")
    asked = {"job_id": job_id, "since": since.isoformat() if since else None}
    rec = decide(gw, session, caller, "ledger.read", params={"forensics": asked}, reason="forensics export")
    refuse_unless_allowed(rec)
    if job_id is not None and session.get(Job, job_id) is None:
        raise NotFound(f"no job with id {job_id!r}")
    start, touched = _scan(gw, {job_id} if job_id else None, since)
    ids = sorted({job_id} if job_id else touched)
    jobs = list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id)).all())
    seqs = [
        _section(gw, "queue_snapshots", {"at_export": queue_snapshot(session)}, ids),
        _section(gw, "scheduler_job_events", _job_events(session, jobs), ids),
        _section(gw, "node_process_records", _node_records(session, ids), ids),
        _section(gw, "checkpoint_integrity", _integrity(gw, session, jobs), ids),
    ]
    store = open_store(gw.settings.resolved_ledger_url(), create=False)
    try:
        with tempfile.TemporaryDirectory(prefix="jobgate-forensics-") as tmp:
            out = Path(tmp) / "bundle.jsonl"
            summary = export_bundle(store, out, from_seq=start, to_seq=seqs[-1], keys=[gw.ledger.vkey],
                                    exported_at=exported_at)
            data = out.read_bytes()
    finally:
        store.close()
    sections = [{"name": n, "seq": q} for n, q in zip(SECTIONS, seqs, strict=True)]
    return data, {"from_seq": start, "to_seq": seqs[-1], "sections": sections, "jobs": ids,
                  "entries": summary.to_json().get("entries"), "request_id": rec.request_id}
