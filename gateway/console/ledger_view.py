"""The auditor's view of the ledger: filtered browsing, one entry with its inclusion proof checked against
the signed checkpoint that covers it, and a bundle export for offline verification.

Reading only; the caller must already hold `ledger.read` (checked by the route through `decide`).
"""

from __future__ import annotations

import base64
import json
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.context import Gateway
from gateway.errors import Invalid, NotFound
from ledger.bundle import export_bundle
from ledger.errors import LedgerError
from ledger.keys import NoteVerifier
from ledger.merkle import leaf_hash, verify_inclusion
from ledger.note import open_note, peek_checkpoint
from ledger.store import open_store

CHUNK = 500
MAX_SCAN = 50_000  # a filter walks at most this many entries back from the newest; the page says so


@dataclass(frozen=True)
class Filter:
    job: str | None = None
    actor: str | None = None
    action: str | None = None
    effect: str | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def active(self) -> bool:
        return any(v not in (None, "") for v in vars(self).values())


def parse_time(value: str | None, what: str) -> datetime | None:
    """ISO 8601 (a date alone means its midnight UTC). Raises Invalid."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as e:
        raise Invalid(f"{what}: {value!r} is not an ISO 8601 time (e.g. 2026-11-29T10:00:00Z)") from e
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _actors(body: dict[str, Any]) -> list[str]:
    out = []
    actor = body.get("actor")
    if isinstance(actor, dict):
        out += [str(actor.get("id")), str(actor.get("real_identity"))]
    by = body.get("by")
    if isinstance(by, dict):
        out.append(str(by.get("id")))
    elif isinstance(by, str):
        out.append(by)
    out += [str(a) for a in body.get("approvers", []) if isinstance(a, str)]
    context = body.get("context")
    if isinstance(context, dict) and isinstance(context.get("approver"), dict):
        out.append(str(context["approver"].get("id")))
    return [a for a in out if a and a != "None"]


def _jobs(body: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    inp = body.get("input")
    if isinstance(inp, dict):
        ids += [str(t.get("id")) for t in inp.get("targets", []) if isinstance(t, dict)]
        params = inp.get("params")
        if isinstance(params, dict) and isinstance(params.get("job_id"), str):  # a submission names its new id
            ids.append(params["job_id"])
    if isinstance(body.get("job_id"), str):
        ids.append(body["job_id"])
    for key in ("targets", "executed_on"):
        ids += [str(t) for t in body.get(key, []) if isinstance(t, str)] if isinstance(body.get(key), list) else []
    return sorted(set(ids))


def summary(seq: int, value: dict[str, Any]) -> dict[str, Any]:
    """The columns of the browser: seq, time, kind, actors, action, effect or result, jobs."""
    body = value.get("body") if isinstance(value.get("body"), dict) else {}
    assert isinstance(body, dict)
    inp = body.get("input") if isinstance(body.get("input"), dict) else {}
    decision = body.get("decision") if isinstance(body.get("decision"), dict) else {}
    assert isinstance(inp, dict) and isinstance(decision, dict)
    action = inp.get("action") or body.get("action") or ""
    effect = decision.get("effect") or ""
    result = body.get("result") or body.get("state_after") or ""
    return {"seq": seq, "time": value.get("time", ""), "kind": value.get("kind", ""), "actors": _actors(body),
            "action": str(action), "effect": str(effect), "result": str(result), "jobs": _jobs(body),
            "reason": str(inp.get("reason") or body.get("reason") or "")}


def _matches(s: dict[str, Any], f: Filter) -> bool:
    if f.job and f.job not in s["jobs"]:
        return False
    if f.actor and f.actor not in s["actors"]:
        return False
    if f.action and s["action"] != f.action:
        return False
    if f.effect and f.effect not in (s["effect"], s["result"]):
        return False
    if f.kind and s["kind"] != f.kind:
        return False
    if f.since or f.until:
        try:
            at = parse_time(s["time"], "time")
        except Invalid:
            return False
        if at is None or (f.since and at < f.since) or (f.until and at > f.until):
            return False
    return True


def search(gw: Gateway, f: Filter, *, before: int | None = None, limit: int = 50) -> dict[str, Any]:
    """Newest first: up to `limit` matching entries with seq < before (default: all). Scans back at most
    MAX_SCAN entries; `next_before` continues the walk."""
    size = gw.ledger.size()
    end = size if before is None else max(0, min(before, size))
    found: list[dict[str, Any]] = []
    scanned = 0
    cursor = end
    while cursor > 0 and len(found) < limit and scanned < MAX_SCAN:
        start = max(0, cursor - CHUNK)
        for e in reversed(gw.ledger.entries(start, cursor - start)):
            s = summary(e.seq, e.value)
            if _matches(s, f):
                found.append(s)
                if len(found) >= limit:
                    cursor = e.seq
                    break
        else:
            cursor = start
        scanned += CHUNK
    return {"size": size, "entries": found, "next_before": cursor if cursor > 0 else None,
            "scanned_to": cursor}


def entry_detail(gw: Gateway, seq: int) -> dict[str, Any]:
    """One entry, its inclusion proof in the tree of the latest signed checkpoint, and the result of
    checking both (signature of the checkpoint with the ledger's key; the proof against its root).
    Raises NotFound."""
    try:
        e = gw.ledger.entry(seq)
    except LedgerError as err:
        raise NotFound(f"no ledger entry {seq}") from err
    note = gw.ledger.latest_checkpoint()
    cp = peek_checkpoint(note)
    out: dict[str, Any] = {"seq": e.seq, "hash": e.hash, "raw": e.raw.decode(), "entry": e.value,
                           "summary": summary(e.seq, e.value), "checkpoint": note,
                           "checkpoint_size": cp.size, "checkpoint_root": base64.b64encode(cp.root).decode()}
    try:
        open_note(note, NoteVerifier.from_vkey(gw.ledger.vkey))
        out["checkpoint_signature"] = "valid"
    except LedgerError as err:
        out["checkpoint_signature"] = f"INVALID: {err}"
    if seq >= cp.size:
        out.update(proof=None, verified=False,
                   verdict=f"not yet covered: the latest signed checkpoint has {cp.size} entries")
        return out
    proof = gw.ledger.inclusion_proof(seq, cp.size)
    leaf = leaf_hash(e.raw)
    ok = leaf == proof.leaf_hash and verify_inclusion(seq, cp.size, leaf, proof.hashes, cp.root)
    ok = ok and out["checkpoint_signature"] == "valid"
    out.update(proof=proof.to_json(), verified=ok,
               verdict=("verified: the entry's leaf hash, with the proof's hashes, gives the signed root"
                        if ok else "NOT VERIFIED: the proof does not lead to the signed checkpoint's root"))
    return out


def export(gw: Gateway) -> Path:
    """Write a bundle of every signed entry to a temporary file and return its path (caller deletes it).
    Raises Invalid when there is nothing signed yet."""
    out = Path(tempfile.mkdtemp(prefix="jobgate-export-")) / "ledger.bundle"
    store = open_store(gw.settings.resolved_ledger_url(), create=False)
    try:
        export_bundle(store, out, keys=[gw.ledger.vkey], exported_at=gw.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))
    except LedgerError as e:
        raise Invalid(f"cannot export: {e}") from e
    finally:
        store.close()
    return out


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
