"""What-if: replay recorded decision inputs under a candidate policy set and list the decisions that flip.

Every ledger `decision` entry stores the exact input the gateway built (`body.input`) and the decision it
made (`body.decision`). The replay feeds each input to an engine built from the candidate set and a set
of role bindings — the recorded input never holds capabilities, the engine adds them from the bindings,
exactly as at decision time. So a flip can come from the candidate policy or from bindings that changed
since; the caller says which bindings it used and the report repeats it.

A flip is any change of effect (allow/deny/needs_approval) or, for a needs_approval that stays one, of
the number of approvals still required. Decisions the policy engine never saw (token scope, rate limit)
are skipped and counted. Identical inputs are evaluated once: a decision is a pure function of the input,
the role bindings and the policy set, and one replay holds all three fixed.

A replay of SERIAL_BELOW records or more runs in worker processes, each compiling the candidate
set once and deciding slices of the inputs in turn; results come back in input order, so the report
(every flip, in ledger order, and the counts) is the same as a serial replay's. Smaller replays run in
the calling process: starting the workers (each builds an engine: Casbin with every binding, the Rego
bundle) costs more than they would save.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.decisions.policy.engine import BREAK_GLASS_RULE, EmbeddedEngine, RoleBinding
from gateway.decisions.policy.loader import PolicySet, load_policy_set


def _loads(raw: bytes | bytearray | str) -> Any:
    """orjson where it can (several times faster); the standard parser for what orjson refuses (integers
    beyond 64 bits, NaN), so every ledger entry parses as before."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _identity(value: dict[str, Any]) -> bytes:
    """Compact JSON bytes of a decision input, used to find identical inputs.

    orjson where it can (ten times faster than the standard encoder). It writes NaN and infinities as
    null, so equal bytes do not prove equal inputs: replay() compares the inputs themselves before it
    shares a decision. The standard encoder for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


# Rules of denials decided before the policy engine; replaying them under a policy says nothing.
PRE_POLICY_RULES = frozenset({"token_scope", "H2.rate_limit"})
# Distinct inputs per slice a worker decides: small enough for steady progress and an even share
# between workers at the end, large enough that handing slices out costs nothing noticeable.
CHUNK = 500
# Below this many records a replay runs serially: measured on 2 cores with 10,002 role bindings (bench/policy.py),
# 500 records take as long either way (each worker first builds its engine), 1,000 are a fifth faster in a pool.
SERIAL_BELOW = 1000

Outcome = tuple[str, int, list[str], list[str]]  # effect, approvals still required, rules, reasons


@dataclass(frozen=True)
class Recorded:
    """One recorded decision: ledger seq and time, the input, and what was decided."""

    seq: int
    time: str
    input: dict[str, Any]
    effect: str
    approvals: int
    rules: tuple[str, ...]
    bypass: bool = False  # made with a break-glass credential (F2)


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
            bypass=body.get("bypass") is True,
        )


# -- replay in worker processes ----------------------------------------------------------------------

_ENGINE: EmbeddedEngine | None = None


def _init_worker(candidate: PolicySet, bindings: list[tuple[str, str, str]]) -> None:
    global _ENGINE
    _ENGINE = EmbeddedEngine(candidate, [RoleBinding(*b) for b in bindings])


def _init_pool_worker(candidate: PolicySet, bindings: list[tuple[str, str, str]]) -> None:
    """A worker process: the engine, then gc.freeze(). The engine's objects (Casbin's role graph holds
    several per binding) live as long as the worker, and without the freeze every full collection
    triggered by the decisions' allocations walks them all again (about a tenth of a worker's time with
    10,000 bindings). Only in a worker of our own: the calling process's objects are never frozen."""
    _init_worker(candidate, bindings)
    gc.freeze()


def _decide_chunk(docs: list[dict[str, Any]]) -> list[Outcome]:
    assert _ENGINE is not None
    out = []
    for doc in docs:
        d = _ENGINE.decide(doc)
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
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Replay every record under the set in policy_dir. Raises PolicyLoadError for a bad candidate set.

    `workers`: processes to decide in (default: one per CPU from SERIAL_BELOW records on, none below);
    1 decides in this process. `progress(done, total)` is called as distinct inputs are decided.
    """
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
    workers = worker_count(workers, len(chosen))
    # Workers start compiling the candidate set while the inputs are keyed. They are handed the set loaded
    # above, never the directory: read again, an edit saved meanwhile would be replayed under its hash.
    pool = (ProcessPoolExecutor(workers, initializer=_init_pool_worker, initargs=(candidate, plain))
            if workers > 1 else None)
    try:
        unique, slots = _distinct(chosen)
        report.unique_inputs = len(unique)
        results = _decide_all(unique, pool, candidate, plain, progress)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for r, slot in zip(chosen, slots, strict=True):
        effect, n, rules, reasons = results[slot]
        if r.bypass:
            effect, n, rules = _break_glass_override(effect, n, rules)
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


def _break_glass_override(effect: str, n: int, rules: list[str]) -> tuple[str, int, list[str]]:
    """What the gateway makes of a break-glass call's decision (pipeline.decide): the grant stands in for the
    second person, so a needs_approval for exactly one more person is an allow. A request wanting more people
    still waits for all of them, as the gateway holds it; turning that into an allow too showed a flip under an
    unchanged set and hid a candidate that asks a break-glass call for one more approver."""
    if effect == "needs_approval" and n == 1:
        return "allow", 0, [*rules, BREAK_GLASS_RULE]
    return effect, n, rules


def worker_count(requested: int | None, records: int, cpus: int | None = None) -> int:
    """Processes a replay of `records` decides in; 1 means in the calling process.

    1. Asked for a number: that many, but no more than there are slices (CHUNK) to hand out.
    2. Otherwise none below SERIAL_BELOW records (start-up would cost more than it saves), else one per CPU.
    """
    if requested is None:
        requested = (cpus or os.cpu_count() or 1) if records >= SERIAL_BELOW else 1
    return max(1, min(requested, -(-records // CHUNK)))


def _distinct(chosen: Sequence[Recorded]) -> tuple[list[dict[str, Any]], list[int]]:
    """The distinct inputs, in first-seen order, and for each record the index of its input among them.

    Two records share a decision only when their inputs are equal as values (not merely as JSON bytes,
    see _identity). Ledger inputs come back from canonical JSON with their keys in one order, so equal
    inputs have equal bytes (an input whose keys came in another order is merely replayed twice)."""
    unique: list[dict[str, Any]] = []
    first: dict[bytes, int] = {}
    slots: list[int] = []
    for r in chosen:
        key = _identity(r.input)
        slot = first.get(key)
        if slot is None or unique[slot] != r.input:
            slot = len(unique)
            unique.append(r.input)
            first.setdefault(key, slot)
        slots.append(slot)
    return unique, slots


def _decide_all(unique: list[dict[str, Any]], pool: ProcessPoolExecutor | None, candidate: PolicySet,
                plain: list[tuple[str, str, str]], progress: Callable[[int, int], None] | None) -> list[Outcome]:
    """Outcomes of `unique`, in its order: slices decided by the pool's workers (map keeps their order), or
    here in this process."""
    chunks = [unique[i:i + CHUNK] for i in range(0, len(unique), CHUNK)]
    if pool is None:
        _init_worker(candidate, plain)
        parts: Iterator[list[Outcome]] = map(_decide_chunk, chunks)
    else:
        parts = pool.map(_decide_chunk, chunks)
    results: list[Outcome] = []
    for part in parts:
        results.extend(part)
        if progress is not None:
            progress(len(results), len(unique))
    return results
