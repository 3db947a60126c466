"""Sentences for the researcher whose job waits (Q10): what it needs, what there is, what it waits for."""

from __future__ import annotations

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


def guessed_start(default_runtime_s: float) -> str:
    return (f" (a guess: some of those GPUs are held by jobs without a runtime limit, taken to run"
            f" {duration(default_runtime_s)})")


def beyond_window(nodes: int, gpus: int, fitting: int, start: datetime, window_s: float) -> str:
    return (f"{gang(nodes, gpus)}; {have(fitting, now=True)}; expected to start at {when(start)}, beyond "
            f"the {duration(window_s)} reservation window, so no GPUs are held for it yet")


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
