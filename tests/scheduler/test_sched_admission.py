"""Q1: impossible shapes are refused at submission, with a sentence saying why."""

from __future__ import annotations

import pytest

from scheduler.admission import precheck

CASES = [
    ("fits", 8, 2, [8, 8, 4], []),
    ("one small GPU on a big node", 1, 1, [8], []),
    ("more GPUs per node than any node", 16, 1, [8, 8], ["asks for 16 GPUs per node, but the largest node has 8"]),
    ("more nodes than exist with that many GPUs", 8, 3, [8, 8, 4, 4],
     ["needs 3 nodes with 8 GPUs each, but the cluster has only 2 such nodes"]),
    ("one such node", 8, 2, [8, 4], ["needs 2 nodes with 8 GPUs each, but the cluster has only 1 such node"]),
    ("zero GPUs", 0, 1, [8], ["asks for 0 GPUs per node; a job needs at least 1"]),
    ("zero nodes and zero GPUs", 0, 0, [8],
     ["asks for 0 GPUs per node; a job needs at least 1", "asks for 0 nodes; a job needs at least 1"]),
    ("empty cluster", 1, 1, [], ["the cluster has no nodes registered yet"]),
]


@pytest.mark.parametrize(("gpus", "nodes", "cluster", "problems"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_precheck(gpus: int, nodes: int, cluster: list[int], problems: list[str]) -> None:
    assert precheck(gpus, nodes, cluster) == problems
