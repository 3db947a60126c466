"""How a job's first process comes to be: its environment, and the exec chain that confines it (H1).

With isolation the agent (root) forks, the child becomes a new session (subprocess, in C) and execs

    /bin/sh -c '<enter cgroup>' ... → setpriv --reuid=U --regid=G --clear-groups --no-new-privs -- ARGV

so the job is in its cgroup before any of its own code runs, and holds no privilege, supplementary group or
way back up (no_new_privs: setuid binaries do not raise it) when it does. No Python runs between fork and exec:
a `preexec_fn` in a process with threads can deadlock. The job's environment is built from nothing: it never
inherits the agent's (which may name the agent's token, state or gateway).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from nodeagent.errors import ConfigError
from nodeagent.identity import JobIdentity

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Locale and time zone are the node's, not secrets; nothing else of the agent's environment reaches a job.
PASSED_THROUGH = ("LANG", "LC_ALL", "TZ")
# Exit status of the chain when the job could not enter its cgroup (125: as `env` and `timeout` use it).
CGROUP_ENTRY_FAILED = 125
_ENTER_CGROUP = (
    f'echo $$ > "$1" || {{ echo "jobgate: cannot enter cgroup $1" >&2; exit {CGROUP_ENTRY_FAILED}; }}; shift; exec "$@"'
)


def find_setpriv() -> str:
    """setpriv(1) from util-linux, looked up in the standard directories only. Raises ConfigError if absent."""
    found = shutil.which("setpriv", path=STANDARD_PATH)
    if found is None:
        raise ConfigError("setpriv (util-linux) is not installed; it drops a job to its own uid")
    return found


def job_environment(
    job_env: Mapping[str, str],
    *,
    job_id: str,
    job_dir: Path,
    gpus: Sequence[int],
    identity: JobIdentity | None,
    agent_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The job's whole environment: a clean base, the job's own variables, then jobgate's (set last, so a job's
    env cannot point it at GPUs or checkpoint paths it was not given). Without isolation (`identity` None) the
    job runs as the agent's user anyway, and keeps that user's PATH."""
    agent_env = os.environ if agent_env is None else agent_env
    env = {k: agent_env[k] for k in PASSED_THROUGH if k in agent_env}
    env["PATH"] = agent_env.get("PATH", STANDARD_PATH) if identity is None else STANDARD_PATH
    env["HOME"] = identity.home if identity is not None and identity.home else str(job_dir)
    if identity is not None and identity.account:
        env["USER"] = env["LOGNAME"] = identity.account
    env.update({str(k): str(v) for k, v in job_env.items()})
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "JOBGATE_JOB_ID": job_id,
        "JOBGATE_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
        "JOBGATE_CHECKPOINT_DONE": str(job_dir / "checkpoint.done"),
    })
    return env


def exec_chain(argv: Sequence[str], identity: JobIdentity | None, cgroup: Path | None, setpriv: str | None
               ) -> list[str]:
    """The argv to spawn: `argv` itself without isolation, else wrapped to enter `cgroup` and drop to `identity`."""
    if identity is None:
        return list(argv)
    if setpriv is None:
        raise ConfigError("isolation needs setpriv")
    groups = ["--init-groups"] if identity.account else ["--clear-groups"]
    drop = [setpriv, f"--reuid={identity.uid}", f"--regid={identity.gid}", *groups, "--no-new-privs", "--",
            *argv]
    if cgroup is None:
        return drop
    return ["/bin/sh", "-c", _ENTER_CGROUP, "jobgate-spawn", str(cgroup / "cgroup.procs"), *drop]


def resolve_program(argv0: str, path: str) -> str | None:
    """Where argv[0] is found on the job's PATH (or itself, if it names a file); None if nowhere. The chain
    would otherwise only fail once exec'd, as an exit status rather than a refused spawn."""
    return shutil.which(argv0, path=path)
