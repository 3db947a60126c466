"""Governance of a Slurm cluster (H1, F3, R5) as a pure comparison: Slurm's view against jobgate's record.

jobgate is the only identity meant to act on other people's jobs (deploy/slurm/README.md says what a site
must set for that). What it cannot prevent it must see: every act on a governed job that jobgate did not do
(a cancel, a requeue, a hold or release, a priority change), found in one look at Slurm and named with who
did it where Slurm says so, and every job submitted straight to Slurm, tracked but not governed (a blind
spot). `compare` takes what one look read (squeue, sacct, the acts slurmctld logged) and jobgate's record of
the jobs it submitted, and returns findings; it reads and writes nothing (oversight.py does, once a cycle).

Who did it, by source (Slurm 22.05, seen on the project's starter):
- a cancel: accounting's `kill_request_user`, and slurmctld's log (`REQUEST_KILL_JOB JobId=N uid U`);
- a hold or release: the log (`hold on JobId=N by uid U`); squeue's reason says only JobHeldUser (the job's
  own user: for a governed job, jobgate's account) or JobHeldAdmin (an operator or administrator);
- a priority change: the log (`set priority to P for JobId=N`, then `_slurm_rpc_update_job: complete
  JobId=N uid=U`);
- a requeue: nobody. Accounting keeps a REQUEUED attempt without its author and slurmctld logs none at
  SlurmctldDebug=info, so a requeue's `by` is None and the finding says so.

A finding's `key` is stable: the same act read again in the next look has the same key, so the caller
ledgers it once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

from gateway.execution.slurm.records import AccountedJob, QueuedJob

_SLACK = timedelta(seconds=2)
Act = Literal["cancel", "requeue", "hold", "release", "priority"]
COMMENT_PREFIX = "jobgate:"
HELD_REASONS = ("JobHeldUser", "JobHeldAdmin")
# Slurm states in which a job still holds or waits for resources: acts on it can still matter.
LIVE = ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING")


@dataclass(frozen=True)
class Governed:
    """jobgate's record of one job it put on Slurm (slurm_runs and the job's own row).

    `stop_asked`: jobgate asked a stop, a pause, a delete or an emergency stop (so a cancel by jobgate's
    account is its own). `paused`: jobgate holds it (a pause or an emergency hold). `priority`: the Slurm
    priority jobgate set last, None if it set none. `requeues`: the requeues jobgate asked for."""

    job_id: str
    slurm_job_id: int
    state: str
    stop_asked: bool = False
    paused: bool = False
    priority: int | None = None
    requeues: int = 0
    owner: str = ""
    project: str = ""
    submitted_at: datetime | None = None  # first submit (slurm_runs): older rows under the same id are another job's
    # How it ended, as jobgate's executor read it from accounting (slurm_runs): None while Slurm may still run it.
    ended: str | None = None
    cancelled_by: str | None = None


@dataclass(frozen=True)
class LoggedAct:
    """One act slurmctld logged on a job: who (uid) did what, when."""

    slurm_job_id: int
    act: Act
    uid: int
    at: datetime
    priority: int | None = None


@dataclass(frozen=True)
class Finding:
    """An act on a governed job that jobgate did not do (F3)."""

    key: str
    act: Act
    job_id: str
    slurm_job_id: int
    by: str | None  # who did it as Slurm names them; None where Slurm does not say
    source: str  # where `by` comes from
    detail: str
    with_jobgate_account: bool = False  # done as jobgate's own Slurm user, yet not by jobgate

    def as_json(self) -> dict[str, object]:
        return {"key": self.key, "act": self.act, "job_id": self.job_id, "slurm_job_id": self.slurm_job_id,
                "by": self.by, "by_source": self.source, "detail": self.detail,
                "with_jobgate_account": self.with_jobgate_account}


@dataclass(frozen=True)
class Ungoverned:
    """A job Slurm runs or queues that jobgate did not submit: tracked, not governed (R5)."""

    slurm_job_id: int
    user: str
    account: str
    partition: str
    state: str
    name: str
    nodes: int
    gpus: int
    submit_time: datetime | None
    claims: str | None = None  # the jobgate id its comment claims, though jobgate did not submit it

    def as_json(self) -> dict[str, object]:
        return {"slurm_job_id": self.slurm_job_id, "user": self.user, "account": self.account,
                "partition": self.partition, "state": self.state, "name": self.name, "nodes": self.nodes,
                "gpus": self.gpus, "submit_time": self.submit_time.isoformat() if self.submit_time else None,
                "claims": self.claims}


@dataclass(frozen=True)
class Look:
    """What one comparison found."""

    findings: list[Finding] = field(default_factory=list)
    ungoverned: list[Ungoverned] = field(default_factory=list)


# slurmctld's log lines (SlurmctldDebug=info) that name who acted on a job.
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\]\s+(.*)$")
_KILL = re.compile(r"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=(\d+) uid (\d+)")
_KILL_REFUSED = re.compile(r"_slurm_rpc_kill_job: job_str_signal\(\) uid=(\d+) JobId=(\d+) .*returned: (.*)$")
_HOLD = re.compile(r"_(hold|release)_job_rec: (?:hold|release hold) on JobId=(\d+) by uid (\d+)")
_SET_PRIORITY = re.compile(r"_update_job: set priority to (\d+) for JobId=(\d+)")
_UPDATE_DONE = re.compile(r"_slurm_rpc_update_job: complete JobId=(\d+) uid=(\d+)")


def parse_log(lines: Iterable[str], *, zone: tzinfo | None = None) -> list[LoggedAct]:
    """The acts on jobs in slurmctld log lines, in order. A kill Slurm refused (someone else's job) is not an
    act: nothing happened to the job. Lines it does not know are skipped. slurmctld writes its host's local
    time: `zone` is that host's zone (None: this process's)."""
    acts: list[LoggedAct] = []
    kills: dict[tuple[int, int], int] = {}  # (job, uid) -> index of the kill in acts, until refused
    priorities: dict[int, int] = {}  # job -> priority set by the update being logged
    for line in lines:
        m = _LOG_TIME.match(line.strip())
        if not m:
            continue
        naive = datetime.fromisoformat(m.group(1))
        at = (naive.replace(tzinfo=zone) if zone is not None else naive.astimezone()).astimezone(UTC)
        text = m.group(2)
        if k := _KILL.search(text):
            job, uid = int(k.group(1)), int(k.group(2))
            kills[(job, uid)] = len(acts)
            acts.append(LoggedAct(job, "cancel", uid, at))
        elif r := _KILL_REFUSED.search(text):
            uid, job = int(r.group(1)), int(r.group(2))
            index = kills.pop((job, uid), None)
            if index is not None and "success" not in r.group(3).lower():
                acts[index] = LoggedAct(-1, "cancel", uid, at)  # refused: dropped below
        elif h := _HOLD.search(text):
            acts.append(LoggedAct(int(h.group(2)), "hold" if h.group(1) == "hold" else "release",
                                  int(h.group(3)), at))
        elif p := _SET_PRIORITY.search(text):
            if int(p.group(1)) > 0:  # priority 0 is how a hold is written
                priorities[int(p.group(2))] = int(p.group(1))
        elif u := _UPDATE_DONE.search(text):
            job = int(u.group(1))
            if job in priorities:
                acts.append(LoggedAct(job, "priority", int(u.group(2)), at, priority=priorities.pop(job)))
    return [a for a in acts if a.slurm_job_id > 0]


def _last(acts: Sequence[LoggedAct], job: int, act: Act) -> LoggedAct | None:
    found = [a for a in acts if a.slurm_job_id == job and a.act == act]
    return found[-1] if found else None


def claimed_id(comment: str | None) -> str | None:
    """The jobgate id a Slurm job's comment names, if it names one."""
    if comment and comment.startswith(COMMENT_PREFIX):
        return comment[len(COMMENT_PREFIX):].strip() or None
    return None


