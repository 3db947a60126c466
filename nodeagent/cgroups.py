"""One cgroup v2 per job (cgroups(7), Documentation/admin-guide/cgroup-v2.rst): the kernel's own list of the
job's processes, whatever sessions or process groups they moved to.

The agent keeps a subtree of its own, `<its cgroup>/jobgate-<node>/`, with one child per job. A job enters its
cgroup before any of its code runs (the spawn chain in `nodeagent/spawn.py` writes itself into `cgroup.procs`,
then drops to the job's uid), so nothing it forks can start outside it. Stopping reads `cgroup.procs`, killing
writes `cgroup.kill` (Linux 5.14; older kernels get SIGKILL per member until the cgroup is empty), and "gone"
is `populated 0` in `cgroup.events`. No controller is enabled: the tree is for finding and killing, not for
limits, so the "no internal processes" rule never applies to it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from nodeagent.errors import ConfigError

_MOUNTINFO = Path("/proc/self/mountinfo")
_OWN_CGROUP = Path("/proc/self/cgroup")
_KILL_POLL_SECONDS = 0.01


def cgroup2_mount(mountinfo: Path = _MOUNTINFO) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
    host), from proc(5) mountinfo; None if there is none."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(fields[4])
    return None


def own_cgroup(path: Path = _OWN_CGROUP) -> str | None:
    """This process's cgroup v2 path (the `0::` line of /proc/self/cgroup), e.g. `/` or `/system.slice/x`."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        return None
    return None


class CgroupTree:
    """The agent's subtree of cgroup v2 directories, one per job. Methods raise OSError only where they say."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, node: str, base: Path | None = None) -> CgroupTree:
        """The subtree `jobgate-<node>` under `base` (default: this process's own cgroup), created if missing.

        Raises ConfigError when there is no writable cgroup v2 hierarchy here."""
        if base is None:
            mount, mine = cgroup2_mount(), own_cgroup()
            if mount is None or mine is None:
                raise ConfigError("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)")
            base = mount / mine.lstrip("/")
        root = base / f"jobgate-{node}"
        try:
            root.mkdir(mode=0o755, exist_ok=True)
            probe = root / ".probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as e:
            raise ConfigError(f"cannot create cgroups under {base}: {e.strerror}") from e
        return cls(root)

    def path_of(self, name: str) -> Path:
        return self.root / name

    def create(self, name: str) -> Path:
        """A fresh, empty cgroup for one run of a job. One left from an earlier run must be empty (it is then
        reused); a populated one is refused. Raises OSError."""
        path = self.path_of(name)
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            if populated(path):
                raise OSError(errno.EBUSY, f"cgroup {path} still has processes") from None
        return path

    def children(self) -> list[str]:
        """Names of the job cgroups present (left by this agent or an earlier one)."""
        with contextlib.suppress(OSError):
            return sorted(e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False))
        return []


def procs(path: Path) -> list[int]:
    """Pids in the cgroup (none if it is gone)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def populated(path: Path) -> bool:
    """Whether any live process is in the cgroup or below it (zombies no longer count)."""
    try:
        for line in (path / "cgroup.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
    except OSError:
        return False
    return bool(procs(path))


def signal_all(path: Path, sig: int) -> int:
    """Send `sig` to every process in the cgroup; returns how many received it."""
    sent = 0
    for pid in procs(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            sent += 1
    return sent


def kill(path: Path, timeout: float = 5.0) -> bool:
    """SIGKILL everything in the cgroup, including what forks meanwhile; True once it is empty."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        # Before Linux 5.14 there is no cgroup.kill: kill member by member until none is left.
        deadline = time.monotonic() + timeout
        while populated(path) and time.monotonic() < deadline:
            signal_all(path, signal.SIGKILL)
            time.sleep(_KILL_POLL_SECONDS)
    deadline = time.monotonic() + timeout
    pause = 0.001  # a killed process is gone within a millisecond or two: look again soon, then less often
    while populated(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, _KILL_POLL_SECONDS)
    return True


def remove(path: Path) -> None:
    """Remove an empty job cgroup; one that is not empty (or already gone) is left as it is."""
    with contextlib.suppress(OSError):
        path.rmdir()
