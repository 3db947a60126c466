"""Q1 admission pre-check: refuse at submission a job that could never be placed, instead of after
hours in the queue. Quota checks (Q4) will join here as more problems in the same list."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.reasons import gang


def precheck(gpus_per_node: int, nodes: int, cluster: Sequence[int]) -> list[str]:
    """Problems that make this gang shape impossible on a cluster with these per-node GPU counts.

    `cluster` lists every registered node's GPU count, lost nodes included (they are expected back).
    An empty list means the shape can run. Raises nothing.
    """
    problems: list[str] = []
    if gpus_per_node < 1:
        problems.append(f"asks for {gpus_per_node} GPUs per node; a job needs at least 1")
    if nodes < 1:
        problems.append(f"asks for {nodes} nodes; a job needs at least 1")
    if problems:
        return problems
    if not cluster:
        problems.append("the cluster has no nodes registered yet")
        return problems
    largest = max(cluster)
    if gpus_per_node > largest:
        problems.append(f"asks for {gpus_per_node} GPUs per node, but the largest node has {largest}")
        return problems
    big_enough = sum(1 for g in cluster if g >= gpus_per_node)
    if nodes > big_enough:
        problems.append(f"{gang(nodes, gpus_per_node, free=False)}, but the cluster has only "
                        f"{big_enough} such node{'' if big_enough == 1 else 's'}")
    return problems
