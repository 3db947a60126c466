"""Where a job's processes are, and how all of them get a signal (P4) or are killed (C3).

The strongest container the node allows is used, in this order:
1. its cgroup: the kernel's own member list; nothing the job forks can leave it;
2. its allocated uid: every process of that uid is the job's (no other job or person ever has it while it runs);
3. its process group, plus the strays that left it (`procgroup.strays`): the only choice without isolation,
   or for a person's own account on a node without cgroup v2, whose uid also runs that person's other work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from nodeagent import cgroups, procgroup

_PROC = Path("/proc")
_POLL_SECONDS = 0.02


@dataclass(frozen=True)
class Confinement:
    """A job run's container: `cgroup` (a path), else `uid` (allocated for this run), else only `pgid`."""

    pgid: int
    cgroup: str | None = None
    uid: int | None = None

    @property
    def kind(self) -> str:
        return "cgroup" if self.cgroup else "uid" if self.uid is not None else "process_group"

    def members(self) -> list[int]:
        """Live pids of the job as its container sees them (for the process group: the group's members)."""
        if self.cgroup:
            return cgroups.procs(Path(self.cgroup))
        if self.uid is not None:
            return processes_of(self.uid)
        return [m.pid for m in procgroup.group_members(self.pgid) if m.state != "Z"]

    def signal(self, sig: int) -> bool:
        """Send `sig` to every process of the job; False if none was there to receive it."""
        if self.cgroup:
            return cgroups.signal_all(Path(self.cgroup), sig) > 0
        sent = procgroup.signal_group(self.pgid, sig)
        if self.uid is not None:
            for pid in processes_of(self.uid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    sent = True
        return sent

    def alive(self) -> bool:
        """Whether any live (non-zombie) process of the job is left."""
        if self.cgroup:
            return cgroups.populated(Path(self.cgroup))
        if self.uid is not None:
            return bool(processes_of(self.uid)) or procgroup.group_alive(self.pgid)
        return procgroup.group_alive(self.pgid)

    def kill(self, timeout: float) -> bool:
        """SIGKILL the whole job; True once nothing of it is left alive. Zombies do not count: the leader's waiter
        and the runner's reaper collect them (a scan of /proc per stop here cost more than the stop itself)."""
        if self.cgroup:
            return cgroups.kill(Path(self.cgroup), timeout)
        deadline = time.monotonic() + timeout
        while True:
            self.signal(signal.SIGKILL)
            if not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)


def processes_of(uid: int) -> list[int]:
    """Live pids whose owner is `uid` (the owner of /proc/<pid> is the process's effective uid)."""
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(_PROC) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
            except OSError:
                continue
            stat = procgroup.read_stat(int(entry.name))
            if stat is not None and stat.state != "Z":
                found.append(stat.pid)
    return found