def compare(queued: Sequence[QueuedJob], accounted: Sequence[AccountedJob], governed: Mapping[int, Governed],
            acts: Sequence[LoggedAct] = (), *, service_user: str, names: Mapping[int, str] | None = None) -> Look:
    """Findings from one look at Slurm: `queued` (squeue), `accounted` (sacct rows of the governed jobs and
    of recent ones), `acts` (slurmctld's log since the last look, or empty where it cannot be read),
    against `governed` (jobgate's record, by Slurm job id). `names` turns a logged uid into a user name.
    Raises nothing."""
    names = names or {}

    def who(uid: int) -> str:
        return names.get(uid, f"uid {uid}")

    findings: list[Finding] = []
    rows: dict[int, list[AccountedJob]] = {}
    for row in accounted:
        rows.setdefault(int(row.job_id), []).append(row)
    now_queued = {int(q.job_id): q for q in queued}
    ungoverned: list[Ungoverned] = []
    for q in queued:
        g = governed.get(int(q.job_id))
        # A Slurm job id is reused after a reset (R1): the job is the governed one only if it carries its id.
        if g is not None and q.comment.strip() == COMMENT_PREFIX + g.job_id:
            continue
        if q.state in LIVE:
            ungoverned.append(Ungoverned(
                slurm_job_id=int(q.job_id), user=q.user, account=q.account, partition=q.partition, state=q.state,
                name=q.name, nodes=q.nodes, gpus=q.nodes * q.gpus_per_node, submit_time=q.submit_time,
                claims=claimed_id(q.comment)))
    for sid, g in governed.items():
        seen = now_queued.get(sid)
        mine = seen if seen is not None and seen.comment.strip() == COMMENT_PREFIX + g.job_id else None
        # None above, and rows from before its first submission: another job under a reused id.
        attempts = [r for r in rows.get(sid, []) if _same_job(g, r)]
        findings += _cancel(g, mine, attempts, acts, service_user, who)
        findings += _requeues(g, attempts)
        if mine is not None and mine.state in LIVE:
            findings += _hold_release(g, mine, acts, service_user, who)
            findings += _priority(g, mine, acts, service_user, who)
        findings += _logged_only(g, acts, {f.key for f in findings}, service_user, who)
    return Look(findings=findings, ungoverned=ungoverned)


