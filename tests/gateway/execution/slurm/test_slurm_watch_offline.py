"""The watch's comparison (gateway/execution/slurm/watch.py) and the quota mapping (associations.py), without a
cluster: Slurm's view as the records the client returns, slurmctld's log as the lines 22.05 writes (copied from the
project's starter). The real cluster's side is tests/gateway/execution/slurm/test_slurm_governance.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gateway.execution.slurm.associations import Assoc, Change, changes, desired, modify_argv, parse_associations
from gateway.execution.slurm.oversight import requeues_asked
from gateway.execution.slurm.records import AccountedJob, ExitStatus, QueuedJob, SlurmJobId
from gateway.execution.slurm.watch import Governed, compare, parse_log
from gateway.store.slurm_tables import SlurmRun
from scheduler.model import ProjectId, Quotas, TenantQuota

T0 = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
SERVICE = "jobgate"
NAMES = {0: "root", 1001: "alice", 1009: "jobgate"}


def queued(sid: int, *, comment: str = "jobgate:j-1", state: str = "RUNNING", reason: str = "None",
           priority: int = 10000, user: str = SERVICE, restarts: int = 0) -> QueuedJob:
    return QueuedJob(job_id=SlurmJobId(sid), name="job", user=user, account="vision", partition="normal", qos="normal",
                     state=state, reason=reason, priority=priority, nice=0, comment=comment, nodes=1, node_list="n001",
                     gpus_per_node=2, gres="gpu:2", time_limit_min=None, restarts=restarts, requeue=True,
                     submit_time=T0, eligible_time=T0, start_time=T0, end_time=None, exit=ExitStatus(0, None))


def accounted(sid: int, state: str, *, cancelled_by: str | None = None, submit: datetime = T0) -> AccountedJob:
    return AccountedJob(job_id=SlurmJobId(sid), name="job", user=SERVICE, account="vision", partition="normal",
                        qos="normal", state=state, reason="None", comment=None, priority=10000, nodes="n001", gpus=2,
                        cancelled_by=cancelled_by, submit_time=submit, eligible_time=submit, start_time=submit,
                        end_time=None, elapsed_s=1, exit=ExitStatus(0, None), batch_exit=None, batch_state=None,
                        working_directory="/tmp")


GOVERNED = Governed(job_id="j-1", slurm_job_id=7, state="running", owner="alice", project="vision", submitted_at=T0)


def look(q: list[QueuedJob], a: list[AccountedJob], g: Governed = GOVERNED,
         log: str = "") -> list[tuple[str, str | None]]:
    found = compare(q, a, {g.slurm_job_id: g}, parse_log(log.splitlines(), zone=UTC), service_user=SERVICE, names=NAMES)
    return [(f.act, f.by) for f in found.findings]


def test_a_cancel_jobgate_did_not_ask_for_names_who_from_accounting() -> None:
    found = look([queued(7, state="CANCELLED")], [accounted(7, "CANCELLED", cancelled_by="root")])
    assert found == [("cancel", "root")]


def test_a_cancel_by_jobgate_for_its_own_stop_is_no_finding_but_one_without_a_stop_is() -> None:
    cancelled = [accounted(7, "CANCELLED", cancelled_by=SERVICE)]
    assert look([], cancelled, replace(GOVERNED, stop_asked=True)) == []
    found = compare([], cancelled, {7: GOVERNED}, service_user=SERVICE).findings
    assert [(f.act, f.by, f.with_jobgate_account) for f in found] == [("cancel", SERVICE, True)]


def test_a_cancel_read_by_jobgates_executor_at_the_runs_end_is_still_found() -> None:
    # the executor saw the end first: slurm_runs holds accounting's state and canceller, squeue no longer the job
    ended = replace(GOVERNED, ended="CANCELLED", cancelled_by="root", state="failed")
    assert look([], [], ended) == [("cancel", "root")]
    assert look([], [], replace(ended, ended="COMPLETED", cancelled_by=None)) == []


def test_a_cancel_slurm_does_not_attribute_yet_is_named_from_the_log() -> None:
    log = "[2026-12-02T00:02:54.399] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=7 uid 0\n"
    assert look([queued(7, state="CANCELLED")], [], log=log) == [("cancel", "root")]
    assert look([queued(7, state="CANCELLED")], []) == [("cancel", None)]


def test_a_kill_slurm_refused_is_not_an_act() -> None:
    log = ("[2026-12-02T00:02:54.395] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=7 uid 1001\n"
           "[2026-12-02T00:02:54.395] error: Security violation, REQUEST_KILL_JOB RPC for JobId=7 from uid 1001\n"
           "[2026-12-02T00:02:54.395] _slurm_rpc_kill_job: job_str_signal() uid=1001 JobId=7 sig=9 returned: "
           "Access/permission denied\n")
    assert parse_log(log.splitlines(), zone=UTC) == []
    assert look([queued(7)], [], log=log) == []


def test_holds_releases_and_priorities_jobgate_did_not_set() -> None:
    log = ("[2026-12-02T00:02:54.530] sched: _hold_job_rec: hold on JobId=7 by uid 0\n"
           "[2026-12-02T00:02:54.530] sched: _update_job: set priority to 0 for JobId=7\n"
           "[2026-12-02T00:02:54.531] _slurm_rpc_update_job: complete JobId=7 uid=0 usec=117740\n")
    assert look([queued(7, state="PENDING", reason="JobHeldAdmin", priority=0)], [], log=log) == [("hold", "root")]
    assert look([queued(7, state="PENDING", reason="JobHeldUser", priority=0)], []) == [("hold", SERVICE)]
    paused = replace(GOVERNED, paused=True, state="paused")
    assert look([queued(7, state="PENDING", reason="JobHeldAdmin", priority=0)], [], paused) == []
    assert look([queued(7, state="PENDING", reason="Priority")], [], paused) == [("release", None)]
    fixed = replace(GOVERNED, priority=5000)
    assert look([queued(7, priority=5000)], [], fixed) == []
    log = ("[2026-12-02T00:02:54.541] sched: _update_job: set priority to 777 for JobId=7\n"
           "[2026-12-02T00:02:54.541] _slurm_rpc_update_job: complete JobId=7 uid=1009 usec=240\n")
    assert look([queued(7, priority=777)], [], fixed, log) == [("priority", SERVICE)]
    # jobgate set none (Slurm's own factors rule): a fixed priority by someone else is still seen, its own is not
    assert look([queued(7, priority=777)], [], GOVERNED, log.replace("uid=1009", "uid=0")) == [("priority", "root")]
    assert look([queued(7, priority=777)], [], GOVERNED, log) == []


def test_a_hold_undone_before_the_next_look_is_still_found_in_the_log_and_jobgates_own_acts_are_not() -> None:
    log = ("[2026-12-02T00:02:54.530] sched: _hold_job_rec: hold on JobId=7 by uid 0\n"
           "[2026-12-02T00:02:55.100] sched: _release_job_rec: release hold on JobId=7 by uid 1009\n")
    assert look([queued(7, state="PENDING", reason="Priority")], [], log=log) == [("hold", "root")]
    # the same hold, also seen held in Slurm, is one finding
    held = queued(7, state="PENDING", reason="JobHeldAdmin", priority=0)
    assert look([held], [], log=log.splitlines()[0]) == [("hold", "root")]


def test_requeues_beyond_those_jobgate_asked_for_and_not_slurms_own_preemption() -> None:
    rows = [accounted(7, "REQUEUED"), accounted(7, "PREEMPTED"), accounted(7, "RUNNING")]
    found = compare([queued(7, restarts=2)], rows, {7: GOVERNED}, service_user=SERVICE).findings
    assert [(f.key, f.by) for f in found] == [("j-1:requeue:1", None)]
    assert look([queued(7, restarts=2)], rows, replace(GOVERNED, requeues=1)) == []


def test_jobgates_requeues_are_counted_from_slurm_runs_so_a_requeue_after_slurms_own_preemption_is_found() -> None:
    # Slurm preempted the job (its PREEMPTED attempt; jobgate recorded the preemption, naming the preemptor), then
    # root requeued it: jobgate made no `scontrol requeue` of it, so the REQUEUED attempt is someone else's.
    rows = [accounted(7, "PREEMPTED"), accounted(7, "REQUEUED"), accounted(7, "RUNNING")]
    run = SlurmRun(job_id="j-1", cluster="c", slurm_job_id=7, submitted_at=T0, updated_at=T0, stop_requeue=False,
                   requeues_made=None, forced_at=None)
    assert look([queued(7, restarts=2)], rows, replace(GOVERNED, requeues=requeues_asked(run))) == [
        ("requeue", None)]
    # jobgate's own preemption asked (not made yet) and made: its requeue counted either way, no finding
    run.stop_requeue = True
    assert requeues_asked(run) == 1
    run.forced_at, run.requeues_made = T0, 1
    assert look([queued(7, restarts=2)], rows, replace(GOVERNED, requeues=requeues_asked(run))) == []


def test_jobs_jobgate_did_not_submit_are_ungoverned_even_when_their_comment_claims_a_jobgate_id() -> None:
    direct = queued(8, comment="", user="alice")
    forged = queued(9, comment="jobgate:j-1", user="alice")
    reused = queued(7, comment="jobgate:j-0")  # Slurm's id 7 again after a reset: not the governed job
    found = compare([direct, forged, reused, queued(10, comment="", state="COMPLETED")], [], {7: GOVERNED},
                    service_user=SERVICE)
    assert [(u.slurm_job_id, u.user, u.claims) for u in found.ungoverned] == [(8, "alice", None), (9, "alice", "j-1"),
                                                                             (7, SERVICE, "j-0")]
    assert found.findings == []
    # an accounting row of the older job under the reused id says nothing about the governed one
    old = accounted(7, "CANCELLED", cancelled_by="root", submit=T0 - timedelta(days=3))
    assert look([], [old]) == []


def test_quota_tiers_become_association_limits_and_borrowing_is_stated_as_not_available() -> None:
    have = parse_associations("root|||gres/gpu=24\nroot|root||\nvision|||cpu=8,gres/gpu=4\nvision|alice||\n"
                              "vision|jobgate||\nvision|bob|normal|gres/gpu=1\nspeech|||\nspeech|mallory||\n")
    assert have == {Assoc("root"): 24, Assoc("root", "root"): None, Assoc("vision"): 4, Assoc("vision", "alice"): None,
                    Assoc("vision", "jobgate"): None, Assoc("speech"): None, Assoc("speech", "mallory"): None}
    quotas = Quotas(cluster_gpus=None, tenants={ProjectId("vision"): TenantQuota(gpus=8, borrow_limit=4,
                                                                                  users={"alice": 6, "jobgate": 2})},
                    users={"alice": 3})
    want, notes = desired(quotas, have, service_user=SERVICE, projects=["vision", "speech", "audio"])
    assert want == {Assoc("root"): None, Assoc("vision"): 8, Assoc("vision", "alice"): 3,
                    Assoc("vision", "jobgate"): None, Assoc("speech"): 0, Assoc("speech", "mallory"): None}
    text = " ".join(notes)
    assert "borrowing is not available on the Slurm backend" in text and "speech has no quota in jobgate" in text
    assert "audio" in text
    assert changes(want, have) == [Change(Assoc("root"), 24, None), Change(Assoc("speech"), None, 0),
                                   Change(Assoc("vision"), 4, 8), Change(Assoc("vision", "alice"), None, 3)]
    assert modify_argv("c1", Change(Assoc("vision", "alice"), None, 3)) == [
        "sacctmgr", "-i", "modify", "user", "name=alice", "account=vision", "cluster=c1", "set",
        "GrpTRES=gres/gpu=3"]
    assert modify_argv("c1", Change(Assoc("root"), 24, None))[-1] == "GrpTRES=gres/gpu=-1"
    assert desired(None, have, service_user=SERVICE)[0] == {}  # no quota in jobgate: Slurm's are left alone
