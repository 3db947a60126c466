"""Q3 weighted fair share in the normal queue: tenants that used less of their share get more points."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from scheduler_builders import NOW, admitted, job, node, snap

from scheduler.cycle import run_cycle
from scheduler.model import ProjectId, Quotas, SchedulerConfig, Snapshot, TenantQuota
from scheduler.priority import fair_share_points

V, S = ProjectId("vision"), ProjectId("speech")


def with_usage(s: Snapshot, **usage: float) -> Snapshot:
    decayed = MappingProxyType({ProjectId(k): v for k, v in usage.items()})
    return Snapshot(s.nodes, s.pending, s.running, s.quotas, decayed)


@pytest.mark.parametrize(("usage", "quotas", "expected"), [
    ({}, None, {V: 100.0, S: 100.0}),
    ({"vision": 10.0, "speech": 10.0}, None, {V: 50.0, S: 50.0}),
    ({"vision": 30.0, "speech": 10.0}, None, {V: 100 * 2 ** -1.5, S: 100 * 2 ** -0.5}),
    ({"vision": 30.0, "speech": 10.0}, Quotas(tenants={V: TenantQuota(24), S: TenantQuota(8)}),
     {V: 100 * 2 ** -1.0, S: 100 * 2 ** -1.0}),
], ids=["no-usage", "equal", "vision-used-more", "weighted-by-quota"])
def test_points(usage: dict[str, float], quotas: Quotas | None, expected: dict[ProjectId, float]) -> None:
    s = with_usage(snap([node("a")], [job("v").gpus(1), job("s", project="speech").gpus(1)], quotas=quotas), **usage)
    points = fair_share_points(s)
    assert {k: pytest.approx(v) for k, v in points.items()} == expected


def test_the_tenant_that_used_less_goes_first_in_normal_but_not_in_batch() -> None:
    """Q2: the normal queue is ordered by weighted fair share; the batch queue is not."""
    pending = [job("v").gpus(8), job("s", project="speech").gpus(8).waited(0.01)]
    s = with_usage(snap([node("a")], pending), vision=1.0, speech=100.0)
    assert list(admitted(run_cycle(s, now=NOW))) == ["v"]
    batch = [job("v").gpus(8).queue("batch"), job("s", project="speech").gpus(8).queue("batch").waited(0.01)]
    s = with_usage(snap([node("a")], batch), vision=1.0, speech=100.0)
    assert list(admitted(run_cycle(s, now=NOW))) == ["s"]  # no fair share in batch: the older job first
    off = SchedulerConfig(fairshare_weight=0)
    s = with_usage(snap([node("a")], pending), vision=1.0, speech=100.0)
    assert list(admitted(run_cycle(s, now=NOW, config=off))) == ["s"]
