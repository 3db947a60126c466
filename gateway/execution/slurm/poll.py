"""The Slurm backend's loop (the counterpart of gateway/native/scheduler_loop.py): each cycle it reads Slurm
(`squeue --json`; `sacct` for a job that ended; `squeue --start` for those that wait), tells Slurm what jobgate
asked that Slurm does not have yet, and turns what changed into the port's Reports.

One cycle: every waiting jobgate job with no Slurm job is submitted (step 1, a few sbatch at once, outside any
transaction; the rows written together after), then per map row (gateway/store/slurm_tables.py) Slurm may still
run and whose step would change something, in its own business transaction:
1. A waiting jobgate job with no Slurm job is submitted; one found in Slurm by its `jobgate:<id>` comment (the
   gateway stopped between sbatch and writing the row) is adopted, not submitted twice.
2. Slurm runs it: `placed` with Slurm's nodes, then `started` per node. Slurm put a running job back in its
   queue by itself (partition preemption, on a cluster that keeps it on; the starter turns it off): `preempted`,
   then `stopped` per node, which requeues it in jobgate keeping its priority and wait; the priority is then set
   in Slurm (P2).
3. A stop jobgate asked: the prepare signal (`stopping`), and at the window's end `scancel`, or `scontrol
   requeue` for a preemption (a victim that exited in its window is requeued then: the same Slurm job waits
   again); when Slurm says it ended, or a victim waits again, `stopped` with the evidence read back.
4. A job that ended by itself: `exited` with its exit status. One cancelled in Slurm by someone else while it
   waited: the jobgate job ends (cancelled out of band, who and when from accounting), never submitted again.
5. jobgate paused a job that waits in Slurm: held there, released when it is resumed; jobgate ended it
   (stopped, deleted while waiting): cancelled there.
6. jobgate's preemption: a governed urgent job Slurm holds waiting for resources gets a plan from the gateway's
   rules (the pure core, as natively), whose victims are stopped as in step 3, then requeued keeping their
   priority and wait (P2). Jobs submitted straight to Slurm are never victims.
While slurmctld does not answer, the cycle changes nothing; the next one that reads Slurm catches up.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.execution.port import Evidence, PartEvent
from gateway.execution.slurm.errors import SlurmError, SlurmRefused, SlurmUnavailable
from gateway.execution.slurm.execution import COMMENT_PREFIX, SlurmExecution, job_spec, list_files
from gateway.execution.slurm.hostlist import expand
from gateway.execution.slurm.records import AccountedJob, JobSpec, QueuedJob
from gateway.store.models import Allocation, Job, Node
from gateway.store.scheduler_tables import SchedJob
from gateway.store.slurm_tables import SlurmRun

log = logging.getLogger("jobgate.slurm")

ALIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")
RUNS = ("RUNNING", "CONFIGURING", "SIGNALING", "STAGE_OUT")
# jobgate states in which Slurm must not run or queue the job (its Slurm job is cancelled)
GONE = ("stopped", "succeeded", "failed", "deleted", "stop_failed")
ACCOUNTING_WAIT_S = 20.0  # how long an ended job's evidence waits for its accounting row before it goes without
REFUSED_RETRY_S = 60.0  # a submission Slurm refused is tried again after this long (its quota may have changed)
MAX_UNSTARTED = 3  # Slurm jobs of one jobgate job that may end before they ran; then it is not submitted again
SUBMIT_WORKERS = 4  # sbatch calls at once: slurmctld takes them concurrently; bounded to spare its RPC threads
# Slurm's reasons for a job that waits only for nodes or GPUs (not a hold, a dependency, a limit)
WAITS_FOR_RESOURCES = ("Resources", "Priority")
PREEMPTOR_WAIT_S = 10.0  # how long a victim's report waits for Slurm to start the job that preempted it
# The starter's partitions by PriorityTier (deploy/slurm): a higher one's jobs requeue a lower one's.
TIERS = {"urgent": 3, "normal": 2, "batch": 1}
_GPU = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 10: "SIGUSR1", 12: "SIGUSR2", 15: "SIGTERM"}


def _ts(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


class SlurmLoop(threading.Thread):
    """Runs a cycle every `interval_s`, or at once when the execution was asked something (its kick)."""

    def __init__(self, ex: SlurmExecution, interval_s: float = 1.0, *,
                 leads: Callable[[], bool] = lambda: True) -> None:
        super().__init__(name="jobgate-slurm", daemon=True)
        self.ex = ex
        self.interval_s = interval_s
        self.leads = leads  # the loop is the leader's (gateway/leadership.py): a follower's only waits
        self._stop_event = threading.Event()
        self._ended_seen: dict[int, float] = {}  # map row id -> monotonic time its job was first seen ended
        self._refused: dict[str, float] = {}  # job id -> monotonic time its submission may be tried again
        self._requeue_seen: dict[int, float] = {}  # map row id -> when its job was first seen back in the queue
        self._nodes_read = 0.0

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.ex.kick.wait(self.interval_s)
            self.ex.kick.clear()
            if self._stop_event.is_set():
                break
            if not self.leads():
                continue
            try:
                self.cycle()
            except Exception:  # the loop must outlive one bad cycle; the error is logged with its trace
                log.exception("Slurm cycle failed")

    def stop(self) -> None:
        self._stop_event.set()
        self.ex.kick.set()
        self.join(timeout=30)

    # -- one cycle ------------------------------------------------------------------------------------------

    def cycle(self) -> None:
        ex = self.ex
        try:
            queued: dict[int, QueuedJob] = {int(q.job_id): q for q in ex.client.jobs()}
            if time.monotonic() - self._nodes_read > 30.0:
                self._register_nodes()
        except SlurmUnavailable as e:
            if ex.answering is not False:
                log.warning("Slurm does not answer; nothing is changed until it does: %s", e)
            ex.answering = False
            return
        ex.answering = True
        self._submit_waiting(queued)
        with ex.transaction(immediate=False) as session:
            rows = []
            for r, state in session.execute(select(SlurmRun, Job.state).outerjoin(Job, Job.id == SlurmRun.job_id)
                                            .where(SlurmRun.live.is_(True), SlurmRun.cluster == ex.cluster)):
                if _quiet(r, state, queued.get(r.slurm_job_id)):
                    self._ended_seen.pop(r.id, None)  # as _step does for a job alive after all
                else:
                    rows.append(r.id)
        for row_id in rows:
            try:
                with ex.transaction() as session:
                    run = session.get(SlurmRun, row_id)
                    if run is not None and run.live:
                        self._step(session, run, queued.get(run.slurm_job_id), queued)
            except SlurmUnavailable as e:
                log.warning("Slurm stopped answering in the cycle: %s", e)
                ex.answering = False
                return
            except SlurmError as e:
                log.warning("Slurm refused a step of job row %s: %s", row_id, e)
        self._preempt(queued)
        self._deletes()
        self._explain(queued)

    def _register_nodes(self) -> None:
        """Slurm's nodes in the store (allocations name them), with their GPUs; not alive while Slurm says down."""
        done = self.ex.client.runner.check(["sinfo", "-h", "-N", "-o", "%N|%G|%t"])
        nodes: dict[str, tuple[int, str]] = {}
        for line in done.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3:
                continue
            m = _GPU.search(parts[1])
            state = parts[2].rstrip("*~#!%$@^-")
            alive = not (parts[2].endswith("*") or state in ("down", "drain", "drng", "fail", "failg", "unk"))
            nodes[parts[0]] = (int(m.group(1)) if m else 0, "alive" if alive else "down")
        with self.ex.transaction() as session:
            now = self.ex.clock()
            for name, (gpus, state) in sorted(nodes.items()):
                node = session.get(Node, name)
                if node is None:
                    node = Node(id=name, gpus=gpus, state=state, running=[])
                    session.add(node)
                node.gpus, node.state, node.last_heartbeat, node.isolation = gpus, state, now, "slurm"
        self._nodes_read = time.monotonic()

    def _submit_waiting(self, queued: Mapping[int, QueuedJob]) -> None:
        """Step 1, for every waiting job at once: what to submit is read in one transaction, the sbatch calls run
        outside any transaction (a write lock held across them stalled every POST /v1/jobs) and several at a
        time (slurmctld answers sbatch calls concurrently), and the map rows of them all are written in one
        transaction. The gateway stopping between an sbatch and its row: the next cycle adopts that Slurm job by
        its comment instead of submitting it twice."""
        ex = self.ex
        by_comment: dict[str, QueuedJob] = {}
        adopt: dict[str, QueuedJob] = {}
        specs: dict[str, JobSpec] = {}
        given_up: dict[str, list[int]] = {}
        with ex.transaction(immediate=False) as session:
            live = set(session.scalars(select(SlurmRun.job_id).where(SlurmRun.live.is_(True))))
            known = set(session.scalars(select(SlurmRun.slurm_job_id).where(SlurmRun.cluster == ex.cluster)))
            waiting = [j for j in session.scalars(select(Job).where(Job.state == "pending")
                                                  .order_by(Job.submitted_at, Job.id)) if j.id not in live]
            by_comment = {q.comment[len(COMMENT_PREFIX):]: q for q in queued.values()
                          if q.comment.startswith(COMMENT_PREFIX) and q.job_id not in known and q.state in ALIVE
                          and q.user == ex.client.user}
            never_ran: dict[str, list[int]] = {}
            if waiting:
                for job_id, slurm_id in session.execute(select(SlurmRun.job_id, SlurmRun.slurm_job_id).where(
                        SlurmRun.job_id.in_([j.id for j in waiting]), SlurmRun.live.is_(False),
                        SlurmRun.node_list == "").order_by(SlurmRun.id)):
                    never_ran.setdefault(job_id, []).append(slurm_id)
            for job in waiting:
                if self._refused.get(job.id, 0.0) > time.monotonic():
                    continue
                if job.id in by_comment:
                    adopt[job.id] = by_comment[job.id]
                elif len(never_ran.get(job.id, [])) >= MAX_UNSTARTED:
                    given_up[job.id] = never_ran[job.id]
                else:
                    specs[job.id] = job_spec(job, ex.checkpoint_dir(job.id), ex.log_path(job.id))
        if not (adopt or specs or given_up):
            return
        results: dict[str, int | SlurmError] = {}
        if specs:
            with ThreadPoolExecutor(max_workers=min(SUBMIT_WORKERS, len(specs)),
                                    thread_name_prefix="jobgate-sbatch") as pool:
                futures = {job_id: pool.submit(ex.client.submit, spec) for job_id, spec in specs.items()}
                for job_id, future in futures.items():
                    try:
                        results[job_id] = int(future.result())
                    except SlurmError as e:
                        results[job_id] = e
        now = ex.clock()
        with ex.transaction() as session:
            for job_id, never in given_up.items():
                held = session.get(Job, job_id)
                if held is not None and held.state == "pending":
                    # Fail closed: Slurm ends it before it runs (or someone cancels it there); not submitted again.
                    held.state_reason = (f"Slurm ended its last {len(never)} submissions (jobs "
                                        f"{', '.join(map(str, never[-MAX_UNSTARTED:]))}) before they ran; "
                                        "not submitted again: stop it, or ask on-call")
            made: list[tuple[str, int, datetime]] = [
                (job_id, int(q.job_id), q.submit_time or now) for job_id, q in adopt.items()]
            made += [(job_id, r, now) for job_id, r in results.items() if isinstance(r, int)]
            for job_id, slurm_id, submitted in made:
                # Kept even if the job left `pending` meanwhile (stopped, paused, deleted while sbatch ran): the
                # row is how the next step finds the Slurm job to cancel or hold.
                session.add(SlurmRun(job_id=job_id, cluster=ex.cluster, slurm_job_id=slurm_id,
                                     submitted_at=submitted, state="SUBMITTED", updated_at=now))
                row = session.get(Job, job_id)
                if row is not None and row.state == "pending":
                    row.state_reason = f"submitted to Slurm as job {slurm_id} on {ex.cluster}"
            for job_id, r in results.items():
                if isinstance(r, SlurmRefused):
                    # It can never run as asked here now: said where `job why` shows it, tried again later.
                    row = session.get(Job, job_id)
                    if row is not None and row.state == "pending":
                        row.state_reason = f"Slurm refused the submission: {r.detail}"
                    self._refused[job_id] = time.monotonic() + REFUSED_RETRY_S
        # Slurm not answering (or failing otherwise) midway: what it took is recorded above; the cycle ends here.
        failed = next((r for r in results.values() if isinstance(r, SlurmError) and not isinstance(r, SlurmRefused)),
                      None)
        if failed is not None:
            raise failed

    # -- one map row ------------------------------------------------------------------------------------------

    def _step(self, session: Session, run: SlurmRun, q: QueuedJob | None, queued: Mapping[int, QueuedJob]) -> None:
        ex = self.ex
        job = session.get(Job, run.job_id)
        now = ex.clock()
        if q is not None:
            run.state, run.reason, run.slurm_priority = q.state, q.reason, q.priority
            if q.node_list:
                run.node_list = q.node_list
            run.updated_at = now
        if job is None:
            return
        if q is None and run.state == "SUBMITTED" and (now - run.updated_at).total_seconds() < 30.0:
            return  # submitted after this cycle read the queue
        if q is not None and q.state not in ALIVE and self._requeue_ended_victim(run, job):
            return
        if q is None or q.state not in ALIVE:
            self._ended(session, run, job, q)
            return
        self._ended_seen.pop(run.id, None)  # alive after all (read before its end settled): wait afresh next time
        run.restarts = q.restarts
        if q.state == "PENDING":
            # Waiting in Slurm while jobgate holds it placed: Slurm put it back in its queue. Judged by jobgate's
            # state, not by what the last cycle saw: a cycle may have seen it only COMPLETING on its way back.
            if job.state in ("starting", "running", "stop_requested", "stopping"):
                self._back_in_queue(session, run, job, q, queued)
            elif job.state == "paused" and not run.held:
                ex.client.hold(run.slurm_job_id)
                run.held = True
            elif job.state in GONE:
                ex.client.cancel(run.slurm_job_id)
            elif job.state == "pending":
                if run.held:
                    ex.client.release(run.slurm_job_id)
                    run.held = False
                elif run.priority_set is not None and q.priority not in (0, run.priority_set):
                    ex.client.set_priority(run.slurm_job_id, run.priority_set)
            return
        if q.state not in RUNS:
            return  # completing, suspended: the next cycle sees where it went
        if job.state == "pending":
            parts = [(node, list(range(q.gpus_per_node))) for node in expand(q.node_list)]
            placed = ex.reports.placed(session, job.id, parts, borrowed=False,
                                       priority={"total": float(q.priority), "slurm": float(q.priority)})
            if not placed:
                ex.client.cancel(run.slurm_job_id)
                return
            session.flush()
            started = _ts(q.start_time) or now.timestamp()
            for node, _ in parts:
                ex.reports.part_event(session, job.id, node, "started", at=started,
                                      detail=f"Slurm job {run.slurm_job_id} on {self.ex.cluster}")
        elif job.state in GONE or (job.state == "paused" and run.stop_asked_at is None):
            ex.client.cancel(run.slurm_job_id)  # ended in jobgate (stopped while it waited, then Slurm started it)
        elif run.stop_asked_at is not None:
            self._carry_out_stop(session, run, job, now)

    def _carry_out_stop(self, session: Session, run: SlurmRun, job: Job, now: datetime) -> None:
        """Step 3 while it runs: the prepare signal once, and the window's end."""
        ex = self.ex
        assert run.stop_asked_at is not None
        if run.signal_sent_at is None:
            try:
                ex.client.signal_batch(run.slurm_job_id, job.stop_signal)
            except SlurmRefused as e:  # it ended between the read and the signal: the next cycle reads its end
                log.info("prepare signal to Slurm job %s not delivered: %s", run.slurm_job_id, e)
                return
            run.signal_sent_at = now
            for part in _parts(session, job.id):
                ex.reports.part_event(session, job.id, part.node, "stopping", at=now.timestamp(),
                                      reference=run.stop_reference,
                                      evidence={"signal": job.stop_signal, "signal_sent_at": now.timestamp(),
                                                "grace_seconds": run.stop_grace_s or 0.0})
        end = run.stop_asked_at.timestamp() + (run.stop_grace_s or 0.0)
        if run.forced_at is None and now.timestamp() >= end:
            try:
                if run.stop_requeue:
                    ex.client.requeue(run.slurm_job_id)
                    run.requeues_made = (run.requeues_made or 0) + 1  # committed with forced_at (watch.py)
                else:
                    ex.client.cancel(run.slurm_job_id)
            except SlurmRefused as e:
                # It ended between the read and the cancel: within its window, on the prepare signal (its end,
                # read next cycle, is graceful).
                log.info("Slurm job %s ended before its window's end was enforced: %s", run.slurm_job_id, e)
                return
            run.forced_at = now

    def _requeue_ended_victim(self, run: SlurmRun, job: Job) -> bool:
        """A preemption's victim that exited within its window (it wrote its checkpoint on the prepare signal): the
        same Slurm job is requeued (`scontrol requeue` takes a finished batch job), so that it keeps its Slurm job,
        and the priority jobgate sets on it, instead of being submitted anew. Seen waiting again next cycle, it is
        reported stopped, graceful (step 2). False if it is not such a victim, or Slurm refused (its end is read
        from accounting then, and jobgate submits it again on its requeue)."""
        if not (run.stop_requeue and run.stop_asked_at is not None and run.signal_sent_at is not None
                and run.forced_at is None and job.state in ("stop_requested", "stopping")):
            return False
        try:
            self.ex.client.requeue(run.slurm_job_id)
        except SlurmRefused as e:
            log.info("Slurm job %s ended in its preemption window and was not requeued: %s", run.slurm_job_id, e)
            return False
        run.requeues_made = (run.requeues_made or 0) + 1  # jobgate's own requeue (the watch counts them)
        return True

    def _back_in_queue(self, session: Session, run: SlurmRun, job: Job, q: QueuedJob,
                       queued: Mapping[int, QueuedJob]) -> None:
        """Step 2's requeue: by jobgate at a preemption's window end, or by Slurm's own preemption."""
        ex = self.ex
        stopping = job.state in ("stop_requested", "stopping")
        if stopping and not run.stop_requeue:
            # jobgate is ending it, and Slurm put it back in its queue meanwhile: it must not run again. Cancelled,
            # its end is read from accounting like any other (forced: it did not end in its window).
            ex.client.cancel(run.slurm_job_id)
            run.forced_at = run.forced_at or ex.clock()
            return
        forced = not (stopping and run.signal_sent_at is not None and run.forced_at is None)  # exited in its window
        note = "requeued by jobgate in Slurm when the preemption's grace window ended" if forced else \
            "exited within the preemption's grace window; requeued in Slurm"
        if not stopping:
            preemptor = _preemptor(run, job.queue, queued)
            first = self._requeue_seen.setdefault(run.id, time.monotonic())
            if preemptor is None and time.monotonic() - first < PREEMPTOR_WAIT_S and any(
                    q.state == "PENDING" and TIERS.get(q.partition, 0) > TIERS.get(job.queue, 0)
                    for q in queued.values()):
                return  # Slurm starts the preemptor only once its victims are gone: name it next cycle
            self._requeue_seen.pop(run.id, None)
            note = (f"preempted by Slurm's partition priority for Slurm job {preemptor.job_id} and requeued at once "
                    "(Slurm's own preemption is on here, unlike the starter's: no prepare signal)" if preemptor else
                    "put back in Slurm's queue by someone other than jobgate (no job of a higher partition took "
                    "its nodes)")
            who = _jobgate_id(preemptor.comment) if preemptor else None
            if not ex.reports.preempted(session, job.id, preemptor=who, reason=note):
                return
            session.flush()
        evidence = self._evidence(run, job, None, q, outcome="forced" if forced else "graceful", note=note,
                                  accounting=[])
        run.stop_reference, run.stop_asked_at, run.signal_sent_at, run.forced_at = None, None, None, None
        run.stop_requeue = False
        for part in _parts(session, job.id):
            ex.reports.part_event(session, job.id, part.node, "stopped", at=ex.clock().timestamp(),
                                  evidence=evidence, reference=None)

    def _ended(self, session: Session, run: SlurmRun, job: Job, q: QueuedJob | None) -> None:
        """Steps 3 and 4 at the end: the evidence from accounting (waiting a little for its row), then the report."""
        ex = self.ex
        first = self._ended_seen.setdefault(run.id, time.monotonic())
        try:
            rows = ex.client.accounting([run.slurm_job_id])
        except SlurmUnavailable:
            rows = []
        rows = [r for r in rows if r.submit_time is None or r.submit_time >= run.submitted_at.replace(microsecond=0)
                or r.job_id == run.slurm_job_id]
        final = [r for r in rows if r.state not in ALIVE and r.end_time is not None]
        settled = final and (final[-1].batch_state in (None, "") or final[-1].batch_state not in ALIVE)
        if not settled and time.monotonic() - first < ACCOUNTING_WAIT_S:
            return
        self._ended_seen.pop(run.id, None)
        row = final[-1] if final else None
        run.live = False
        run.state = row.state if row is not None else (q.state if q is not None else "GONE")
        ended = (row.end_time if row is not None else None) or (q.end_time if q is not None else None) or ex.clock()
        run.ended_at = ended
        status = row.batch_exit or row.exit if row is not None else (q.exit if q is not None else None)
        run.exit_code = status.code if status else None
        run.exit_signal = status.signal if status else None
        run.cancelled_by = row.cancelled_by if row is not None else None
        parts = [p for p in _parts(session, job.id) if not p.released]
        if not parts:
            if job.state == "pending" and run.stop_asked_at is None and run.state.startswith("CANCELLED"):
                # Cancelled in Slurm while it waited, and not by a stop jobgate asked: the job ends. Left pending it
                # was submitted again, undoing the cancel. The watch ledgers and alerts the act.
                who = run.cancelled_by or "someone Slurm's accounting does not name"
                note = f"cancelled in Slurm by {who} at {ended.isoformat()} while it waited (out of band)"
                ex.reports.cancelled_while_waiting(
                    session, job.id, by=run.cancelled_by, at=ended.timestamp(), reason=note,
                    evidence=self._evidence(run, job, row, q, outcome=None, accounting=final, note=note))
            return  # otherwise never placed in jobgate (ended in jobgate while it waited): nothing to report
        stopping = run.stop_asked_at is not None
        outcome = None if not stopping else "forced" if run.forced_at is not None else "graceful"
        evidence = self._evidence(run, job, row, q, outcome=outcome, accounting=final)
        event: PartEvent = "stopped" if stopping else "exited"
        for part in parts:
            ex.reports.part_event(session, job.id, part.node, event, at=ended.timestamp(), evidence=evidence,
                                  reference=run.stop_reference)

    def _evidence(self, run: SlurmRun, job: Job, row: AccountedJob | None, q: QueuedJob | None, *,
                  outcome: str | None, accounting: list[AccountedJob], note: str = "") -> Evidence:
        status = (row.batch_exit or row.exit) if row is not None else (q.exit if q is not None else None)
        signal = status.signal if status is not None else None
        evidence: Evidence = {
            "exit_code": status.code if status is not None and not signal else None,
            "exit_signal": _SIGNALS.get(signal, str(signal)) if signal else None,
            "exited_at": _ts(run.ended_at) or self.ex.clock().timestamp(),
            "process_group_gone": True,  # Slurm says it ended: slurmd killed the job's every process
            "gpus_released": list(range(job.gpus_per_node)),
            "checkpoints": list_files(self.ex.checkpoint_dir(job.id)),
            "slurm": {"cluster": self.ex.cluster, "job_id": run.slurm_job_id,
                      "submitted_at": run.submitted_at.isoformat(), "state": run.state,
                      "cancelled_by": run.cancelled_by, "restarts": run.restarts,
                      "accounting": [_accounting_row(r) for r in accounting]},
        }
        if outcome is not None:
            evidence["outcome"] = outcome  # type: ignore[typeddict-item]
            evidence["signal"] = job.stop_signal
            evidence["grace_seconds"] = run.stop_grace_s or 0.0
            if run.signal_sent_at is not None:
                evidence["signal_sent_at"] = run.signal_sent_at.timestamp()
        if note:
            evidence["note"] = note
        return evidence

    # -- jobgate's preemption ----------------------------------------------------------------------------------

    def _preempt(self, queued: Mapping[int, QueuedJob]) -> None:
        """Step 6: jobgate, not Slurm, decides preemption (the starter turns Slurm's own off: one decider, and
        Slurm's GraceTime with requeue loses victims as TIMEOUT). The governed jobs Slurm holds waiting for
        resources, and the GPUs jobs jobgate does not govern use on each node (never victims), go to the gateway's
        rules (Reports.preempt_for); a plan's victims come back as stops with `preemption` (step 3: the prepare
        signal, the grace window, `scontrol requeue`)."""
        ex = self.ex
        waiting_ids = [i for i, q in queued.items() if q.state == "PENDING" and q.reason in WAITS_FOR_RESOURCES]
        busy = [q for q in queued.values() if q.state in (*RUNS, "COMPLETING") and q.node_list]
        if not waiting_ids:
            return
        # Read first: on a busy cluster jobs wait for resources every cycle, and a write transaction each cycle
        # for none that may preempt would hold SQLite's write lock for nothing.
        with ex.transaction(immediate=False) as session:
            live = {r.slurm_job_id: r.job_id for r in session.scalars(select(SlurmRun).where(
                SlurmRun.live.is_(True), SlurmRun.cluster == ex.cluster))}
            waiting = [live[i] for i in waiting_ids if i in live]
            if not waiting or not ex.reports.may_preempt(session, waiting):
                return
        ungoverned: dict[str, int] = {}
        for q in busy:
            if int(q.job_id) not in live:
                for node in expand(q.node_list):
                    ungoverned[node] = ungoverned.get(node, 0) + q.gpus_per_node
        with ex.transaction() as session:
            if ex.reports.preempt_for(session, waiting, ungoverned):
                ex.kick.set()  # the victims' prepare signals go out in the next cycle, not an interval later

    # -- deletes and Q10 --------------------------------------------------------------------------------------

    def _deletes(self) -> None:
        ex = self.ex
        for ask in ex.take_deletes():
            removed, left = ex.remove_files(ask)
            objects = [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in removed]
            with ex.transaction() as session:
                ex.reports.deleted(session, ask.job_id, ask.node, objects=objects, reason=ask.reason, left=left)

    def _explain(self, queued: Mapping[int, QueuedJob]) -> None:
        """Q10: Slurm's reason and expected start of each waiting job, kept where `job why` and the console read
        them (its SchedJob row; the map row keeps Slurm's reason too)."""
        ex = self.ex
        with ex.transaction(immediate=False) as session:
            waiting = {r.slurm_job_id: r.job_id for r in session.scalars(
                select(SlurmRun).join(Job, Job.id == SlurmRun.job_id)
                .where(SlurmRun.live.is_(True), Job.state == "pending", SlurmRun.cluster == ex.cluster))}
        ids = [i for i in waiting if i in queued and queued[i].state == "PENDING"]
        if not ids:
            return
        try:
            estimates = {int(e.job_id): e for e in ex.client.start_estimates(ids)}
        except SlurmError as e:
            log.info("squeue --start: %s", e)
            estimates = {}
        now = ex.clock()
        with ex.transaction() as session:
            # one read of the rows, not one query per waiting job
            runs = {r.slurm_job_id: r for r in session.scalars(select(SlurmRun).where(
                SlurmRun.cluster == ex.cluster, SlurmRun.live.is_(True), SlurmRun.slurm_job_id.in_(ids)))}
            for slurm_id in ids:
                q, est = queued[slurm_id], estimates.get(slurm_id)
                run = runs.get(slurm_id)
                if run is not None:
                    run.reason = (est.reason if est is not None and est.reason else q.reason) or ""
                    run.estimated_start = est.start_time if est is not None else None
                row = session.get(SchedJob, waiting[slurm_id])
                if row is None:
                    continue
                if run is not None and run.priority_set is None and q.priority > 0:
                    # A2, A3 compare a change with the priority that orders the queue, which is Slurm's here.
                    slurm = float(q.priority)
                    row.priority, row.parts = slurm, {"slurm": slurm, "total": slurm}
                # jobgate's own word beside Slurm's (kept in the map row): what it asked, and that Slurm places.
                held = " (held: paused in jobgate)" if run is not None and run.held else ""
                row.blocked_reason = (f"queued in Slurm as job {slurm_id} on {ex.cluster}, partition {q.partition}"
                                      f"{held}; Slurm places it")
                row.estimated_start = est.start_time if est is not None else None
                row.estimated_at = now


