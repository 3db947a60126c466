"""A part of Slurm stops answering: every call of the client says which, in one line, and nothing a
running job had is lost. Each test brings the cluster back with the starter (it starts what is missing)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from slurm_testkit import SLEEPS, wait_for

from gateway.execution.slurm import (
    AccountingDown,
    ControllerDown,
    JobSpec,
    SlurmError,
    SlurmRestReader,
    SlurmTimeout,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def _raised(call: Callable[[], object]) -> SlurmError | None:
    try:
        call()
    except SlurmError as e:
        return e
    return None


def test_controller_down_is_controller_down_for_every_call_and_the_job_survives(slurm):
    client = slurm.client()
    spec = JobSpec(script=SLEEPS, account="vision", partition="normal", workdir=str(slurm.workdir))
    jid = client.submit(spec)
    wait_for(lambda: (j := client.job(jid)) is not None and j.state == "RUNNING", 30, "the job to run")
    rest = SlurmRestReader(slurm.connection())
    impatient = slurm.client(timeout_s=1.0)

    slurm.stop_daemon("slurmctld")
    try:
        # Slurm's clients retry an absent controller for MessageTimeout - 1 s (9 s here): ask all at once.
        calls: dict[str, Callable[[], object]] = {
            "sbatch": lambda: client.submit(spec),
            "squeue --json": client.jobs,  # exits 0: the outage is only in the document's errors
            "squeue --start": client.start_estimates,
            "scancel": lambda: client.cancel(jid),
            "scancel --signal --batch": lambda: client.signal_batch(jid, "TERM"),
            "scontrol requeue": lambda: client.requeue(jid),  # says only "Unexpected message received"
            "scontrol update": lambda: client.set_priority(jid, 10),
            "slurmrestd": rest.jobs,
        }
        with ThreadPoolExecutor(max_workers=len(calls) + 1) as pool:
            timeout = pool.submit(_raised, impatient.jobs)
            errors = dict(zip(calls, pool.map(_raised, calls.values()), strict=True))
        for name, err in errors.items():
            assert isinstance(err, ControllerDown), f"{name}: {err!r}"
            assert "\n" not in str(err)
        assert isinstance(timeout.result(), SlurmTimeout)
    finally:
        rest.close()
        slurm.up()

    # slurmd kept the job running; the controller took it back from its saved state.
    job = client.job(jid)
    assert job is not None and job.state == "RUNNING"


def test_accounting_down_is_accounting_down_and_the_controller_still_answers(slurm):
    client = slurm.client()
    slurm.stop_daemon("slurmdbd")
    try:
        err = _raised(lambda: client.accounting([1]))
        assert isinstance(err, AccountingDown) and "\n" not in str(err)
        with SlurmRestReader(replace(slurm.connection())) as rest:
            assert isinstance(_raised(lambda: rest.accounting(1)), SlurmError)
        client.jobs()  # slurmctld answers without slurmdbd
    finally:
        slurm.up()
    assert client.accounting([1]) is not None
