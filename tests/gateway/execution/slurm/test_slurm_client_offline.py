"""The Slurm client's parts that need no cluster: reading documents, checking a job spec, naming a
failure from what Slurm printed, signing a JWT. The messages in the tables are Slurm 22.05.8's own,
copied from the starter's cluster."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.execution.slurm import (
    AccountingDown,
    ControllerDown,
    InvalidRequest,
    JobNotFound,
    JobSpec,
    JobStateConflict,
    PermissionDenied,
    SlurmBadOutput,
    SlurmCommandFailed,
    SlurmConfigError,
    SlurmConnection,
)
from gateway.execution.slurm.commands import CommandRunner, classify
from gateway.execution.slurm.jwt_token import mint_token
from gateway.execution.slurm.parse import parse_accounted_jobs, parse_queued_jobs, parse_start_estimates

BAD_DOCUMENTS = [
    ("not-json", "slurm_load_jobs error: Unable to contact slurm controller"),
    ("array", "[]"),
    ("jobs-not-list", '{"jobs": 3}'),
    ("job-not-object", '{"jobs": [7]}'),
    ("job-id-string", '{"jobs": [{"job_id": "7", "job_state": "RUNNING"}]}'),
    ("job-id-bool", '{"jobs": [{"job_id": true, "job_state": "RUNNING"}]}'),
    ("errors-not-list", '{"errors": "x", "jobs": []}'),
    ("truncated", '{"jobs": [{"job_id": 7,'),
]


@pytest.mark.parametrize("text", [t for _, t in BAD_DOCUMENTS], ids=[i for i, _ in BAD_DOCUMENTS])
@pytest.mark.parametrize("parse", [parse_queued_jobs, parse_accounted_jobs], ids=["squeue", "sacct"])
def test_an_unreadable_document_is_bad_output_in_one_line(parse, text):
    with pytest.raises(SlurmBadOutput) as e:
        parse(text, "squeue --json", "jobgate")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("squeue --json as jobgate: unreadable answer from Slurm")


def test_a_job_missing_its_state_names_the_field_and_the_job():
    with pytest.raises(SlurmBadOutput, match=r"job 7: field 'job_state' is missing"):
        parse_queued_jobs('{"jobs": [{"job_id": 7}]}', "squeue --json")


def test_squeue_exit_codes_are_wait_statuses():
    jobs, _ = parse_queued_jobs(json.dumps({"jobs": [
        {"job_id": 1, "job_state": "FAILED", "exit_code": 768},
        {"job_id": 2, "job_state": "FAILED", "exit_code": 9},
        {"job_id": 3, "job_state": "COMPLETED", "exit_code": 0, "nice": None, "tres_per_node": "gres:gpu:4"},
    ]}), "squeue --json")
    assert [(j.exit.code, j.exit.signal) for j in jobs] == [(3, None), (None, 9), (0, None)]
    assert (jobs[2].nice, jobs[2].gpus_per_node, jobs[2].submit_time) == (0, 4, None)


def test_squeue_prints_a_negative_nice_as_unsigned():
    jobs, _ = parse_queued_jobs('{"jobs": [{"job_id": 1, "job_state": "PENDING", "nice": 4294967286}]}', "squeue")
    assert jobs[0].nice == -10


def test_start_estimates_read_epoch_seconds_and_no_estimate():
    rows = parse_start_estimates("12|1796156373|n001|Resources\n13|N/A||Priority\n", "squeue --start")
    assert rows[0].start_time == datetime.fromtimestamp(1796156373, UTC) and rows[0].nodes == "n001"
    assert (rows[1].start_time, rows[1].nodes, rows[1].reason) == (None, None, "Priority")
    with pytest.raises(SlurmBadOutput, match="not epoch seconds"):
        parse_start_estimates("12|2026-12-01T20:24:36|n001|Resources", "squeue --start")
    with pytest.raises(SlurmBadOutput, match="line 1"):
        parse_start_estimates("JOBID PARTITION", "squeue --start")


SPEC = {"script": "#!/bin/sh\ntrue\n", "account": "vision", "partition": "normal"}
BAD_SPECS = [
    ("no-interpreter", {"script": "sleep 1"}),
    ("account-with-comma", {"account": "vision,speech"}),
    ("partition-with-space", {"partition": "nor mal"}),
    ("zero-nodes", {"nodes": 0}),
    ("negative-gpus", {"gpus_per_node": -1}),
    ("zero-minutes", {"time_limit_min": 0}),
    ("bad-signal", {"prepare_signal": "TERM;rm"}),
    ("two-line-comment", {"comment": "a\nb"}),
    ("relative-workdir", {"workdir": "tmp"}),
    ("bad-env-name", {"environment": {"A-B": "1"}}),
]


@pytest.mark.parametrize("change", [c for _, c in BAD_SPECS], ids=[i for i, _ in BAD_SPECS])
def test_a_bad_job_spec_is_refused_before_sbatch_runs(change):
    with pytest.raises(InvalidRequest):
        JobSpec(**{**SPEC, **change})


def test_a_job_spec_becomes_sbatch_options():
    args = JobSpec(**SPEC, nodes=2, gpus_per_node=8, time_limit_min=30, prepare_signal="USR1", prepare_lead_s=90,
                   comment="jobgate:j-1", hold=True).sbatch_args()
    for opt in ("--parsable", "--account=vision", "--partition=normal", "--nodes=2", "--gres=gpu:8", "--time=30",
                "--signal=B:USR1@90", "--comment=jobgate:j-1", "--requeue", "--hold"):
        assert opt in args


CLASSIFIED = [
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     ControllerDown),
    ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", ControllerDown),
    ("sacct: error: Problem talking to the database: Connection refused", AccountingDown),
    ("scancel: error: Kill job error on job id 2: Access/permission denied", PermissionDenied),
    ("Invalid user id for job 12\nslurm_suspend error: Invalid user id", PermissionDenied),
    ("scontrol: error: slurm_fetch_token: error with request: Access/permission denied", PermissionDenied),
    ("scancel: error: Kill job error on job id 99999: Invalid job id specified", JobNotFound),
    ("Job is pending execution for job 18", JobStateConflict),
    ("scancel: error: Kill job error on job id 18: Job can not be altered now, try again later", JobStateConflict),
    ("Job is in held state, pending scheduler release for job 16", JobStateConflict),
    ("scancel: error: Kill job error on job id 20: Job/step already completing or completed", JobStateConflict),
    ("scancel: error: No active jobs match ALL job filters, including: state=RUNNING", JobStateConflict),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     InvalidRequest),
    ("sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: "
     "Invalid partition name specified", InvalidRequest),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", InvalidRequest),
    ("sbatch: error: Invalid generic resource (gres) specification", InvalidRequest),
    ("sbatch: error: Batch job submission failed: Node count specification invalid", InvalidRequest),
    ("sbatch: error: something new\nsecond line", SlurmCommandFailed),
]


@pytest.mark.parametrize(("text", "kind"), CLASSIFIED, ids=[k.__name__ + str(i) for i, (_, k) in enumerate(CLASSIFIED)])
def test_what_slurm_printed_names_one_error_in_one_line(text, kind):
    err = classify("scancel -v 2", "alice", text, 1)
    assert type(err) is kind
    assert "\n" not in str(err) and str(err).startswith("scancel -v 2 as alice: ")


def test_a_jwt_is_signed_with_the_key_for_the_user():
    key = bytes(range(32))
    token = mint_token(key, "jobgate", now=1_800_000_000, lifetime_s=600)
    header, claims, signature = token.split(".")

    def unb64(s: str) -> bytes:
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))

    assert json.loads(unb64(header)) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(unb64(claims)) == {"exp": 1_800_000_600, "iat": 1_800_000_000, "sun": "jobgate"}
    assert unb64(signature) == hmac.new(key, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    with pytest.raises(SlurmConfigError):
        mint_token(b"short", "jobgate", now=0, lifetime_s=600)


def test_a_client_that_could_never_run_says_so_at_construction(tmp_path: Path):
    with pytest.raises(SlurmConfigError, match=r"no slurm\.conf"):
        CommandRunner(SlurmConnection(tmp_path / "slurm.conf"))
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    with pytest.raises(SlurmConfigError, match="no Unix user"):
        CommandRunner(SlurmConnection(tmp_path / "slurm.conf", user="no-such-user-here"))
