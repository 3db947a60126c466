"""What-if: replay recorded decision inputs under a candidate policy set and list the decisions that flip.

Every ledger `decision` entry stores the exact input the gateway built (`body.input`) and the decision it
made (`body.decision`). The replay feeds each input to an engine built from the candidate set and a set
of role bindings — the recorded input never holds capabilities, the engine adds them from the bindings,
exactly as at decision time. So a flip can come from the candidate policy or from bindings that changed
since; the caller says which bindings it used and the report repeats it.

A flip is any change of effect (allow/deny/needs_approval) or, for a needs_approval that stays one, of
the number of approvals still required. Decisions the policy engine never saw (token scope, rate limit)
are skipped and counted. Replays run in worker processes, one compiled engine each; identical inputs
are evaluated once (decisions are deterministic for the same input and policy hash).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.policy.engine import EmbeddedEngine, RoleBinding
from gateway.policy.loader import load_policy_set


def _loads(raw: bytes | bytearray | str) -> Any:
    """orjson where it can (several times faster); the standard parser for what orjson refuses (integers
    beyond 64 bits, NaN), so every ledger entry parses as before."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _dumps(value: Any) -> str:
    """Compact JSON text of a decision input, used as its identity. The standard encoder, not orjson:
    orjson writes NaN as null, and two inputs must never share a text unless they are equal."""
    return json.dumps(value, separators=(",", ":"))


# Rules of denials decided before the policy engine; replaying them under a policy says nothing.
PRE_POLICY_RULES = frozenset({"token_scope", "H2.rate_limit"})
CHUNK = 1000


@dataclass(frozen=True)
class Recorded:
    """One recorded decision: ledger seq and time, the input, and what was decided."""

    seq: int
    time: str
    input: dict[str, Any]
    effect: str
    approvals: int
    rules: tuple[str, ...]


@dataclass(frozen=True)
class Flip:
    seq: int
    time: str
    actor: str
    action: str
    targets: tuple[str, ...]
    kind: str  # e.g. "allow→deny", "approvals 1→2"
    before: dict[str, Any]
    after: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "actor": self.actor, "action": self.action,
                "targets": list(self.targets), "kind": self.kind, "before": self.before, "after": self.after}


@dataclass
class Report:
    candidate_hash: str
    bindings_source: str
    replayed: int = 0
    unique_inputs: int = 0
    skipped: int = 0
    flips: list[Flip] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.flips).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate_hash": self.candidate_hash,
            "bindings": self.bindings_source,
            "replayed": self.replayed,
            "unique_inputs": self.unique_inputs,
            "skipped_not_decided_by_policy": self.skipped,
            "flipped": len(self.flips),
            "counts": self.counts(),
            "seconds": round(self.seconds, 3),
            "per_second": round(self.replayed / self.seconds) if self.seconds > 0 else None,
            "flips": [f.to_json() for f in self.flips],
        }


def records_from_entries(entries: Iterable[bytes | dict[str, Any]],
                         since: datetime | None = None) -> Iterator[Recorded]:
    """Decision records from raw ledger entries (bytes or parsed); other kinds are passed over."""
    since_text = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if since else None
    for raw in entries:
        entry = _loads(raw) if isinstance(raw, bytes | bytearray) else raw
        if entry.get("kind") != "decision":
            continue
        # Ledger times are fixed-width RFC 3339 UTC, so text order is time order.
        if since_text and str(entry.get("time", "")) < since_text:
            continue
        body = entry.get("body") or {}
        doc, decision = body.get("input"), body.get("decision") or {}
        if not isinstance(doc, dict):
            continue
        yield Recorded(
            seq=int(entry["seq"]), time=str(entry.get("time", "")), input=doc,
            effect=str(decision.get("effect")),
            approvals=int((decision.get("approvals_required") or {}).get("count") or 0),
            rules=tuple(decision.get("rules") or ()),
        )


# -- replay in worker processes ----------------------------------------------------------------------

_ENGINE: EmbeddedEngine | None = None


def _init_worker(policy_dir: str, bindings: list[tuple[str, str, str]]) -> None:
    global _ENGINE
    _ENGINE = EmbeddedEngine(load_policy_set(Path(policy_dir)), [RoleBinding(*b) for b in bindings])


def _decide_chunk(docs: list[str]) -> list[tuple[str, int, list[str], list[str]]]:
    assert _ENGINE is not None
    out = []
    for text in docs:
        d = _ENGINE.decide(_loads(text))
        out.append((d.effect, int(d.approvals_required.get("count") or 0), list(d.rules), list(d.reasons)))
    return out


def _kind(before_effect: str, before_n: int, after_effect: str, after_n: int) -> str | None:
    if before_effect != after_effect:
        return f"{before_effect}→{after_effect}"
    if after_effect == "needs_approval" and before_n != after_n:
        return f"approvals {before_n}→{after_n}"
    return None


def replay(
    policy_dir: Path,
    records: Iterable[Recorded],
    bindings: Sequence[RoleBinding],
    *,
    bindings_source: str,
    workers: int | None = None,
) -> Report:
    """Replay every record under the set in policy_dir. Raises PolicyLoadError for a bad candidate set."""
    import time

    started = time.perf_counter()
    candidate = load_policy_set(policy_dir)  # refuse a broken candidate before starting workers
    report = Report(candidate.hash, bindings_source)
    chosen: list[Recorded] = []
    for r in records:
        if PRE_POLICY_RULES & set(r.rules):
            report.skipped += 1
        else:
            chosen.append(r)
    report.replayed = len(chosen)
    plain = [(b.principal, b.role, b.project) for b in bindings]
    workers = workers or min(os.cpu_count() or 1, max(1, len(chosen) // CHUNK))
    results: list[tuple[str, int, list[str], list[str]]] = []
    pool = (ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(str(policy_dir), plain))
            if workers > 1 else None)
    try:
        # The key is the input's full JSON text, so only inputs identical in every field share a decision.
        # Ledger inputs come back from canonical JSON with their keys in one order, so no sort is needed
        # to find the duplicates (an input whose keys came in another order is merely replayed twice).
        # Workers start compiling the candidate set while the keys are built.
        keys = [_dumps(r.input) for r in chosen]
        unique = list(dict.fromkeys(keys))
        report.unique_inputs = len(unique)
        chunks = [unique[i:i + CHUNK] for i in range(0, len(unique), CHUNK)]
        if pool is None:
            _init_worker(str(policy_dir), plain)
            for chunk in chunks:
                results.extend(_decide_chunk(chunk))
        else:
            for part in pool.map(_decide_chunk, chunks):
                results.extend(part)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    decided = dict(zip(unique, results, strict=True))
    for r, key in zip(chosen, keys, strict=True):
        effect, n, rules, reasons = decided[key]
        kind = _kind(r.effect, r.approvals, effect, n)
        if kind is None:
            continue
        targets = tuple(str(t.get("id")) for t in r.input.get("targets") or () if isinstance(t, dict))
        report.flips.append(Flip(
            seq=r.seq, time=r.time, actor=str((r.input.get("actor") or {}).get("id")),
            action=str(r.input.get("action")), targets=targets, kind=kind,
            before={"effect": r.effect, "approvals": r.approvals, "rules": list(r.rules)},
            after={"effect": effect, "approvals": n, "rules": rules, "reasons": reasons},
        ))
    report.seconds = time.perf_counter() - started
    return report
