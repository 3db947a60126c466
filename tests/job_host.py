"""What a job needs from the test host when agents run it under a uid of its own (H1, CI runs as root).

A job's uid is no user of this machine: it can run neither the test interpreter (under /root, mode 0700) nor
walk into pytest's temporary directories (0700) unless they are made searchable.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from nodeagent.spawn import STANDARD_PATH

# The node's own interpreter, as a job finds it on its standard PATH.
JOB_PYTHON = shutil.which("python3", path=STANDARD_PATH) or sys.executable


def searchable_by_jobs(path: Path) -> None:
    """Give others search permission (o+x, not read) on `path` and each ancestor: a job may then reach its own
    directory below, but list none of them."""
    if os.geteuid() != 0:
        return  # agents that are not root run jobs as the test's own user: nothing to open
    for directory in [*reversed(path.resolve().parents), path.resolve()]:
        st = directory.stat()
        if not st.st_mode & stat.S_IXOTH and st.st_uid == 0:
            os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
