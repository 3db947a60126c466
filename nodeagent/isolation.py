"""What separation of jobs this node can give (H1), found once at agent start.

    uid+cgroup  each job under an identity of its own (nodeagent/identity.py), in a cgroup of its own
    uid         the same without cgroup v2: a job's processes are found by its allocated uid
    none        jobs run as the agent's own user: a job could read the agent's token and act as the node.
                Only where the agent is not root (a laptop), and only when started with the switch
                --unsafe-jobs-share-agent-uid; the node then shows `isolation: none` to the gateway and to people.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from nodeagent.cgroups import CgroupTree
from nodeagent.errors import ConfigError
from nodeagent.identity import Identities
from nodeagent.spawn import find_setpriv

NONE = "none"


@dataclass(frozen=True)
class Isolation:
    identities: Identities
    setpriv: str
    cgroups: CgroupTree | None

    @property
    def mode(self) -> str:
        return "uid+cgroup" if self.cgroups is not None else "uid"


def detect(node: str, jobs_dir: Path, identities: Identities, cgroup_base: Path | None = None) -> Isolation:
    """The isolation this agent can give its jobs. Raises ConfigError saying why it can give none: not root,
    no setpriv, or a jobs directory that job uids cannot reach."""
    if os.geteuid() != 0:
        raise ConfigError("the agent is not root, so it cannot run jobs under identities of their own")
    setpriv = find_setpriv()
    reachable(jobs_dir)
    try:
        tree: CgroupTree | None = CgroupTree.open(node, cgroup_base)
    except ConfigError:
        if cgroup_base is not None:
            raise  # asked for by name: not having it is an error, not a fallback
        tree = None
    return Isolation(identities, setpriv, tree)


def reachable(jobs_dir: Path) -> None:
    """Job uids must be able to walk to their own directory (every ancestor searchable by others: o+x), but
    need not list any. Raises ConfigError naming the first ancestor that blocks them."""
    path = jobs_dir.resolve()
    for directory in [*reversed(path.parents), path]:
        try:
            mode = directory.stat().st_mode
        except FileNotFoundError:
            break  # created by the agent with the right mode
        except OSError as e:
            raise ConfigError(f"jobs directory {jobs_dir}: cannot read {directory}: {e.strerror}") from e
        if not mode & stat.S_IXOTH:
            raise ConfigError(
                f"jobs directory {jobs_dir} is not reachable by job uids: {directory} is mode "
                f"{stat.S_IMODE(mode):04o} (others need search permission, o+x); choose a work directory "
                "elsewhere, or chmod o+x that directory")
