"""A complete implementation of the execution port inside this process, for tests that are not about agents.

Its nodes are a name and a GPU count each, registered in the store as alive; its runs are records in memory. It
does what it is asked when `run()` is called, in one business transaction per step, and reports back through the
port's Reports as any executor does (the jobs room folds them, gateway/jobs/reports.py):

1. Place: waiting jobs in queue order (urgent, normal, batch; then priority, then age), each gang on the first
   nodes with enough free GPUs, on owned quota; every part reports `started` at once.
2. Stop: each part asked to stop gets its prepare signal, writes one checkpoint file, and exits within its
   grace window: `stopping`, then `stopped` with graceful evidence naming the checkpoint (P4, C5).
3. Delete: each delete_artifacts removes the job's files there (its checkpoints, or everything) and reports
   every file removed.
4. `finish(job_id)` lets a running job end on its own (`exited` with its exit code).

Nothing here is forced, lost or refused; tests about those talk to node agents (gateway/native/).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.execution.port import ArtifactScope, CheckpointFile, Evidence, Reports, Running
from gateway.store.models import Allocation, Job, Node
from gateway.store.scheduler_tables import SchedJob

QUEUE_ORDER = {"urgent": 0, "normal": 1, "batch": 2}


@dataclass
class _Part:
    job_id: str
    node: str
    gpus: tuple[int, ...]
    pid: int
    state: str = "running"  # running | stopping
    files: list[CheckpointFile] = field(default_factory=list)


@dataclass(frozen=True)
class _Stop:
    job_id: str
    node: str
    grace_seconds: float
    signal: str
    reference: str


@dataclass(frozen=True)
class _Delete:
    job_id: str
    node: str
    what: ArtifactScope
    reason: str
    reference: str


class InProcessExecution:
    """The execution port carried out in this process (see the module docstring). `transaction` opens a business
    transaction; `clock` is read at each step, so a test that moves the gateway's clock moves this one too."""

    def __init__(self, nodes: Mapping[str, int], *, transaction: Callable[[], AbstractContextManager[Session]],
                 clock: Callable[[], datetime], reports: Reports) -> None:
        self.nodes = dict(nodes)
        self._transaction = transaction
        self._clock = clock
        self._reports = reports
        self._parts: dict[tuple[str, str], _Part] = {}
        self._files: dict[tuple[str, str], list[CheckpointFile]] = {}  # what each run left on each node
        self._ran_on: dict[str, set[str]] = {}
        self._stops: list[_Stop] = []
        self._deletes: list[_Delete] = []
        self._references = itertools.count(1)
        self._pids = itertools.count(10_000)
        self.wanted = False  # something was asked since the last run()

    # -- the port -------------------------------------------------------------------------------------------

    def queued(self, job: Job) -> None:
        self.wanted = True

    def requeued(self, job: Job) -> None:
        self.wanted = True

    def reprioritised(self, job: Job, priority: float) -> None:
        self.wanted = True  # the store holds the priority; the next placement orders by it

    def changed(self) -> None:
        self.wanted = True

    def stop(self, session: Session, job: Job, node: str, *, grace_seconds: float, reason: str) -> str:
        reference = self._reference("stop")
        self._stops.append(_Stop(job.id, node, grace_seconds, job.stop_signal, reference))
        self.wanted = True
        return reference

    def delete_artifacts(self, session: Session, job: Job, node: str, *, what: ArtifactScope, reason: str) -> str:
        reference = self._reference("delete")
        self._deletes.append(_Delete(job.id, node, what, reason, reference))
        self.wanted = True
        return reference

    def holders(self, session: Session, job: Job) -> list[str]:
        return sorted(self._ran_on.get(job.id, set()) | {str(p["node"]) for p in job.placement})

    def running(self, session: Session) -> list[Running]:
        return [Running(p.job_id, p.node, p.gpus, p.state) for _, p in sorted(self._parts.items())]

    # -- carrying it out ------------------------------------------------------------------------------------

    def run(self) -> None:
        """Carry out everything asked so far (the module docstring's steps 1-3), each in its own transaction;
        repeated until nothing is left, since a stop may let a waiting job fit."""
        self._register_nodes()
        while True:
            self.wanted = False
            stops, self._stops = self._stops, []
            deletes, self._deletes = self._deletes, []
            for stop in stops:
                with self._transaction() as session:
                    self._carry_out_stop(session, stop)
            for delete in deletes:
                with self._transaction() as session:
                    self._carry_out_delete(session, delete)
            with self._transaction() as session:
                placed = self._place(session)
            if not (placed or self._stops or self._deletes):
                return

    def finish(self, job_id: str, exit_code: int = 0) -> None:
        """The job's every running part ends on its own with `exit_code`."""
        now = self._clock().timestamp()
        with self._transaction() as session:
            for (job, node), part in sorted(self._parts.items()):
                if job != job_id or part.state != "running":
                    continue
                del self._parts[job, node]
                evidence: Evidence = {"exit_code": exit_code, "exited_at": now, "process_group_gone": True,
                                      "gpus_released": list(part.gpus), "checkpoints": list(part.files)}
                self._reports.part_event(session, job_id, node, "exited", at=now, pid=part.pid, evidence=evidence)

    def _register_nodes(self) -> None:
        """Its nodes in the store, alive with their GPUs, as a heartbeat would leave them."""
        with self._transaction() as session:
            now = self._clock()
            for name, gpus in sorted(self.nodes.items()):
                node = session.get(Node, name)
                if node is None:
                    node = Node(id=name, gpus=gpus, state="alive", running=[])
                    session.add(node)
                node.gpus, node.state, node.last_heartbeat, node.isolation = gpus, "alive", now, "uid+cgroup"

    def _place(self, session: Session) -> int:
        """Step 1; returns how many jobs were placed."""
        used: dict[str, set[int]] = {name: set() for name in self.nodes}
        for node, gpus in session.execute(select(Allocation.node, Allocation.gpus)
                                          .where(Allocation.released.is_(False))):
            used.setdefault(node, set()).update(gpus)
        rows: list[tuple[Job, SchedJob | None]] = [
            (job, row) for job, row in session.execute(
                select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                .where(Job.state == "pending"))]
        waiting = sorted(rows, key=lambda r: (QUEUE_ORDER.get(r[0].queue, 9), -(r[1].priority if r[1] else 0.0),
                                              r[0].submitted_at, r[0].id))
        placed = 0
        for job, row in waiting:
            parts: list[tuple[str, list[int]]] = []
            for name in sorted(self.nodes):
                free = sorted(set(range(self.nodes[name])) - used[name])
                if len(parts) < job.nodes and len(free) >= job.gpus_per_node:
                    parts.append((name, free[:job.gpus_per_node]))
            if len(parts) < job.nodes:
                continue  # a gang runs whole or not at all (Q6)
            priority = dict(row.parts) if row is not None and row.parts else {"total": row.priority if row else 0.0}
            if not self._reports.placed(session, job.id, parts, borrowed=False, priority=priority):
                continue
            placed += 1
            now = self._clock().timestamp()
            for name, gpus in parts:
                used[name].update(gpus)
                part = _Part(job.id, name, tuple(gpus), next(self._pids))
                self._parts[job.id, name] = part
                self._ran_on.setdefault(job.id, set()).add(name)
                self._reports.part_event(session, job.id, name, "started", at=now, pid=part.pid)
        return placed

    def _carry_out_stop(self, session: Session, stop: _Stop) -> None:
        """Step 2: prepare signal, one checkpoint written, a graceful exit within the window."""
        part = self._parts.pop((stop.job_id, stop.node), None)
        if part is None:
            return  # nothing of it runs there (it already ended): there is nothing to stop
        now = self._clock().timestamp()
        self._reports.part_event(session, stop.job_id, stop.node, "stopping", at=now, pid=part.pid,
                                 reference=stop.reference, evidence={"signal": stop.signal, "signal_sent_at": now,
                                                                     "grace_seconds": stop.grace_seconds})
        content = f"{stop.job_id} checkpoint at {now}".encode()
        checkpoint: CheckpointFile = {"path": f"checkpoints/{stop.job_id}-{len(part.files) + 1}.ckpt",
                                      "size": len(content), "mtime": now,
                                      "sha256": hashlib.sha256(content).hexdigest()}
        self._files.setdefault((stop.job_id, stop.node), []).append(checkpoint)
        evidence: Evidence = {"outcome": "graceful", "exit_code": 0, "exit_signal": None, "signal": stop.signal,
                              "signal_sent_at": now, "grace_seconds": stop.grace_seconds, "exited_at": now,
                              "process_group_gone": True, "gpus_released": list(part.gpus),
                              "checkpoints": [checkpoint], "artifacts": [checkpoint], "log_tail": []}
        self._reports.part_event(session, stop.job_id, stop.node, "stopped", at=now, pid=part.pid,
                                 reference=stop.reference, evidence=evidence)

    def _carry_out_delete(self, session: Session, delete: _Delete) -> None:
        """Step 3: every file of the job there (or its checkpoints only) removed, each one reported."""
        kept = self._files.get((delete.job_id, delete.node), [])
        removed = [{"path": f["path"], "size": f.get("size"), "sha256": f.get("sha256")} for f in kept]
        if delete.what == "all":
            removed.append({"path": f"logs/{delete.job_id}.log", "size": 0, "sha256": hashlib.sha256(b"").hexdigest()})
        self._files[delete.job_id, delete.node] = []
        self._reports.deleted(session, delete.job_id, delete.node, objects=removed, reason=delete.reason)

    def _reference(self, kind: str) -> str:
        return f"inproc-{kind}-{next(self._references)}"
