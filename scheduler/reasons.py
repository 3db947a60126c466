"""Sentences for the researcher whose job waits (Q10): what it needs, what there is, what it waits for."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from scheduler.model import JobId


def gang(nodes: int, gpus: int, *, free: bool = True) -> str:
    """'needs 2 nodes with 8 free GPUs each' / 'needs 1 node with 4 GPUs'."""
    kind = "free GPUs" if free else "GPUs"
    if gpus == 1:
        kind = kind[:-1]
    if nodes == 1:
        return f"needs 1 node with {gpus} {kind}"
    return f"needs {nodes} nodes with {gpus} {kind} each"


def have(count: int, *, now: bool = False) -> str:
    """'no node has them' / '1 node has them' / '3 nodes have them'."""
    when = " now" if now else ""
    if count == 0:
        return f"no node has them{when}"
    if count == 1:
        return f"1 node has them{when}"
    return f"{count} nodes have them{when}"


def waiting(nodes: int, gpus: int, fitting: int, *, held: int = 0, held_for: JobId | None = None) -> str:
    """'needs 2 nodes with 8 free GPUs each; 1 node has them[; 1 more is held for job X]'."""
    text = f"{gang(nodes, gpus)}; {have(fitting)}"
    if held and held_for is not None:
        text += f"; {held} more {'is' if held == 1 else 'are'} held for job {held_for}"
    return text


def impossible(nodes: int, gpus: int, alive_fitting: int, largest_alive: int) -> str:
    if gpus > largest_alive:
        return f"needs {gpus} GPUs per node; the largest alive node has {largest_alive}"
    noun = "node has" if alive_fitting == 1 else "nodes have"
    return f"{gang(nodes, gpus, free=False)}; only {alive_fitting} alive {noun} that many"


ISOLATED_ONLY = " (it may run only on nodes that isolate jobs)"


def needs_isolation(nodes: int, gpus: int, isolated_fitting: int) -> str:
    noun = "node isolates" if isolated_fitting == 1 else "nodes isolate"
    return f"{gang(nodes, gpus, free=False)} on nodes that isolate jobs; only {isolated_fitting} such {noun} jobs"


def when(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def reserved(nodes: int, gpus: int, fitting: int, start: datetime) -> str:
    return f"{gang(nodes, gpus)}; {have(fitting, now=True)}; GPUs are held for it from {when(start)}"


def start_unknown(nodes: int, gpus: int, fitting: int) -> str:
    return (f"{gang(nodes, gpus)}; {have(fitting, now=True)}; start time unknown: the GPUs it needs are "
            "withheld (a lost node, or a stop nobody could confirm)")


def guessed_start(default_runtime_s: float, max_occupancy_s: float | None = None) -> str:
    renewed = ("" if max_occupancy_s is None else
               f", or by jobs taken to be stopped at the end of their {duration(max_occupancy_s)} maximum"
               " occupancy (max_occupancy_s) as if not renewed")
    return (f" (a guess: some of those GPUs are held by jobs without a runtime limit, taken to run"
            f" {duration(default_runtime_s)} (default_runtime_s){renewed})")


def beyond_window(nodes: int, gpus: int, fitting: int, start: datetime, window_s: float,
                  held_from: datetime) -> str:
    return (f"{gang(nodes, gpus)}; {have(fitting, now=True)}; expected to start at {when(start)}, beyond "
            f"the {duration(window_s)} reservation window (reservation_window_s), so no GPUs are held for it "
            f"yet; they are from {when(held_from)}, when its start is within the window or it has waited that long")


def not_tried_preemption(max_attempts: int, planned: bool) -> str:
    """Rule 6's bounds: one plan per cycle, tried for at most max_preemption_attempts jobs; the next cycle tries
    again."""
    if planned:
        return "; its preemption is tried next cycle: this cycle already preempts for another job (one plan a cycle)"
    return (f"; its preemption is tried in a later cycle: at most {max_attempts} jobs a cycle try one "
            "(max_preemption_attempts)")


def stopped_by(start: datetime) -> str:
    return f", at about {when(start)} (their grace windows)"


def preempting_later(kind: str, waits: list[tuple[JobId, str, datetime]], minimum_s: dict[str, float],
                     start: datetime) -> str:
    """'urgent: lower-priority job X may be preempted from T, once it has run the minimum runtime before a
    preemption (min_runtime_s: normal 10 min); expected to start at about T2, after its grace window'."""
    names = ", ".join(job for job, _, _ in waits)
    noun = "job" if len(waits) == 1 else "jobs"
    from_ = max(at for _, _, at in waits)
    rules = ", ".join(f"{q} {duration(s)}" for q, s in sorted(minimum_s.items()))
    what = (f"reclaiming its tenant's quota: borrowed {noun} {names}" if kind == "reclaim"
            else f"urgent: lower-priority {noun} {names}")
    return (f"{what} may be preempted from {when(from_)}, once {'it has' if len(waits) == 1 else 'they have'} run "
            f"the minimum runtime before a preemption (min_runtime_s: {rules}); expected to start at about "
            f"{when(start)}, after {'its' if len(waits) == 1 else 'their'} grace window")


