"""A what-if replays the candidate set it names (report.candidate_hash), even when the candidate directory is
edited while the replay runs: the set was loaded (and hashed) first, then loaded again from disk to decide, after
the ledger had been read, so an edit landing meanwhile was replayed under the first version's hash."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.decisions.policy.engine import RoleBinding
from gateway.decisions.policy.loader import load_policy_set
from gateway.decisions.policy.testing import expand_input
from gateway.decisions.policy.whatif import Recorded, replay
from gateway.settings import REPO_POLICIES


def own_stop() -> Recorded:
    doc = expand_input({"action": "job.stop", "actor": "alice", "reason": "done", "targets": [{"creator": "alice"}]})
    return Recorded(seq=1, time="2026-11-29T10:00:00.000000Z", input=doc, effect="allow", approvals=0,
                    rules=("A4.owner",))


@pytest.mark.parametrize("workers", [1, 2], ids=["serial", "pool"])
def test_an_edit_during_the_replay_is_not_replayed_under_the_named_hash(tmp_path: Path, workers: int) -> None:
    candidate = tmp_path / "candidate"
    shutil.copytree(REPO_POLICIES, candidate)
    named = load_policy_set(candidate).hash

    def records() -> Iterator[Recorded]:
        yield own_stop()
        # The reviewer saves another edit while the ledger is still being read.
        matrix = candidate / "matrix.csv"
        matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))
        yield from [own_stop() for _ in range(1000)]

    report = replay(candidate, records(), [RoleBinding("alice", "researcher", "vision")], bindings_source="test",
                    workers=workers)
    assert report.candidate_hash == named
    assert report.flips == [], report.counts()
