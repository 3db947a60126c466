"""Every way a Slurm call can fail, as one hierarchy rooted at SlurmError.

The client translates a command's exit status, its stderr, a timeout, an HTTP error or unreadable
JSON into exactly one of these where it happens, so a caller never sees a CalledProcessError,
json.JSONDecodeError or httpx error. str() of each is one line naming the command, the Unix user it
ran as and Slurm's own words.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)  # exceptions compare and hash by identity
class SlurmError(Exception):
    """Root of the Slurm client's errors.

    `command` is what was asked ("scancel 42", "GET /slurm/v0.0.38/jobs"), `user` the Unix or Slurm
    user it ran as, `detail` Slurm's own message (first meaningful line) or ours."""

    command: str
    detail: str
    user: str | None = None

    summary = "Slurm call failed"

    def __str__(self) -> str:
        who = f" as {self.user}" if self.user else ""
        detail = " ".join(self.detail.split())
        return f"{self.command}{who}: {self.summary}: {detail}" if detail else f"{self.command}{who}: {self.summary}"

    def diagnostics(self) -> str:
        return str(self)


class SlurmConfigError(SlurmError):
    """The client cannot run at all as configured (no slurm.conf, cannot act as the service user)."""

    summary = "Slurm client misconfigured"


# --- Slurm (or a part of it) did not answer: nothing was done, trying again later may work.


class SlurmUnavailable(SlurmError):
    """A part of Slurm did not answer; the request was not carried out."""

    summary = "Slurm unavailable"


class ControllerDown(SlurmUnavailable):
    """slurmctld does not answer (stopped, unreachable, or refusing connections)."""

    summary = "the Slurm controller does not answer"


class AccountingDown(SlurmUnavailable):
    """slurmdbd (or its database) does not answer: no accounting records can be read."""

    summary = "Slurm accounting (slurmdbd) does not answer"


class RestDown(SlurmUnavailable):
    """slurmrestd does not answer."""

    summary = "slurmrestd does not answer"


class ClientMissing(SlurmUnavailable):
    """A Slurm client command (sbatch, squeue, ...) is not installed where the client looks."""

    summary = "Slurm client command not found"


@dataclass(eq=False)
class SlurmTimeout(SlurmError):
    """The call did not finish in time. For a mutation the outcome is unknown: read the job back."""

    timeout_s: float = 0.0

    summary = "no answer in time (outcome unknown)"

    def __str__(self) -> str:
        return f"{super().__str__()} after {self.timeout_s:g} s"


# --- Slurm answered and said no: trying again unchanged will not help.


class SlurmRefused(SlurmError):
    """Slurm answered and refused the request."""

    summary = "Slurm refused"


class PermissionDenied(SlurmRefused):
    """Slurm's own permission check said no (not the job's owner, not an Operator, bad token)."""

    summary = "Slurm denied permission"


class JobNotFound(SlurmRefused):
    """Slurm does not know the job id (never existed, or purged after MinJobAge)."""

    summary = "no such Slurm job"


class JobStateConflict(SlurmRefused):
    """The job is in a state that does not allow this (pending when it must run, held, finished)."""

    summary = "the job's state does not allow this"


class InvalidRequest(SlurmRefused):
    """The request itself is wrong for this cluster: unknown account, partition or GRES, impossible size."""

    summary = "Slurm rejected the request"


class SlurmCommandFailed(SlurmError):
    """A command failed in a way the client does not recognise; `detail` has Slurm's words."""

    summary = "Slurm command failed"


class SlurmBadOutput(SlurmError):
    """Slurm answered with something the client cannot read (not JSON, missing or mistyped fields)."""

    summary = "unreadable answer from Slurm"
