"""A typed client for Slurm 22.05, the adapter-to-be behind the execution port on a Slurm cluster.

Self-contained: it imports nothing from the rest of gateway/. `SlurmClient` drives the commands
(sbatch, scancel, scontrol, squeue, sacct) as jobgate's service user; `SlurmRestReader` reads through
slurmrestd with a JWT it signs. Both return frozen records (records.py) and raise only SlurmError
subclasses (errors.py). deploy/slurm/ starts a cluster to use them on.
"""

from gateway.execution.slurm.client import SlurmClient
from gateway.execution.slurm.connection import SlurmConnection
from gateway.execution.slurm.errors import (
    AccountingDown,
    ClientMissing,
    ControllerDown,
    InvalidRequest,
    JobNotFound,
    JobStateConflict,
    PermissionDenied,
    RestDown,
    SlurmBadOutput,
    SlurmCommandFailed,
    SlurmConfigError,
    SlurmError,
    SlurmRefused,
    SlurmTimeout,
    SlurmUnavailable,
)
from gateway.execution.slurm.records import AccountedJob, ExitStatus, JobSpec, QueuedJob, SlurmJobId, StartEstimate
from gateway.execution.slurm.rest import SlurmRestReader

__all__ = [
    "AccountedJob",
    "AccountingDown",
    "ClientMissing",
    "ControllerDown",
    "ExitStatus",
    "InvalidRequest",
    "JobNotFound",
    "JobSpec",
    "JobStateConflict",
    "PermissionDenied",
    "QueuedJob",
    "RestDown",
    "SlurmBadOutput",
    "SlurmClient",
    "SlurmCommandFailed",
    "SlurmConfigError",
    "SlurmConnection",
    "SlurmError",
    "SlurmJobId",
    "SlurmRefused",
    "SlurmRestReader",
    "SlurmTimeout",
    "SlurmUnavailable",
    "StartEstimate",
]