def behind_reservation(head: JobId, start: datetime, runtime_limit_s: float | None, *, stoppable: bool = True) -> str:
    why = ("it has no runtime limit" if runtime_limit_s is None
           else "it is declared not stoppable, so its runtime limit cannot be enforced" if not stoppable
           else f"its {duration(runtime_limit_s)} runtime limit runs past that")
    return (f"would fit now only on GPUs held for job {head}, which starts at {when(start)}; "
            f"{why}")


def not_tried(nodes: int, gpus: int, fitting: int, depth: int, head: JobId) -> str:
    return (f"{gang(nodes, gpus)}; {have(fitting, now=True)}; not tried this cycle: only {depth} waiting "
            f"jobs behind job {head} are tried per cycle")


def preempting(kind: str, victims: list[JobId]) -> str:
    """'reclaiming its tenant's GPUs lent to job X' / 'preempting jobs X, Y (lower priority)'."""
    names = ", ".join(victims)
    noun = "job" if len(victims) == 1 else "jobs"
    if kind == "reclaim":
        return f"reclaiming its tenant's quota: gracefully stopping borrowed {noun} {names}"
    return f"urgent: gracefully preempting lower-priority {noun} {names}; starts when they have stopped"


def quota_allows(at: datetime | None, ending: Sequence[JobId], start: datetime | None, count: int = 0) -> str:
    """What a quota-held job waits for, after the tier's own sentence: '; the quota allows it from T, when job X
    ends (by its runtime limit or the default run time)'. `count`: how many end then, `ending` naming some."""
    if at is None:
        return ("; no running job's expected end makes room for it under that quota: it waits for the quota to "
                "change, or for withheld GPUs (a lost node) to come back")
    count = max(count, len(ending))
    shown = ", ".join(ending) + (f" and {count - len(ending)} more" if count > len(ending) else "")
    ends = f"job {shown} ends" if count == 1 else f"jobs {shown} end"
    fit = "" if start is None or start == at else f"; its gang fits from {when(start)}"
    return (f"; the quota allows it from {when(at)}, when {ends} (by their runtime limits, or the default run "
            f"time without one){fit}")


def degraded(nodes: Sequence[str]) -> str:
    """'; node a, big enough, takes no work while degraded ...' (empty when none is big enough)."""
    if not nodes:
        return ""
    names = ", ".join(nodes)
    noun = f"node {names} is" if len(nodes) == 1 else f"nodes {names} are"
    return (f"; {noun} degraded (an agent reports fewer GPUs than its jobs hold) and takes no work until its agent "
            "reports as many again, at no known time")
