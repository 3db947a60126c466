"""A job's directory on the node (`<work_dir>/jobs/<job id>/`): made for one run's identity, given back after.

    jobs/           0711, the agent's: job uids may walk through it to their own directory, never list it
    jobs/<id>/      0700, the run's uid: its checkpoints/, output.log, checkpoint.done
    jobs/<id>/...   given back to the agent when the run ends, if its uid was allocated for that run: the uid
                    is then handed to another job, which must not be able to read this one's checkpoints

Everything is done through directory descriptors without following symlinks (see nodeagent/evidence.py): the
agent acts as root inside a directory a job owned, so anything in it may be a trap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from nodeagent import evidence

_OPEN_LOG = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
Owner = tuple[int, int]


def make(job_dir: Path, owner: Owner | None) -> None:
    """Create the job's directory and its checkpoints/ (kept from an earlier run of the same job), owned by
    `owner` (uid, gid) with nobody else let in; without `owner`, as the agent's user. Raises OSError."""
    jobs = job_dir.parent
    jobs.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chmod(jobs, 0o711)
    job_dir.mkdir(mode=0o700, exist_ok=True)
    (job_dir / "checkpoints").mkdir(mode=0o700, exist_ok=True)
    if owner is not None:
        hand_over(job_dir, owner, only_uid=None)


def hand_over(job_dir: Path, owner: Owner, only_uid: int | None) -> None:
    """Make `owner` own the job directory and everything in it (only what `only_uid` owns, if given), each entry
    changed through its parent's descriptor; a symlink is changed itself, never what it points at."""
    with evidence.open_job_dir(job_dir) as job_fd:
        for entry in evidence.walk(job_fd):
            with contextlib.suppress(OSError):
                if only_uid is None or os.stat(entry.name, dir_fd=entry.dir_fd,
                                               follow_symlinks=False).st_uid == only_uid:
                    os.chown(entry.name, *owner, dir_fd=entry.dir_fd, follow_symlinks=False)
        if only_uid is None or os.fstat(job_fd).st_uid == only_uid:
            os.fchown(job_fd, *owner)
            os.fchmod(job_fd, 0o700)


def give_back(job_dir: Path, uid: int) -> None:
    """After a run under an allocated uid: what that uid owns in the job directory becomes the agent's."""
    with contextlib.suppress(OSError):
        hand_over(job_dir, (os.geteuid(), os.getegid()), only_uid=uid)


@contextlib.contextmanager
def open_log(job_dir: Path, owner: Owner | None) -> Iterator[IO[bytes]]:
    """The job's output.log opened for appending (the job's stdout and stderr), owned by `owner`.
    Raises OSError, also when output.log was replaced by a symlink or something that is not a file."""
    with evidence.open_job_dir(job_dir) as job_fd:
        fd = os.open("output.log", _OPEN_LOG, 0o600, dir_fd=job_fd)
    with os.fdopen(fd, "ab") as out:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{job_dir / 'output.log'} is not a regular file")
        if owner is not None:
            os.fchown(fd, *owner)
        yield out
