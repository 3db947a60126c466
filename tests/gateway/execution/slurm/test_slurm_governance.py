"""Governing a real Slurm cluster (H1, F3, R5, Q4): what is done behind jobgate's back is found in one look.

The cluster is the session's (conftest.py); the gateway is the demo one on the Slurm backend, shared by the module,
its Slurm loop driven by the tests one cycle at a time (as in test_slurm_backend.py) and its watch likewise. People
then act in Slurm as themselves, through Slurm's own commands (root for what Slurm lets only root do to jobgate's
jobs).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_testkit import Api, job_spec, ledger_entries, start_api
from slurm_testkit import LocalCluster, wait_for

from gateway.bootstrap import slurm_execution
from gateway.execution.slurm.oversight import SlurmWatch
from gateway.execution.slurm.poll import SlurmLoop
from gateway.jobs.oversight import JobOversight
from gateway.settings import Settings
from gateway.store.models import Job
from gateway.store.scheduler_tables import QuotaRow
from gateway.store.slurm_tables import SlurmRun

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


@pytest.fixture(scope="module")
def api(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("gov"), backend="slurm", slurm_conf=slurm_cluster.slurm_conf,
                        slurm_service_user=slurm_cluster.service_user, policy_watch_interval_s=0,
                        slurm_checkpoint_dir=slurm_cluster.workdir / f"jobgate-gov-{secrets.token_hex(3)}")
    yield from start_api(settings, execution=slurm_execution)


def watch(api: Api, slurm: LocalCluster) -> SlurmWatch:
    gw = api.gateway
    return SlurmWatch(gw.execution.client, slurm.cluster, JobOversight(gw), gw.transaction, clock=gw.clock)


def governed(api: Api, who: str = "alice") -> tuple[str, int]:
    """A job submitted through jobgate and running on Slurm: (jobgate id, Slurm id)."""
    r = api.post("/v1/jobs", who, json=job_spec(name="governed", gpus_per_node=1, command=["sleep", "600"]))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    loop = SlurmLoop(api.gateway.execution)
    deadline = time.monotonic() + 45
    while True:
        loop.cycle()
        with api.gateway.transaction(immediate=False) as session:
            job = session.get(Job, job_id)
            run = session.query(SlurmRun).filter_by(job_id=job_id).one_or_none()
            if job is not None and job.state == "running" and run is not None:
                return job_id, run.slurm_job_id
        assert time.monotonic() < deadline, f"{job_id} never ran on Slurm"
        time.sleep(0.3)


def entries(api: Api, kind: str) -> list[dict[str, Any]]:
    return [e["body"] for e in ledger_entries(api) if e["kind"] == kind]


def test_acts_behind_jobgates_back_are_ledgered_once_with_who_did_them_and_alerted(
        api: Api, slurm: LocalCluster) -> None:
    w = watch(api, slurm)
    cancelled, cancelled_sid = governed(api)
    held, held_sid = governed(api)
    assert w.cycle().findings == []
    # Slurm's own permission check keeps a researcher off jobgate's jobs: her try changes nothing, so it is no act
    refused = slurm.run_as("alice", "scancel", str(cancelled_sid), check=False)
    assert refused.returncode != 0 and "Access/permission denied" in refused.stderr
    assert w.cycle().findings == []
    slurm.run_as("root", "scancel", str(cancelled_sid))
    slurm.run_as("root", "scontrol", "hold", str(held_sid))
    found = w.cycle().findings  # one look finds both
    assert sorted((f["job_id"], f["act"], f["by"]) for f in found) == sorted(
        [(cancelled, "cancel", "root"), (held, "hold", "root")])
    ledgered = {e["job_id"]: e for e in entries(api, "out_of_band")}
    assert ledgered[cancelled]["by"] == "root" and ledgered[cancelled]["slurm_job_id"] == cancelled_sid
    assert ledgered[cancelled]["bypass"] is True and ledgered[cancelled]["owner"] == "alice"
    # alerted like a bypass: on-call (dave) and the job's owner are told
    for who in ("dave", "alice"):
        notes = api.get("/v1/notifications", who).json()["notifications"]
        assert {n["body"]["job_id"] for n in notes if n["kind"] == "slurm_out_of_band"} == {cancelled, held}
    assert w.cycle().findings == []  # the same acts, read again, are not told again
    assert len(entries(api, "out_of_band")) == 2


def test_a_requeue_jobgate_did_not_ask_for_is_found_though_slurm_does_not_say_who(
        api: Api, slurm: LocalCluster) -> None:
    w = watch(api, slurm)
    job_id, sid = governed(api)
    w.cycle()
    slurm.run_as("root", "scontrol", "requeue", str(sid))
    # accounting writes the requeued attempt's row a moment after slurmctld requeues it: a look or two
    (found,) = wait_for(lambda: w.cycle().findings, 30, "the requeue to be found", interval=0.5)
    assert (found["job_id"], found["act"], found["by"]) == (job_id, "requeue", None)
    assert "no requeuer" in found["by_source"]


def test_a_job_cancelled_in_slurm_while_it_waits_ends_cancelled_out_of_band_and_is_not_submitted_again(
        api: Api, slurm: LocalCluster) -> None:
    loop, w = SlurmLoop(api.gateway.execution), watch(api, slurm)

    def job_and_runs() -> tuple[Job, list[SlurmRun]]:
        loop.cycle()
        with api.gateway.transaction(immediate=False) as session:
            job = session.get(Job, job_id)
            assert job is not None
            session.expunge(job)
            return job, list(session.query(SlurmRun).filter_by(job_id=job_id).all())

    # batch is down: Slurm takes the job and keeps it waiting (PartitionDown)
    slurm.run_as("root", "scontrol", "update", "PartitionName=batch", "State=DOWN")
    try:
        r = api.post("/v1/jobs", "alice", json=job_spec(name="waits", queue="batch", gpus_per_node=1,
                                                        command=["sleep", "600"]))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        (run,) = wait_for(lambda: [x for x in job_and_runs()[1] if x.state == "PENDING"], 30,
                          "the job waiting in Slurm")
        slurm.run_as("root", "scancel", str(run.slurm_job_id))
        ended = wait_for(lambda: next((j for j in [job_and_runs()[0]] if j.state != "pending"), None), 30,
                         "the jobgate job to end")
    finally:
        slurm.run_as("root", "scontrol", "update", "PartitionName=batch", "State=UP")
    assert ended is not None
    job = ended
    assert (job.state, job.outcome, job.stop_request["cancelled_by"]) == ("stopped", "cancelled", "root")
    assert job.evidence["slurm"]["job_id"] == run.slurm_job_id and job.evidence["slurm"]["cancelled_by"] == "root"
    assert job.stop_request["cancelled_at"] and "cancelled in Slurm by root" in job.evidence["note"]
    (moved,) = [e for e in entries(api, "transition") if e["job_id"] == job_id and e["state_after"] == "stopped"]
    assert moved["by"] == "out_of_band:root" and moved["out_of_band"] is True
    # never submitted again: the next cycles leave it as it is, with its one Slurm job
    job, runs = job_and_runs()
    assert job.state == "stopped" and [x.slurm_job_id for x in runs] == [run.slurm_job_id]
    # and the act itself is the watch's finding, as for a running job
    # (the earlier tests' jobs, cancelled by the fixture as root after each, are found too: not this test's)
    found = wait_for(lambda: [f for f in w.cycle().findings if f["job_id"] == job_id], 30, "the cancel to be found")
    assert [(f["act"], f["by"]) for f in found] == [("cancel", "root")]


def test_a_job_submitted_straight_to_slurm_is_tracked_but_not_governed(api: Api, slurm: LocalCluster) -> None:
    w = watch(api, slurm)
    sid = int(slurm.run_as("alice", "sbatch", "--parsable", "-A", "vision", "-p", "normal", "--gres=gpu:1",
                           "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip())
    assert w.cycle().ungoverned == [sid]
    spots = api.get("/v1/inventory", "alice").json()["blind_spots"]
    (spot,) = [s for s in spots if s.get("governed") is False]
    assert spot["slurm"]["job_id"] == sid and spot["responsible"] == ["alice"]
    assert "not governed" in spot["why"]
    assert not [s for s in api.get("/v1/inventory", "mallory").json()["blind_spots"] if s.get("governed") is False]
    assert w.cycle().ungoverned == []
    assert [e["slurm_job_id"] for e in entries(api, "ungoverned")] == [sid]
    slurm.run_as("alice", "scancel", str(sid))
    w.cycle()
    assert not [s for s in api.get("/v1/inventory", "alice").json()["blind_spots"] if s.get("governed") is False]


def gpu_limits(slurm: LocalCluster) -> dict[str, str]:
    out = slurm.run_as("root", "sacctmgr", "-n", "-P", "show", "assoc", f"cluster={slurm.cluster}",
                       "format=account,user,grptres").stdout
    return {f"{a}/{u}" if u else a: t for a, u, t in (ln.split("|")[:3] for ln in out.splitlines() if ln)}


def clear_gpu_limits(slurm: LocalCluster) -> None:
    """Leave the session's cluster as the starter made it (the other modules' jobs must not wait on a quota)."""
    for assoc, tres in gpu_limits(slurm).items():
        if "gres/gpu" in tres:
            account, _, user = assoc.partition("/")
            where = ["user", f"name={user}", f"account={account}"] if user else ["account", f"name={account}"]
            slurm.run_as("root", "sacctmgr", "-i", "modify", *where, f"cluster={slurm.cluster}", "set",
                         "GrpTRES=gres/gpu=-1")


def test_quotas_reach_sacctmgr_and_a_limit_changed_in_slurm_is_found_and_set_back(
        api: Api, slurm: LocalCluster) -> None:
    w = watch(api, slurm)
    try:
        r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"),
                           json={"gpus": 4, "borrow_limit": 4, "users": {"alice": 2}, "reason": "vision on Slurm"})
        assert r.status_code == 202, r.text
        assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "frank").json()["state"] == "executed"
        done = w.cycle()
        limits = gpu_limits(slurm)
        assert (limits["vision"], limits["vision/alice"], limits["speech"]) == ("gres/gpu=4", "gres/gpu=2",
                                                                                 "gres/gpu=0")
        assert limits["vision/jobgate"] == ""  # the service user's jobs are everyone's: the account binds them
        (synced,) = [e for e in entries(api, "outcome") if e.get("action") == "quota.sync"]
        assert {"association": "vision", "before": None, "after": 4} in synced["changes"]
        assert any("borrowing is not available on the Slurm backend" in n for n in done.notes + synced["notes"])
        # Slurm itself holds the job past the tenant's quota, whoever submits it
        sid = int(slurm.run_as("bob", "sbatch", "--parsable", "-A", "vision", "-p", "normal", "--gres=gpu:5",
                               "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip())
        wait_for(lambda: (j := slurm.client().job(sid)) is not None and j.reason == "AssocGrpGRES", 30,
                 "Slurm to hold the job at the account's limit")
        slurm.run_as("root", "sacctmgr", "-i", "modify", "account", "name=vision", f"cluster={slurm.cluster}",
                     "set", "GrpTRES=gres/gpu=16")
        (found,) = w.cycle().findings
        assert found["act"] == "association" and found["association"] == "vision"
        assert gpu_limits(slurm)["vision"] == "gres/gpu=4"
        assert w.cycle().findings == []
    finally:
        with api.gateway.transaction() as session:  # jobgate's quotas gone: the watch leaves Slurm's alone
            session.query(QuotaRow).delete()
        clear_gpu_limits(slurm)
