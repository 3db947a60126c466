"""Process-group facts read from the kernel: liveness, members, zombie reaping, signal names.

Linux `/proc/<pid>/stat` (proc(5)) is used to tell zombies from live processes; on a node whose init
does not reap orphans, a killed group would otherwise look alive forever to `killpg(pgid, 0)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from nodeagent.errors import InvalidCommand

_PROC = Path("/proc")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat; None if the process is gone or /proc is unavailable."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    # comm may contain spaces and parentheses, so split after the *last* ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcStat(
            pid=pid, state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]), start_ticks=int(rest[19])
        )
    except (IndexError, ValueError):
        return None


def environ_has(pid: int, name: str, value: str) -> bool:
    """True if process `pid` was exec'd with `name=value` in its environment (/proc/<pid>/environ)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in raw.split(b"\0")


def group_members(pgid: int) -> list[ProcStat]:
    """Every process (zombies included) whose process group is `pgid`."""
    members = []
    with contextlib.suppress(FileNotFoundError), os.scandir(_PROC) as entries:
        for entry in entries:
            if entry.name.isdigit():
                stat = read_stat(int(entry.name))
                if stat is not None and stat.pgrp == pgid:
                    members.append(stat)
    return members


def reap_group_zombies(pgids: set[int]) -> None:
    """Reap zombies of these groups that were re-parented to us (we are a subreaper).

    Group leaders are skipped: each is a Popen child whose waiter thread reaps it and needs its status.
    Processes outside our job groups are never touched, so no other code's children lose their status.
    """
    if not pgids or not _PROC.is_dir():
        return
    me = os.getpid()
    with contextlib.suppress(FileNotFoundError), os.scandir(_PROC) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            stat = read_stat(int(entry.name))
            if (
                stat is not None
                and stat.state == "Z"
                and stat.ppid == me
                and stat.pgrp in pgids
                and stat.pid != stat.pgrp
            ):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(stat.pid, os.WNOHANG)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of the group exists.

    `killpg(pgid, 0)` is the authority; only when it succeeds do we look closer, because zombies
    (dead, waiting for a parent that may never reap them) still count as group members to the kernel.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _PROC.is_dir():
        return True
    return any(m.state != "Z" for m in group_members(pgid))


def own_children() -> set[int]:
    """Pids of this process's children, from each of its threads' list (/proc/self/task/*/children)."""
    pids: set[int] = set()
    with contextlib.suppress(FileNotFoundError), os.scandir(_PROC / "self" / "task") as tasks:
        for task in tasks:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in Path(task.path, "children").read_text().split())
    return pids


def strays(job_id: str, leaders: set[int]) -> list[ProcStat]:
    """Live processes of job `job_id` outside its process group, once its leader is gone: one that left the
    group (setsid, setpgid) was re-parented to us, the subreaper, and says in its environment whose it is.
    `leaders` are the leaders of the other jobs we started, which are our children too."""
    found = []
    for pid in sorted(own_children() - leaders):
        stat = read_stat(pid)
        if stat is not None and stat.state != "Z" and environ_has(pid, "JOBGATE_JOB_ID", job_id):
            found.append(stat)
    return found


def reap_orphans(leaders: set[int]) -> None:
    """Reap our zombie children other than `leaders` (the job leaders, whose waiter threads reap them and need
    their status): processes a job started in another session that were re-parented to us, the subreaper."""
    for pid in own_children() - leaders:
        stat = read_stat(pid)
        if stat is not None and stat.state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def reap(pid: int) -> bool:
    """Collect the exit status of our child `pid` if it has ended; True once it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not (or no longer) ours to wait for: someone reaped it
    return done == pid


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` (0: just probe) to the group; False if nothing was there to receive it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed its credentials (setuid helper); the group is there but not ours to signal.
        return True
    return True


def become_subreaper() -> bool:
    """Ask Linux to re-parent our orphaned grandchildren to us so we can reap them (prctl(2))."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def boot_id() -> str | None:
    """Identity of the current boot, so pids recorded before a reboot are never trusted after it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def parse_signal(name: str) -> signal.Signals:
    """Accept "SIGUSR1", "USR1" or "10"; raises InvalidCommand for anything else."""
    text = str(name).strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError as e:
            raise InvalidCommand("invalid", f"unknown signal {name!r}") from e
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        sig = signal.Signals[text]
    except KeyError as e:
        raise InvalidCommand("invalid", f"unknown signal {name!r}") from e
    if sig == signal.SIGSTOP:
        # A stopped group would sit out the whole window and then die; never what the sender meant.
        raise InvalidCommand("invalid", "SIGSTOP cannot be a prepare signal")
    return sig


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
