"""Run one Slurm client command as the configured user, and say in one exception what went wrong.

Two things about Slurm 22.05's commands shape this module:
1. The exit status alone does not tell success: `scancel` exits 0 when the job id is unknown or the
   job already ended (it says so on stderr only with -v), and `squeue --json` exits 0 with the
   controller down (its document's `errors` say "Unspecified error"). So the text is classified too.
2. The same cause reads differently per command: a stopped controller is "Unable to contact slurm
   controller" for sbatch, squeue and scancel, but "Unexpected message received" for
   `scontrol requeue|hold`; someone else's job is "Access/permission denied" or "Invalid user id".
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.execution.slurm.connection import SlurmConnection
from gateway.execution.slurm.errors import (
    AccountingDown,
    ClientMissing,
    ControllerDown,
    InvalidRequest,
    JobNotFound,
    JobStateConflict,
    PermissionDenied,
    SlurmCommandFailed,
    SlurmConfigError,
    SlurmError,
    SlurmTimeout,
)

# (type, what Slurm says), first match wins. Controller and accounting outages come first: while
# slurmctld is down every other message is noise.
_PATTERNS: tuple[tuple[type[SlurmError], tuple[str, ...]], ...] = (
    (ControllerDown, ("unable to contact slurm controller", "zero bytes were transmitted or received",
                      "slurm_load_jobs error: socket timed out")),
    (AccountingDown, ("problem talking to the database", "slurm_persist_conn_open",
                      "slurmdbd: connection refused", "unable to connect to slurmdbd")),
    (PermissionDenied, ("access/permission denied", "invalid user id", "protocol authentication error",
                        "user not found", "only slurm admins", "requires operator")),
    (JobNotFound, ("invalid job id specified",)),
    (JobStateConflict, ("job is pending execution", "can not be altered now", "job is in held state",
                        "already completing or completed", "job has already finished", "job is not running",
                        "requested operation is presently disabled", "job is not pending",
                        "no active jobs match")),
    (InvalidRequest, ("invalid account", "invalid partition", "invalid generic resource", "invalid qos",
                      "requested node configuration is not available", "node count specification invalid",
                      "job violates accounting/qos policy", "requested time limit is invalid",
                      "more processors requested than permitted", "invalid --gres", "unrecognized option",
                      "invalid option", "invalid nice value", "invalid job priority")),
)


@dataclass(frozen=True)
class Finished:
    """A command that ran to its end (whatever its exit status)."""

    command: str
    returncode: int
    stdout: str
    stderr: str


def first_error_line(text: str) -> str:
    """Slurm's own message: the first 'error:' line without the command's prefix, else the first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        _, sep, rest = ln.partition("error:")
        if sep:
            return rest.strip()
    return lines[0] if lines else ""


def classify(command: str, user: str | None, text: str, returncode: int) -> SlurmError:
    """The one exception that says why `command` failed, from what it printed."""
    low = text.lower()
    for kind, needles in _PATTERNS:
        for needle in needles:
            if needle in low:
                return kind(command, _line_with(text, needle) or first_error_line(text), user)
    return SlurmCommandFailed(command, first_error_line(text) or f"exit status {returncode}", user)


def _line_with(text: str, needle: str) -> str:
    for ln in text.splitlines():
        if needle in ln.lower():
            _, sep, rest = ln.partition("error:")
            return (rest if sep else ln).strip()
    return ""


def short(argv: Sequence[str]) -> str:
    """The command as an error message names it: program and arguments, one line, at most 120 chars."""
    text = " ".join(a if a and not any(c.isspace() for c in a) else repr(a) for a in argv)
    return text if len(text) <= 120 else text[:117] + "..."


class CommandRunner:
    """Runs Slurm client commands for one connection: as its user, with its SLURM_CONF, within its timeout.

    Raises SlurmConfigError at construction when it could never run (no slurm.conf; a user other than
    this process's own without being root; a user that does not exist)."""

    def __init__(self, conn: SlurmConnection) -> None:
        self.conn = conn
        if not conn.slurm_conf.is_file():
            raise SlurmConfigError("slurm", f"no slurm.conf at {conn.slurm_conf}")
        me = pwd.getpwuid(os.geteuid()).pw_name
        self.user = conn.user or me
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError as e:
            raise SlurmConfigError("slurm", f"no Unix user {self.user!r}") from e
        self._switch = entry.pw_uid != os.geteuid()
        if self._switch and os.geteuid() != 0:
            raise SlurmConfigError("slurm", f"running as {me}, this process cannot run commands as {self.user}; "
                                            f"start it as {self.user} or leave the user unset")
        self._uid, self._gid = entry.pw_uid, entry.pw_gid
        self._found: dict[str, str] = {}
        self._env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(conn.slurm_conf),
            "USER": self.user,
            "LOGNAME": self.user,
            "HOME": entry.pw_dir if entry.pw_dir and entry.pw_dir != "/nonexistent" else "/tmp",
        }

    def executable(self, name: str) -> str:
        """The path of a Slurm client command. Raises ClientMissing."""
        found = self._found.get(name)
        if found is None:
            found = self._found[name] = self._look_up(name)
        return found

    def _look_up(self, name: str) -> str:
        if self.conn.bin_dir is not None:
            path = self.conn.bin_dir / name
            if os.access(path, os.X_OK):
                return str(path)
        else:
            found = shutil.which(name, path=self._env["PATH"])
            if found:
                return found
        where = self.conn.bin_dir or self._env["PATH"]
        raise ClientMissing(name, f"not found in {where} (apt-get install slurm-client)", self.user)

    def run(self, argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None,
            cwd: str = "/", timeout_s: float | None = None) -> Finished:
        """Run argv to its end and return what it printed, whatever its exit status.

        `env` is added to the command's small fixed environment (nothing of this process's own leaks in:
        with --export=ALL, sbatch hands its environment to the job). Raises ClientMissing, SlurmTimeout,
        SlurmConfigError (cannot start it as the user)."""
        command = short(argv)
        full = [self.executable(argv[0]), *argv[1:]]
        timeout = self.conn.timeout_s if timeout_s is None else timeout_s
        kwargs: dict[str, object] = {}
        if self._switch:
            kwargs = {"user": self._uid, "group": self._gid, "extra_groups": []}
        try:
            proc = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                                  env={**self._env, **(env or {})}, check=False, **kwargs)  # type: ignore[call-overload]
        except subprocess.TimeoutExpired as e:
            raise SlurmTimeout(command, "", self.user, timeout_s=timeout) from e
        except PermissionError as e:
            raise SlurmConfigError(command, f"cannot start as {self.user}: {e.strerror}", self.user) from e
        except OSError as e:
            raise ClientMissing(command, e.strerror or str(e), self.user) from e
        return Finished(command=command, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)

    def check(self, argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None,
              cwd: str = "/", timeout_s: float | None = None) -> Finished:
        """Run argv; a non-zero exit becomes its exception (see classify). Raises SlurmError."""
        done = self.run(argv, stdin=stdin, env=env, cwd=cwd, timeout_s=timeout_s)
        if done.returncode != 0:
            raise classify(done.command, self.user, done.stderr + "\n" + done.stdout, done.returncode)
        return done
