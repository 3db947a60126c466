"""The typed Slurm client against a real Slurm 22.05 cluster (deploy/slurm), acting as jobgate's
service user: submit on behalf of an account and read back, the graceful stop and its evidence,
requeue, queue controls, Slurm's own refusals, and acts done behind jobgate's back."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from slurm_testkit import CHECKPOINTS_ON_TERM, IGNORES_TERM, SLEEPS, LocalCluster, script, wait_for

from gateway.execution.slurm import (
    AccountedJob,
    InvalidRequest,
    JobNotFound,
    JobSpec,
    JobStateConflict,
    PermissionDenied,
    QueuedJob,
    SlurmClient,
    SlurmRestReader,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def spec(cluster: LocalCluster, body: str = SLEEPS, **kw: object) -> JobSpec:
    fields: dict[str, object] = {"account": "vision", "partition": "normal", "workdir": str(cluster.workdir)}
    return JobSpec(script=body, **{**fields, **kw})  # type: ignore[arg-type]


def in_state(client: SlurmClient, job_id: int, *states: str, timeout: float = 30,
             where: Callable[[QueuedJob], bool] = lambda job: True) -> QueuedJob:
    def check() -> QueuedJob | None:
        job = client.job(job_id)
        return job if job is not None and job.state in states and where(job) else None

    return wait_for(check, timeout, f"job {job_id} to be {'/'.join(states)}")


def accounted(client: SlurmClient, job_id: int, done: Callable[[list[AccountedJob]], bool]) -> list[AccountedJob]:
    # slurmctld hands its records to slurmdbd asynchronously: a row lags the job by seconds, and right
    # after a start it is a placeholder (name "allocation", state PENDING, no partition).
    return wait_for(lambda: (rows := client.accounting([job_id])) and done(rows) and rows, 30,
                    f"accounting of job {job_id}")


def marker(cluster: LocalCluster, name: str) -> Path:
    return cluster.workdir / f"{name}-{secrets.token_hex(4)}"


def test_submit_on_behalf_of_an_account_and_read_it_back_from_squeue_sacct_and_slurmrestd(slurm):
    client = slurm.client()
    jid = client.submit(spec(slurm, account="speech", partition="batch", name="resnet", gpus_per_node=2,
                             time_limit_min=30, prepare_signal="TERM", comment="jobgate:j-1"))
    job = in_state(client, jid, "RUNNING")
    assert (job.user, job.account, job.partition, job.name, job.comment) == ("jobgate", "speech", "batch",
                                                                             "resnet", "jobgate:j-1")
    assert (job.gpus_per_node, job.nodes, job.time_limit_min, job.restarts) == (2, 1, 30, 0)
    assert job.submit_time is not None and job.start_time is not None and job.start_time >= job.submit_time

    (row,) = accounted(client, jid, lambda rows: rows[0].partition == "batch")
    assert (row.user, row.account, row.state, row.gpus, row.cancelled_by) == ("jobgate", "speech", "RUNNING", 2, None)
    assert row.start_time == job.start_time

    with SlurmRestReader(slurm.connection()) as rest:
        (seen,) = [j for j in rest.jobs() if j.job_id == jid]
        (rest_row,) = rest.accounting(jid)
    assert (seen.user, seen.account, seen.comment, seen.gpus_per_node, seen.start_time) == (
        "jobgate", "speech", "jobgate:j-1", 2, job.start_time)
    assert rest_row.job_id == jid and rest_row.account == "speech"


@pytest.mark.parametrize("read", ["jobs", "accounting"])
def test_slurm_refuses_a_token_signed_with_another_key(slurm, tmp_path, read):
    other = tmp_path / "other.key"
    other.write_bytes(secrets.token_bytes(32))
    with SlurmRestReader(replace(slurm.connection(), jwt_key=other)) as rest, \
            pytest.raises(PermissionDenied, match="Protocol authentication error"):
        rest.jobs() if read == "jobs" else rest.accounting(1)


# (case, batch script, final state, cancelled by, checkpoint written): the prepare signal goes to the batch
# script only; a job still running when the window ends is cancelled.
STOPS = [
    ("graceful", CHECKPOINTS_ON_TERM, "COMPLETED", None, True),
    ("forced", IGNORES_TERM, "CANCELLED", "jobgate", False),
]


@pytest.mark.parametrize(("body", "final", "cancelled_by", "checkpointed"), [s[1:] for s in STOPS],
                         ids=[s[0] for s in STOPS])
def test_graceful_stop_is_the_prepare_signal_then_cancel_with_evidence_from_accounting(
        slurm, body, final, cancelled_by, checkpointed):
    client = slurm.client()
    ckpt, ready = marker(slurm, "ckpt"), marker(slurm, "ready")
    jid = client.submit(spec(slurm, body, environment={"CKPT": str(ckpt), "READY": str(ready)}))
    in_state(client, jid, "RUNNING")
    wait_for(ready.exists, 30, "the batch script's signal handler")

    client.signal_batch(jid, "TERM")
    window_end = time.monotonic() + 4
    while time.monotonic() < window_end and (job := client.job(jid)) is not None and job.state == "RUNNING":
        time.sleep(0.1)
    if client.job(jid).state == "RUNNING":
        client.cancel(jid)

    # Evidence only once slurmctld saw the last process go (the job leaves COMPLETING): until then the
    # accounting row of the batch step reads CANCELLED 0:0 at the time of the cancel, and is rewritten
    # with the SIGKILL and its time after KillWait.
    in_state(client, jid, final)
    rows = accounted(client, jid,
                     lambda rows: rows[-1].state == final and rows[-1].batch_state not in (None, "RUNNING"))
    row = rows[-1]
    assert row.cancelled_by == cancelled_by
    assert ckpt.exists() is checkpointed
    if checkpointed:
        assert row.exit.clean and row.batch_exit is not None and row.batch_exit.clean
    else:
        # A cancelled job's own exit code reads 0:0; the signal that ended it is on the batch step.
        assert row.batch_exit is not None and row.batch_exit.signal == 9


def test_requeue_keeps_the_priority_jobgate_set_but_slurm_resets_the_submit_time(slurm):
    client = slurm.client()
    jid = client.submit(spec(slurm, partition="batch", gpus_per_node=8))
    before = in_state(client, jid, "RUNNING")
    client.set_priority(jid, 5000)
    # Slurm's times have 1 s resolution: let a second pass so that a reset submit time shows.
    wait_for(lambda: time.time() >= before.submit_time.timestamp() + 1.05, 5, "the next second")
    client.requeue(jid)

    # It may start again only cred_expire (10 s here) + 1 s after it ended: it waits for its BeginTime.
    after = in_state(client, jid, "PENDING", where=lambda job: job.reason == "BeginTime")
    assert after.restarts == 1 and after.priority == 5000
    assert after.submit_time > before.submit_time  # the age factor starts again from zero
    assert after.eligible_time > after.submit_time

    rows = accounted(client, jid, lambda rows: any(r.state == "REQUEUED" for r in rows))
    (requeued,) = [r for r in rows if r.state == "REQUEUED"]
    assert requeued.cancelled_by is None  # accounting never says who requeued


def test_requeue_of_a_completed_job_puts_it_back_in_the_queue(slurm):
    # Why the adapter must check a job still runs before it requeues it.
    client = slurm.client()
    jid = client.submit(spec(slurm, script("true")))
    in_state(client, jid, "COMPLETED")
    client.requeue(jid)
    assert in_state(client, jid, "PENDING").restarts == 1


# (case, the job's state, the act, the error): what Slurm answers, some of it with exit status 0
WRONG_STATE = [
    ("cancel-unknown-job", "unknown", lambda c, j: c.cancel(j), JobNotFound),  # scancel exits 0
    ("cancel-completed-job", "completed", lambda c, j: c.cancel(j), JobStateConflict),  # scancel exits 0
    ("signal-pending-job", "pending", lambda c, j: c.signal_batch(j, "TERM"), JobStateConflict),
    ("requeue-pending-job", "pending", lambda c, j: c.requeue(j), JobStateConflict),
    ("priority-of-unknown-job", "unknown", lambda c, j: c.set_priority(j, 10), JobNotFound),
]


@pytest.mark.parametrize(("state", "act", "error"), [w[1:] for w in WRONG_STATE], ids=[w[0] for w in WRONG_STATE])
def test_an_act_on_a_job_in_the_wrong_state_is_refused_with_slurms_reason(slurm, state, act, error):
    client = slurm.client()
    if state == "unknown":
        jid = 999_999
    elif state == "completed":
        jid = client.submit(spec(slurm, script("true")))
        in_state(client, jid, "COMPLETED")
    else:
        jid = client.submit(spec(slurm, hold=True))
        in_state(client, jid, "PENDING")
    with pytest.raises(error) as e:
        act(client, jid)
    assert "\n" not in str(e.value) and str(jid) in str(e.value)


def test_hold_release_priority_nice_and_the_estimated_start_of_a_waiting_job(slurm):
    client = slurm.client()
    blocker = client.submit(spec(slurm, nodes=slurm.nodes, gpus_per_node=slurm.gpus_per_node, time_limit_min=5))
    in_state(client, blocker, "RUNNING")
    waiting = client.submit(spec(slurm, gpus_per_node=slurm.gpus_per_node, time_limit_min=5))
    assert in_state(client, waiting, "PENDING").reason in ("Resources", "Priority", "None")

    client.hold(waiting)
    held = client.job(waiting)
    assert held.held and held.reason == "JobHeldAdmin"
    with pytest.raises(JobStateConflict, match="held state"):
        client.set_priority(waiting, 4242)
    client.release(waiting)
    assert not client.job(waiting).held

    client.set_nice(waiting, -10)  # negative nice: Operators only
    assert client.job(waiting).nice == -10
    client.set_priority(waiting, 4242)  # an explicit priority also clears the nice
    client.set_nice(waiting, 50)  # and from then on a nice is ignored, though Slurm exits 0
    job = client.job(waiting)
    assert (job.priority, job.nice) == (4242, 0)

    def estimate():
        (e,) = client.start_estimates([waiting])
        return e if e.start_time is not None else None

    est = wait_for(estimate, 30, "the backfill scheduler's estimate")
    # The whole cluster is the blocker's until its time limit ends: no earlier start is possible.
    assert est.start_time >= client.job(blocker).end_time


def test_slurm_itself_refuses_people_what_only_jobgate_may_do(slurm):
    client = slurm.client()
    theirs = int(slurm.run_as("mallory", "sbatch", "--parsable", "-p", "batch", "-o", "/dev/null",
                              "--wrap", "exec sleep 600").stdout.split(";")[0])
    governed = client.submit(spec(slurm))
    in_state(client, theirs, "RUNNING")
    in_state(client, governed, "RUNNING")

    alice = slurm.client("alice")
    refusals: list[Callable[[], None]] = [
        lambda: alice.cancel(theirs), lambda: alice.cancel(governed), lambda: alice.requeue(governed),
        lambda: alice.hold(governed), lambda: alice.set_priority(governed, 1),
        lambda: alice.signal_batch(governed, "KILL"),
    ]
    for act in refusals:
        with pytest.raises(PermissionDenied):
            act()
    assert {j.state for j in client.jobs([theirs, governed])} == {"RUNNING"}

    with pytest.raises(InvalidRequest, match="Invalid account"):
        slurm.client("sam").submit(spec(slurm))  # sam has no association
    token = slurm.run_as("alice", "scontrol", "token", check=False)
    assert token.returncode != 0 and "permission denied" in token.stderr.lower()
    admins = slurm.run_as("root", "sacctmgr", "-n", "-P", "show", "user", "format=user,adminlevel").stdout
    assert sorted(ln for ln in admins.splitlines() if not ln.endswith("|None")) == [
        "jobgate|Operator", "root|Administrator"]


# (case, who acts in Slurm, who owns the job)
OUT_OF_BAND = [
    ("owner-cancels-their-own-job", "mallory", "mallory"),
    ("root-cancels-a-governed-job", "root", "jobgate"),
]


@pytest.mark.parametrize(("actor", "owner"), [c[1:] for c in OUT_OF_BAND], ids=[c[0] for c in OUT_OF_BAND])
def test_an_out_of_band_scancel_is_in_accounting_with_who_did_it(slurm, actor, owner):
    client = slurm.client()
    # Reconciliation reads what happened since its last pass; Slurm's times are whole seconds.
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    if owner == "jobgate":
        jid = client.submit(spec(slurm))
    else:
        jid = int(slurm.run_as(owner, "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "exec sleep 600")
                  .stdout.split(";")[0])
    in_state(client, jid, "RUNNING")
    slurm.run_as(actor, "scancel", str(jid))
    (row,) = accounted(client, jid, lambda rows: rows[0].state == "CANCELLED")
    assert (row.user, row.cancelled_by) == (owner, actor)
    # A time-window query finds the row only once its eligible time reached accounting, which can be
    # seconds after `sacct -j` shows it ended (Eligible=Unknown meanwhile): a pass must overlap the last.
    found = wait_for(lambda: {r.job_id: r for r in client.accounting(since=since)}.get(jid), 30,
                     "the job in the time window")
    assert found.cancelled_by == actor
    assert jid not in {r.job_id for r in client.accounting(since=since, until=since)}
