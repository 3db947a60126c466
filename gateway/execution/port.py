"""The execution port (DESIGN, execution behind a port): what the gateway asks of whatever runs its jobs, and the
words that whatever runs them reports back in.

The decision pipeline, approvals and the ledger know only this. Asks go out through `Execution`: place and start
a job that waits in its queue, deliver a job's prepare signal and stop it when its grace window ends (P4), requeue
it, change its priority, remove its files, say where they are and what runs. What happened comes back through
`Reports`, which the jobs room implements (gateway/jobs/reports.py): a run was placed, a part of it started, is
stopping, ended with its evidence, or removed files. Implementations: gateway/native/ (jobgate's scheduler loop
and node agents) and gateway/execution/inprocess.py (complete, in this process, for tests that are not about
agents); gateway/execution/slurm/execution.py on a Slurm cluster, whose placement is Slurm's. Every call is made
inside the caller's business transaction (`session`), so what it asks is carried out only if that transaction
commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict

from sqlalchemy.orm import Session

from gateway.store.models import Job

# How a stop ended (P4): the process exited within its grace window, or was killed when the window ended.
Ending = Literal["graceful", "forced"]
ArtifactScope = Literal["all", "checkpoints"]  # a deleted job's every file (A6); its checkpoints only (P1)
# A part's process event: "started"; "stopping" (the prepare signal was delivered); "stopped" (it ended after a
# stop was asked for); "exited" (it ended on its own).
PartEvent = Literal["started", "stopping", "stopped", "exited"]


class CheckpointFile(TypedDict, total=False):
    """A file the job wrote under its checkpoint directory, as its executor found it after the run (C5)."""

    path: str
    size: int
    mtime: float
    sha256: str


class Evidence(TypedDict, total=False):
    """What an executor saw of how a part of a run ended (C3, P4), ledgered as it is given. Every key is
    optional: an executor reports what it knows, and the gateway reads only these."""

    outcome: Ending
    exit_code: int | None
    exit_signal: str | None
    signal: str  # the prepare signal delivered
    signal_sent_at: float
    grace_seconds: float
    exited_at: float
    process_group_gone: bool  # False: something survived the forced stop; its GPUs stay withheld
    gpus_released: list[int]
    checkpoints: list[CheckpointFile]
    artifacts: list[CheckpointFile]
    log_tail: list[str]
    note: str
    slurm: dict[str, Any]  # what Slurm itself said of the run (its job id, state, accounting row)


@dataclass(frozen=True)
class Running:
    """One part of a run the executor holds: a job's processes on one node and the GPUs they have there."""

    job_id: str
    node: str
    gpus: tuple[int, ...]
    state: str  # starting | running | stopping


class Execution(Protocol):
    """What the gateway asks of whatever runs its jobs. Raises nothing of its own for a job it was given."""

    def queued(self, job: Job) -> None:
        """Place and start `job` once it fits: it entered its queue (submitted, or resumed after a pause)."""

    def requeued(self, job: Job) -> None:
        """`job` went back to its queue after a stop, keeping its priority and wait (P2): place it again."""

    def reprioritised(self, job: Job, priority: float) -> None:
        """`job`'s effective priority is now `priority` (A2, A3): order and preempt by it."""

    def changed(self) -> None:
        """Something placement depends on changed (a quota, GPUs a person released): look again soon."""

    def stop(self, session: Session, job: Job, node: str, *, grace_seconds: float, reason: str) -> str:
        """Deliver `job`'s prepare signal (its stop_signal) to its processes on `node` now, and stop them when
        `grace_seconds` have passed (P4); the evidence comes back as a report. Returns the request's reference."""

    def delete_artifacts(self, session: Session, job: Job, node: str, *, what: ArtifactScope, reason: str) -> str:
        """Remove `job`'s files on `node` (`what`); each removed file comes back as a report, nothing is deleted
        on the gateway's side. Returns the request's reference."""

    def holders(self, session: Session, job: Job) -> list[str]:
        """Where `job`'s files (checkpoints, logs) may be: every node one of its runs was placed on."""

    def running(self, session: Session) -> list[Running]:
        """What runs now, part by part."""


class Reports(Protocol):
    """What an executor tells the gateway about the jobs it was given (gateway/jobs/reports.py implements it).
    Each call is made in a business transaction the executor holds; each change it causes is ledgered."""

    def placed(self, session: Session, job_id: str, parts: Sequence[tuple[str, Sequence[int]]], *,
               borrowed: bool, priority: Mapping[str, float]) -> bool:
        """The executor placed a waiting job: (node, GPUs) per part, on owned or borrowed quota, at its priority
        parts (`total` among them). False if the job no longer waits (nothing was placed)."""

    def part_event(self, session: Session, job_id: str, node: str, event: PartEvent, *, at: float,
                   pid: int | None = None, evidence: Evidence | None = None, reference: str | None = None,
                   detail: str = "") -> None:
        """A part of a run started, is stopping, stopped or exited (`evidence` for the last two), at `at` (epoch
        seconds); `reference` names the request it answers."""

    def preempted(self, session: Session, job_id: str, *, preemptor: str | None, reason: str) -> bool:
        """The executor's own scheduler preempted a running job and already stopped it (Slurm's partition
        preemption): ledgered as a preemption, so that the `stopped` report that follows requeues it keeping its
        priority and wait (P2). False if the job was not running (nothing was recorded)."""

    def may_preempt(self, session: Session, waiting: Sequence[str]) -> bool:
        """Whether jobgate's rules would look for victims for any of these waiting jobs (one of a preempting
        queue, urgent). Only reads."""

    def preempt_for(self, session: Session, waiting: Sequence[str], ungoverned: Mapping[str, int]) -> list[int]:
        """Jobs the executor's own scheduler holds waiting for resources (`waiting`, jobgate ids): jobgate decides
        whether its rules preempt for one (urgent over lower tiers, as natively), on what runs (its placed jobs,
        and `ungoverned`: node -> GPUs used there by jobs it does not govern, never victims). A plan is ledgered
        and its victims stopped through the executor's stop with their grace window. The decisions' seqs."""

    def cancelled_while_waiting(self, session: Session, job_id: str, *, by: str | None, at: float, reason: str,
                                evidence: Evidence) -> bool:
        """Someone other than jobgate cancelled a job while it still waited in the executor's own queue (Slurm's
        accounting says who and when): it ends `stopped`, cancelled out of band, and is not submitted again.
        False if the job no longer waits (nothing was recorded)."""

    def deleted(self, session: Session, job_id: str, node: str, *, objects: Sequence[Mapping[str, Any]],
                reason: str, left: Sequence[str] = (), unlisted: int = 0) -> None:
        """The executor removed these files of the job on `node` for a delete_artifacts; `left` it could not
        remove, `unlisted` more it removed than it listed."""
