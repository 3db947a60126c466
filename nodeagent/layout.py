"""Where a node agent keeps what: its work directory, seen by the agent, by jobs and by whoever deploys it.

    <work_dir>/          0711: job uids pass through to their own directory; they list nothing
    <work_dir>/state/    0700, the agent's alone: token, nonces.json, processes.json, outbox.jsonl, agent.log
    <work_dir>/jobs/     one directory per job (nodeagent/jobdir.py)
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_FILES = ("nonces.json", "processes.json", "outbox.jsonl", "outbox.rejected.jsonl", "token", "agent.log")


def private_state_dir(work_dir: Path) -> Path:
    """`<work_dir>/state`, created 0700 and kept so: the agent's token and records, which no job may read or
    write (a job that could would act as the node, or undo the replay protection). Files an older agent kept at
    the top of the work directory are moved in. Raises OSError."""
    work_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(work_dir, 0o711)  # job uids pass through to jobs/<id>; they list nothing
    state = work_dir / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    os.chmod(state, 0o700)
    for name in STATE_FILES:
        old = work_dir / name
        if old.exists() and not (state / name).exists():
            os.replace(old, state / name)
    return state