def _logged_only(g: Governed, acts: Sequence[LoggedAct], found: set[str], service_user: str,
                 who: Callable[[int], str]) -> list[Finding]:
    """Holds, releases and priority changes slurmctld logged by someone other than jobgate's account, which the
    state no longer shows: undone between two looks (jobgate's executor itself puts a governed job back as
    jobgate has it within a second), yet done."""
    out = []
    for a in acts:
        if a.slurm_job_id != g.slurm_job_id or a.act not in ("hold", "release", "priority"):
            continue
        by = who(a.uid)
        key = f"{g.job_id}:{a.act}:{a.at.isoformat()}"
        if by == service_user or key in found:
            continue
        if g.submitted_at is not None and a.at < g.submitted_at - _SLACK:
            continue  # an act on an earlier job under the same Slurm id
        what = f"priority set to {a.priority}" if a.act == "priority" else "held" if a.act == "hold" else "released"
        out.append(Finding(key=key, act=a.act, job_id=g.job_id, slurm_job_id=g.slurm_job_id, by=by,
                           source="slurmctld log", detail=f"{what} in Slurm at {a.at.isoformat()} "
                                                          f"(jobgate's record of the job: {g.state})"))
        found.add(key)
    return out


def _same_job(g: Governed, row: AccountedJob) -> bool:
    if row.comment and row.comment.strip() != COMMENT_PREFIX + g.job_id:
        return False
    # Slurm's submit time is whole seconds, and a requeue moves it later, never earlier.
    return g.submitted_at is None or row.submit_time is None or row.submit_time >= g.submitted_at - _SLACK


