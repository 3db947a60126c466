"""Where the cluster is and who the client acts as."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SlurmConnection:
    """How to reach one Slurm cluster.

    `slurm_conf` is the cluster's slurm.conf (the commands get it as SLURM_CONF). `user` is the Unix
    user the commands run as: jobgate's service user, Slurm's only Operator. None runs them as this
    process's own user (the gateway started as that user); any other user needs this process to be
    root. `timeout_s` bounds every command; Slurm's clients retry an absent controller for about
    MessageTimeout seconds before they give up, so keep it above that. `rest_url` and `jwt_key` (the
    HS256 key slurmctld verifies tokens with) are needed only for reads through slurmrestd."""

    slurm_conf: Path
    user: str | None = None
    timeout_s: float = 30.0
    bin_dir: Path | None = None
    rest_url: str | None = None
    jwt_key: Path | None = None
