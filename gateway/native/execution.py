"""jobgate's own implementation of the execution port (gateway/execution/port.py): the scheduler loop places and
starts jobs (gateway/native/scheduler_loop.py), node agents run them and deliver their prepare signals, as signed
commands (gateway/native/commands.py), and report back on their channel (gateway/native/agents.py)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.execution.port import ArtifactScope, Running
from gateway.native.commands import enqueue, nodes_with_files
from gateway.native.deps import Native
from gateway.store.models import Allocation, Job


class NativeExecution:
    """Asks go out as signed commands in the caller's transaction; placement waits for the loop's next cycle,
    which anything that changes what it places is woken for."""

    def __init__(self, gw: Native) -> None:
        self.gw = gw  # read at each call: the clock and the key are the running gateway's

    def queued(self, job: Job) -> None:
        self.gw.scheduler_kick.set()

    def requeued(self, job: Job) -> None:
        self.gw.scheduler_kick.set()

    def reprioritised(self, job: Job, priority: float) -> None:
        self.gw.scheduler_kick.set()  # the next cycle orders and preempts by the priority the store now holds

    def changed(self) -> None:
        self.gw.scheduler_kick.set()

    def stop(self, session: Session, job: Job, node: str, *, grace_seconds: float, reason: str) -> str:
        return enqueue(self.gw, session, node, job.id, "stop",
                       {"grace_seconds": grace_seconds, "stop_signal": job.stop_signal, "reason": reason})

    def delete_artifacts(self, session: Session, job: Job, node: str, *, what: ArtifactScope, reason: str) -> str:
        return enqueue(self.gw, session, node, job.id, "delete_artifacts", {"what": what, "reason": reason})

    def holders(self, session: Session, job: Job) -> list[str]:
        return nodes_with_files(session, job.id, job.placement)

    def running(self, session: Session) -> list[Running]:
        rows = session.execute(select(Allocation.job_id, Allocation.node, Allocation.gpus, Allocation.state)
                               .where(Allocation.released.is_(False)).order_by(Allocation.job_id, Allocation.node))
        return [Running(job_id, node, tuple(gpus), state) for job_id, node, gpus, state in rows]
