"""The node agent loop: pull signed commands, verify, run or stop process groups, report (H1, P4, C3).

Threads:
  1. poller    — long-polls the gateway for command envelopes and handles them one at a time;
  2. heartbeat — tells the gateway every few seconds which jobs run here;
  3. reporter  — drains the persistent outbox to the gateway, retrying with backoff;
  plus the runner's waiter and stop threads. The agent serves no HTTP at all (H1).

Commands are obeyed only after `protocol.verify_command`; the nonce is persisted before the command
runs, so neither a replay nor an agent restart can make a command run twice. Replay protection does not rest
on that file alone (H1): a command also carries its issue time and expiry, checked against this node's clock
within `protocol.MAX_CLOCK_SKEW_S`, and after every start of the agent no start command is executed until the
gateway's reconcile for this run of the agent has arrived. That reconcile lists the commands the gateway still
has in flight for the node; a start issued before it that it does not list is refused, so an agent whose state
was lost cannot be made to start an old command again.

Layout of the work directory: `state/` (0700: nonces, process records, outbox, the node token) is the agent's
alone; `jobs/<job id>/` is each job's (nodeagent/jobdir.py).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.signing

from nodeagent import isolation as isolation_modes
from nodeagent import protocol, reports
from nodeagent.commands import DeleteParams, ReconcileParams, StartParams, StopParams
from nodeagent.errors import GatewayError, InvalidCommand
from nodeagent.isolation import Isolation
from nodeagent.layout import private_state_dir
from nodeagent.runner import Runner, RunnerEvent, check_job_id
from nodeagent.state import NonceStore, Outbox, ProcessStore
from nodeagent.transport import GatewayPort

log = logging.getLogger("nodeagent.agent")

VERSION = "0.1.0"
# Answers that mean the gateway will never accept this content: retrying the same bytes cannot help.
_REFUSED_AS_IS = frozenset({400, 413, 422})
_BACKOFF_START = 0.2
_BACKOFF_MAX = 10.0


@dataclass(frozen=True)
class AgentConfig:
    node: str
    gpus: int
    work_dir: Path
    poll_wait: float = 20.0
    heartbeat_interval: float = 2.0
    # On shutdown, how long in-flight stops may finish before the agent exits anyway (they are
    # then finished by the gateway's reconcile after restart).
    stop_join_seconds: float = 10.0
    flush_seconds: float = 3.0


class _Backoff:
    def __init__(self) -> None:
        self.delay = _BACKOFF_START

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, _BACKOFF_MAX)
        return delay

    def reset(self) -> None:
        self.delay = _BACKOFF_START


def _fields(**kw: Any) -> dict[str, Any]:
    return {"fields": kw}


class Agent:
    """One node's agent. `run()` blocks until `shutdown` is set; `handle_envelope` is the core."""

    def __init__(
        self,
        config: AgentConfig,
        gateway: GatewayPort,
        verify_key: nacl.signing.VerifyKey,
        *,
        clock: Callable[[], float] = time.time,
        subreaper: bool = True,
        isolation: Isolation | None = None,
    ) -> None:
        """Raises OSError if the work directory cannot be made private to the agent."""
        self.config = config
        self._gateway = gateway
        self._verify_key = verify_key
        self._clock = clock
        self.isolation_mode = isolation.mode if isolation is not None else isolation_modes.NONE
        state = private_state_dir(config.work_dir)
        self.nonces = NonceStore(state / "nonces.json", clock)
        self.processes = ProcessStore(state / "processes.json")
        self.outbox = Outbox(state / "outbox.jsonl")
        self._report_ready = threading.Event()
        self._handling = threading.Lock()
        self._accepting = True
        self.shutdown = threading.Event()
        # A new id per agent process: the gateway reconciles when it sees a new one (restart).
        self.instance = secrets.token_hex(8)
        self.started_at = clock()
        # Until the gateway's reconcile for this run arrives, starts wait here (by nonce), not yet obeyed.
        self._reconciled: protocol.Command | None = None
        self._pending_starts: dict[str, Any] = {}
        self.runner = Runner(config.work_dir, self._on_event, subreaper=subreaper, isolation=isolation)

    # -- lifecycle -----------------------------------------------------------------------------------

    def recover(self) -> None:
        """Re-adopt the process groups a previous agent left running; report the ones that vanished."""
        for record in self.processes.records():
            if self.runner.adopt(record):
                log.info("adopted running job", extra=_fields(job_id=record.job_id, pid=record.pid))
            else:
                self.runner.report_vanished(record, "ended while the agent was not running")
        if len(self.outbox):
            log.info("pending reports from before restart", extra=_fields(count=len(self.outbox)))
            self._report_ready.set()

    def run(self) -> None:
        """Recover, then serve until `self.shutdown` is set; running jobs are left running."""
        self.recover()
        threads = [
            threading.Thread(target=self._report_loop, name="reporter", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._poll_loop, name="poller", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info("agent running", extra=_fields(node=self.config.node, gpus=self.config.gpus))
        while not self.shutdown.wait(0.5):
            pass
        log.info("agent shutting down", extra=_fields(running=len(self.runner.running())))
        with self._handling:
            self._accepting = False
        if not self.runner.join_stops(self.config.stop_join_seconds):
            log.warning("exiting with stops still in flight")
        self.runner.close()
        self._report_ready.set()
        threads[0].join(self.config.flush_seconds)
        if len(self.outbox):
            log.warning("unsent reports kept for next start", extra=_fields(count=len(self.outbox)))

    # -- commands ------------------------------------------------------------------------------------

    def handle_envelope(self, envelope: Any) -> None:
        """Verify one envelope and execute it, or report it `rejected`. Never raises for bad input."""
        with self._handling:
            if not self._accepting:
                # The nonce is not consumed, so the gateway may deliver this command again.
                log.warning("command dropped at shutdown", extra=_fields(**_peek(envelope)))
                return
            self._handle(envelope)

    def _handle(self, envelope: Any) -> None:
        try:
            command = protocol.verify_command(
                envelope,
                self._verify_key,
                node=self.config.node,
                now=self._clock(),
                seen_nonce=self.nonces.seen,
            )
            self._check_reconciled(command)
        except protocol.CommandRejected as e:
            self._reject(envelope, e.reason, e.detail)
            return
        if command.kind == "start" and self._reconciled is None:
            # Not obeyed, nonce not consumed: run once the reconcile says the gateway still wants it.
            if command.nonce not in self._pending_starts:
                log.info("start waits for the gateway's reconcile", extra=_fields(job_id=command.job_id))
            self._pending_starts[command.nonce] = envelope
            return
        self.nonces.remember(command.nonce, command.expires_at)
        log.info(
            "command accepted",
            extra=_fields(kind=command.kind, job_id=command.job_id, nonce=command.nonce),
        )
        try:
            self._execute(command)
        except InvalidCommand as e:
            self._reject(envelope, e.reason, e.detail, trusted=True)
            return
        if command.kind == "reconcile" and self._reconciled is None \
                and command.issued_at >= self.started_at - protocol.MAX_CLOCK_SKEW_S:
            self._reconciled = command
            waiting, self._pending_starts = list(self._pending_starts.values()), {}
            for start in waiting:
                self._handle(start)

    def _check_reconciled(self, command: protocol.Command) -> None:
        """A start issued before this run's reconcile is obeyed only if that reconcile listed it as in flight.
        Raises CommandRejected(stale)."""
        rec = self._reconciled
        if command.kind != "start" or rec is None or command.issued_at > rec.issued_at:
            return
        if command.nonce not in ReconcileParams.parse(rec.params).pending:
            raise protocol.CommandRejected(
                "stale", "a start issued before the gateway reconciled this node, and not among its commands in"
                " flight then")

    def _execute(self, command: protocol.Command) -> None:
        if command.kind == "start":
            check_job_id(command.job_id)
            start = StartParams.parse(command.params, node_gpus=self.config.gpus)
            taken = self.runner.busy_gpus() & set(start.gpus)
            if taken and self.runner.get(command.job_id) is None:
                raise InvalidCommand("conflict", f"GPUs {sorted(taken)} are held by another job")
            self.runner.start(
                command.job_id,
                start.argv,
                start.gpus,
                start.env,
                start.grace_seconds,
                start.stop_signal,
                nonce=command.nonce,
                run_as=start.run_as,
            )
        elif command.kind == "stop":
            stop = StopParams.parse(command.params)
            self.runner.stop(
                command.job_id, stop.grace_seconds, stop.stop_signal, nonce=command.nonce, reason=stop.reason
            )
        elif command.kind == "delete_artifacts":
            self._delete(command, DeleteParams.parse(command.params))
        else:
            self._reconcile(command, ReconcileParams.parse(command.params))

    def _delete(self, command: protocol.Command, params: DeleteParams) -> None:
        # Artifacts of a running job are never touched: deleting is for stopped, paused or deleted jobs.
        check_job_id(command.job_id)
        if self.runner.get(command.job_id) is not None:
            raise InvalidCommand("conflict", f"job {command.job_id} still runs here; artifacts are kept")
        deleted, left = self.runner.delete_artifacts(command.job_id, everything=params.what == "all")
        self._report(
            command.job_id,
            "deleted",
            command.nonce,
            pid=None,
            detail=f"{len(deleted)} files deleted" + (f", {len(left)} left" if left else ""),
            evidence={"deleted": deleted, "left": left, "what": params.what, "reason": params.reason},
        )

    def _reconcile(self, command: protocol.Command, params: ReconcileParams) -> None:
        # 1. Stop what the gateway wants stopped (a job no longer here is reported stopped at once).
        for job_id in params.stop:
            self.runner.stop(job_id, nonce=command.nonce, reason="reconcile")
        wanted_stopped = set(params.stop)
        running = {r.job_id: r for r in self.runner.running()}
        # 2. Report what runs here that the gateway does not know about; never stop it unasked (H1).
        for job_id, record in sorted(running.items()):
            if job_id not in params.expected and job_id not in wanted_stopped:
                self._report(
                    job_id,
                    "unknown",
                    command.nonce,
                    pid=record.pid,
                    detail="running on this node but not expected by the gateway",
                    evidence={"gpus": list(record.gpus), "started_at": record.started_at},
                )
        # 3. Tell the gateway which of its expected jobs are not here at all.
        missing = sorted(params.expected - running.keys() - wanted_stopped)
        for job_id in missing:
            self._report(job_id, "exited", command.nonce, pid=None, detail="not running on this node")
        # 4. Say it is done: the answer that acknowledges a reconcile (a "rejected" never does).
        self._report("", "reconciled", command.nonce, pid=None,
                     detail=f"{len(running)} running, {len(wanted_stopped)} to stop, {len(missing)} missing")

    def _reject(self, envelope: Any, reason: str, detail: str, *, trusted: bool = False) -> None:
        peek = _peek(envelope)
        # A forged or malformed payload's nonce is attacker-chosen; echoing it could make the gateway
        # mark one of its real commands as refused.
        nonce = peek["nonce"] if trusted or reason not in ("forged", "malformed") else None
        log.warning("command rejected", extra=_fields(reason=reason, detail=detail, **peek))
        self._report(peek["job_id"] or "", "rejected", nonce, pid=None, detail=f"{reason}: {detail}")

    # -- reports -------------------------------------------------------------------------------------

    def _on_event(self, event: RunnerEvent) -> None:
        if event.event == "started":
            record = self.runner.get(event.job_id)
            if record is not None:
                self.processes.put(record)
        elif event.event in ("stopped", "exited") and event.evidence is not None:
            try:
                self.processes.remove(event.job_id, event.pid)
            except OSError as e:
                # The end is still reported (the outbox is what the gateway hears). The stale record makes a
                # restarted agent report the run vanished once more, which the gateway ledgers as an anomaly.
                log.error("process record not removed", extra=_fields(job_id=event.job_id, error=str(e)))
        log.info(
            "job event",
            extra=_fields(job_id=event.job_id, job_event=event.event, pid=event.pid, detail=event.detail),
        )
        self._enqueue(event.to_report())

    def _report(
        self,
        job_id: str,
        event: str,
        nonce: str | None,
        *,
        pid: int | None,
        detail: str,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        self._enqueue(RunnerEvent(job_id, event, nonce, self._clock(), pid, detail, evidence).to_report())

    def _enqueue(self, report: dict[str, Any]) -> None:
        self.outbox.append(reports.bounded(report))
        self._report_ready.set()

    def _report_loop(self) -> None:
        backoff = _Backoff()
        alone = False  # after a refused batch: one report at a time, until the refused one is found
        while True:
            self._report_ready.wait(1.0)
            self._report_ready.clear()
            while len(self.outbox):
                batch = reports.next_batch(self.outbox.peek(reports.MAX_BATCH_REPORTS))[: 1 if alone else None]
                try:
                    self._gateway.post_reports(batch)
                except GatewayError as e:
                    if e.status in _REFUSED_AS_IS:
                        try:
                            alone = self._refused(batch, e)
                            continue
                        except OSError as disk:  # cannot set it aside (a full disk): retry it, as any failure
                            log.error("refused report not set aside", extra=_fields(error=str(disk)))
                    log.warning(
                        "report delivery failed", extra=_fields(error=str(e), pending=len(self.outbox))
                    )
                    if self.shutdown.is_set():
                        return
                    time.sleep(backoff.next())
                    continue
                backoff.reset()
                try:
                    self.outbox.drop_first(len(batch))
                except OSError as e:
                    # Delivered, and forgotten in memory, but the file could not be rewritten (a full disk):
                    # after a restart they go again, which the gateway takes as the repeats they are.
                    log.error("outbox not rewritten", extra=_fields(error=str(e)))
            alone = False
            if self.shutdown.is_set() and not self._accepting:
                return

    def _refused(self, batch: list[dict[str, Any]], error: GatewayError) -> bool:
        """The gateway will never take this batch as it is. Retried forever, it would hold back every later
        report; so a batch is retried a report at a time, and a single refused report is set aside (kept in
        outbox.rejected.jsonl, logged as an error) for a person to look at. Returns whether to go on alone."""
        if len(batch) > 1:
            return True
        report = self.outbox.reject_first(str(error))
        log.error(
            "report refused by the gateway and set aside",
            extra=_fields(job_id=report.get("job_id"), job_event=report.get("event"), error=str(error)),
        )
        return False

    # -- gateway loops -------------------------------------------------------------------------------

    def heartbeat_body(self) -> dict[str, Any]:
        at = self._clock()  # before the list: a job ending meanwhile is never listed in a beat dated after its end
        running = [
            {"job_id": r.job_id, "pid": r.pid, "gpus": list(r.gpus)}
            for r in sorted(self.runner.running(), key=lambda r: r.job_id)
        ]
        return {"gpus": self.config.gpus, "running": running, "version": VERSION, "instance": self.instance,
                "isolation": self.isolation_mode, "at": at}

    def _heartbeat_loop(self) -> None:
        while not self.shutdown.is_set():
            try:
                self._gateway.heartbeat(self.heartbeat_body())
            except GatewayError as e:
                log.warning("heartbeat failed", extra=_fields(error=str(e)))
            self.shutdown.wait(self.config.heartbeat_interval)

    def _poll_loop(self) -> None:
        backoff = _Backoff()
        while not self.shutdown.is_set():
            try:
                envelopes = self._gateway.fetch_commands(self.config.poll_wait)
            except GatewayError as e:
                log.warning("command poll failed", extra=_fields(error=str(e)))
                self.shutdown.wait(backoff.next())
                continue
            backoff.reset()
            for envelope in envelopes:
                try:
                    self.handle_envelope(envelope)
                except Exception:
                    # A command the agent could not even refuse (its nonce or report file on a full disk, say)
                    # must not end the thread that receives all the others: the gateway would go on seeing a
                    # live node that obeys nothing. The command's deadline at the gateway takes it from here.
                    log.exception("command handling failed", extra=_fields(**_peek(envelope)))


def _peek(envelope: Any) -> dict[str, str | None]:
    """Job id and nonce from an envelope's payload, for logs and reports only — never trusted."""
    try:
        body = json.loads(str(envelope["payload"]))
        job_id, nonce = body.get("job_id"), body.get("nonce")
    except (TypeError, KeyError, ValueError, AttributeError):
        return {"job_id": None, "nonce": None}
    return {
        "job_id": job_id if isinstance(job_id, str) else None,
        "nonce": nonce if isinstance(nonce, str) else None,
    }
