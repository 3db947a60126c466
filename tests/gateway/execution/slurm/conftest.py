"""The real Slurm cluster these tests run against: started once per session with deploy/slurm/up.

It skips when Slurm cannot be had here (not root, not Debian, no MariaDB, the starter failed),
unless JOBGATE_REQUIRE_SLURM=1 (CI), which turns each of those into a failure.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from slurm_testkit import LocalCluster, StarterFailed, no_slurm_here, start_cluster, stop_cluster_dir, why_no_slurm

NODES = 4


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """A 4-node x 8-GPU cluster with every node idle; stopped and deleted at the end of the session.

    Its facts: `slurm_conf` (SLURM_CONF), `rest_url`, `jwt_key` (the HS256 key path), `service_user`."""
    reason = why_no_slurm()
    if reason:
        no_slurm_here(reason)
    try:
        cluster, seconds = start_cluster(NODES)
    except StarterFailed as e:
        no_slurm_here(str(e))
    print(f"\nSlurm cluster {cluster.cluster} up in {seconds:.1f} s ({cluster.dir})", file=sys.stderr)
    try:
        yield cluster
    finally:
        stop_cluster_dir(cluster.env)


@pytest.fixture
def slurm(slurm_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The session's cluster, emptied of jobs after the test (whatever it left running)."""
    yield slurm_cluster
    slurm_cluster.cancel_everything()