def _cancel(g: Governed, q: QueuedJob | None, attempts: Sequence[AccountedJob], acts: Sequence[LoggedAct],
            service_user: str, who: Callable[[int], str]) -> list[Finding]:
    cancelled_rows = [r for r in attempts if r.state.startswith("CANCELLED")]
    ended_cancelled = bool(g.ended and g.ended.startswith("CANCELLED"))
    seen = (q is not None and q.state.startswith("CANCELLED")) or bool(cancelled_rows) or ended_cancelled
    if not seen:
        return []
    by, source = None, "Slurm does not say (yet)"
    logged = _last(acts, g.slurm_job_id, "cancel")
    recorded = next((r.cancelled_by for r in reversed(cancelled_rows) if r.cancelled_by), None)
    if recorded is None and ended_cancelled:
        recorded = g.cancelled_by
    if recorded:
        by, source = recorded, "accounting (kill_request_user)"
    elif logged is not None:
        by, source = who(logged.uid), "slurmctld log"
    if by is None and g.stop_asked:
        return []  # jobgate asked for it; nothing says otherwise
    if by == service_user and g.stop_asked:
        return []
    mine = by == service_user
    detail = (f"cancelled in Slurm by {by or 'someone Slurm does not name'}"
              + (" with jobgate's own Slurm account, but jobgate asked no stop" if mine else "")
              + f" (jobgate's record of the job: {g.state})")
    return [Finding(key=f"{g.job_id}:cancel", act="cancel", job_id=g.job_id, slurm_job_id=g.slurm_job_id, by=by,
                    source=source, detail=detail, with_jobgate_account=mine)]


def _requeues(g: Governed, attempts: Sequence[AccountedJob]) -> list[Finding]:
    # Slurm's own preemption ends an attempt PREEMPTED; a `scontrol requeue` ends it REQUEUED, without its author.
    requeued = sum(1 for r in attempts if r.state.startswith("REQUEUED"))
    out = []
    for n in range(g.requeues + 1, requeued + 1):
        out.append(Finding(key=f"{g.job_id}:requeue:{n}", act="requeue", job_id=g.job_id,
                           slurm_job_id=g.slurm_job_id, by=None,
                           source="Slurm records no requeuer (accounting keeps the REQUEUED attempt only)",
                           detail=f"requeued in Slurm {requeued} time(s); jobgate asked {g.requeues}"))
    return out


def _hold_release(g: Governed, q: QueuedJob, acts: Sequence[LoggedAct], service_user: str,
                  who: Callable[[int], str]) -> list[Finding]:
    held = q.reason in HELD_REASONS or (q.state == "PENDING" and q.priority == 0)
    if held == g.paused:
        return []
    act: Act = "hold" if held else "release"
    logged = _last(acts, g.slurm_job_id, act)
    if logged is not None:
        by: str | None = who(logged.uid)
        source = "slurmctld log"
    elif act == "hold" and q.reason == "JobHeldUser":
        by, source = q.user, "squeue reason JobHeldUser (the job's own Slurm user)"
    else:
        by, source = None, f"squeue reason {q.reason or 'None'}: an operator or administrator"
    detail = (f"held in Slurm ({q.reason}) while jobgate has it {g.state}" if held
              else f"released in Slurm ({q.state}) while jobgate holds it {g.state}")
    key = f"{g.job_id}:{act}:{logged.at.isoformat()}" if logged is not None else f"{g.job_id}:{act}:r{q.restarts}"
    return [Finding(key=key, act=act, job_id=g.job_id, slurm_job_id=g.slurm_job_id,
                    by=by, source=source, detail=detail, with_jobgate_account=by == service_user)]


def _priority(g: Governed, q: QueuedJob, acts: Sequence[LoggedAct], service_user: str,
              who: Callable[[int], str]) -> list[Finding]:
    if q.priority == 0:
        return []  # held: the hold is the finding
    logged = _last(acts, g.slurm_job_id, "priority")
    if g.priority is not None and q.priority != g.priority:
        by = who(logged.uid) if logged is not None else None
        key = f"{g.job_id}:priority:{logged.at.isoformat()}" if logged is not None else \
            f"{g.job_id}:priority:{q.priority}"
        return [Finding(key=key, act="priority", job_id=g.job_id,
                        slurm_job_id=g.slurm_job_id, by=by,
                        source="slurmctld log" if logged else "Slurm does not say who",
                        detail=f"priority {q.priority} in Slurm; jobgate set {g.priority}",
                        with_jobgate_account=by == service_user)]
    if g.priority is None and logged is not None and who(logged.uid) != service_user:
        # jobgate set none, so Slurm's own factors rule; someone else fixed one.
        return [Finding(key=f"{g.job_id}:priority:{logged.at.isoformat()}", act="priority", job_id=g.job_id,
                        slurm_job_id=g.slurm_job_id, by=who(logged.uid), source="slurmctld log",
                        detail=f"priority set to {logged.priority} in Slurm; jobgate set none")]
    return []