def _quiet(run: SlurmRun, job_state: str | None, q: QueuedJob | None) -> bool:
    """Whether the row's step would change nothing: Slurm shows the job as the row last saw it, and jobgate wants
    nothing of it (waiting in both, or running in both with no stop asked). Such rows get no write transaction
    of their own: one per live row every cycle held the write lock most of the time and starved the API.
    (Their updated_at then keeps the last change; nothing reads it for a job Slurm still shows.)"""
    if q is None or job_state is None or q.state != run.state or q.reason != run.reason \
            or q.priority != run.slurm_priority or q.restarts != run.restarts \
            or (q.node_list and q.node_list != run.node_list):
        return False
    if q.state == "PENDING":
        return job_state == "pending" and not run.held and (run.priority_set is None
                                                             or q.priority in (0, run.priority_set))
    return q.state in RUNS and job_state in ("starting", "running") and run.stop_asked_at is None


def _parts(session: Session, job_id: str) -> list[Allocation]:
    return list(session.scalars(select(Allocation).where(Allocation.job_id == job_id).order_by(Allocation.node)))


def _jobgate_id(comment: str) -> str | None:
    return comment[len(COMMENT_PREFIX):] if comment.startswith(COMMENT_PREFIX) else None


def _preemptor(run: SlurmRun, queue: str, queued: Mapping[int, QueuedJob]) -> QueuedJob | None:
    """The latest started job of a higher partition on the nodes the victim had, if Slurm shows one."""
    had = set(expand(run.node_list))
    for q in sorted(queued.values(), key=lambda j: j.start_time or datetime.min.replace(tzinfo=UTC), reverse=True):
        if q.state in RUNS and q.job_id != run.slurm_job_id and TIERS.get(q.partition, 0) > TIERS.get(queue, 0) \
                and had & set(expand(q.node_list)):
            return q
    return None


def _accounting_row(r: AccountedJob) -> dict[str, Any]:
    return {"job_id": r.job_id, "state": r.state, "user": r.user, "account": r.account, "partition": r.partition,
            "cancelled_by": r.cancelled_by, "start": _iso(r.start_time), "end": _iso(r.end_time),
            "elapsed_s": r.elapsed_s, "exit": [r.exit.code, r.exit.signal],
            "batch_exit": [r.batch_exit.code, r.batch_exit.signal] if r.batch_exit else None,
            "batch_state": r.batch_state, "nodes": r.nodes, "gpus": r.gpus, "comment": r.comment}


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None



