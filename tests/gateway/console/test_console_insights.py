"""The admin views computed from the DB: heat map, waits, fragmentation, suggestions (Q10, Q11)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from console_testkit import Console, ran, submit
from sqlalchemy import update

from gateway.jobs import insights
from gateway.store.models import Job, Node
from gateway.store.scheduler_tables import QuotaRow, SchedJob

pytestmark = pytest.mark.parametrize("console", ["sqlite", "postgresql"], indirect=True)


def test_heatmap_and_waits(console: Console) -> None:
    gw = console.gateway
    now = gw.clock()
    with gw.transaction() as session:
        session.execute(update(Node).values(state="alive"))
        session.add(QuotaRow(project="vision", gpus=4, borrow_limit=0, lend_limit=None, users={},
                             updated_at=now, updated_by="erin"))
    a = submit(console, gpus_per_node=4)
    b = submit(console, gpus_per_node=2)
    submit(console, gpus_per_node=1)  # still waiting
    ran(console, a, started_ago=timedelta(hours=1), waited=timedelta(seconds=30), node="demo-node-1",
        gpus=[0, 1, 2, 3])
    ran(console, b, started_ago=timedelta(minutes=30), waited=timedelta(hours=2), node="demo-node-2", gpus=[0, 1])
    with gw.transaction(immediate=False) as session:
        heat = insights.heatmap(session, now, days=3)
        waits = insights.waits(session, now)
        usage = insights.cluster_usage(session)
    vision = next(r for r in heat["rows"] if r["tenant"] == "vision")
    assert vision["measured_against"] == 4 and len(vision["cells"]) == 3 == len(heat["days"])
    today = vision["cells"][-1]
    hours_today = min(24.0, (now - now.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds() / 3600)
    expected = min(4 * 1.0, 4 * hours_today) + min(2 * 0.5, 2 * hours_today)  # GPU-hours since midnight
    assert today["gpu_hours"] == pytest.approx(expected, abs=0.01)
    assert today["utilisation"] == pytest.approx(expected / (4 * hours_today), abs=0.001)
    speech = next(r for r in heat["rows"] if r["tenant"] == "speech")
    assert speech["measured_against"] == 16 and all(c["gpu_hours"] == 0 for c in speech["cells"])
    normal = waits["queues"]["normal"]
    assert normal["started"] == 2 and normal["waiting_now"] == 1
    assert normal["buckets"]["≤1m"] == 1 and normal["buckets"]["≤6h"] == 1
    assert normal["max_s"] == pytest.approx(7200, abs=1)
    assert usage["in_use"] == 6 and usage["gpus"] == 16
    assert next(t for t in usage["tenants"] if t["tenant"] == "vision")["quota_gpus"] == 4


def test_usage_over_time_is_each_hours_average_per_tenant(console: Console) -> None:
    """The chart of GPUs in use hour by hour: a 4-GPU job that started 90 minutes ago filled the hour before this
    one half and this one wholly; one of speech's that ran 3 hours and ended half an hour ago, likewise."""
    gw = console.gateway
    a = submit(console, gpus_per_node=4)
    b = submit(console, who="mallory", project="speech", gpus_per_node=2)
    ran(console, a, started_ago=timedelta(minutes=90), waited=timedelta(0))
    ran(console, b, started_ago=timedelta(hours=3, minutes=30), waited=timedelta(0))
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == b).values(state="succeeded", ended_at=gw.clock()
                                                              - timedelta(minutes=30)))
    now = gw.clock()
    with gw.transaction(immediate=False) as session:
        use = insights.usage_over_time(session, now, hours=6)
    assert len(use["hours"]) == 6 and use["hours"][-1] == now.replace(minute=0, second=0, microsecond=0).isoformat()
    assert use["gpus"] == 16
    gpus = {t["tenant"]: t["gpus_in_use"] for t in use["tenants"]}
    since_the_hour = now.minute * 60 + now.second + now.microsecond / 1e6

    def share_of(hour: int, started_s: float, ended_s: float) -> float:
        """How much of hour `hour` (0 = this one) a run from `started_s` to `ended_s` seconds ago covered."""
        hi = since_the_hour + 3600 * (hour - 1) if hour else 0.0
        lo = since_the_hour + 3600 * hour
        length = lo - hi
        return max(0.0, min(lo, started_s) - max(hi, ended_s)) / length if length > 0 else 0.0

    for hour in range(6):
        assert gpus["vision"][5 - hour] == pytest.approx(4 * share_of(hour, 5400, 0), abs=0.01), hour
        assert gpus["speech"][5 - hour] == pytest.approx(2 * share_of(hour, 12600, 1800), abs=0.01), hour


def test_fragmentation(console: Console) -> None:
    gw = console.gateway
    with gw.transaction() as session:
        session.execute(update(Node).values(state="alive"))
    a, b = submit(console, gpus_per_node=6), submit(console, gpus_per_node=1)
    ran(console, a, started_ago=timedelta(minutes=5), waited=timedelta(0), node="demo-node-1",
        gpus=[0, 1, 2, 3, 4, 5])
    ran(console, b, started_ago=timedelta(minutes=5), waited=timedelta(0), node="demo-node-2", gpus=[0])
    with gw.transaction(immediate=False) as session:
        frag = insights.fragmentation(session)
    assert [n["free"] for n in frag["nodes"]] == [2, 7]
    assert frag["free_gpus"] == 9 and frag["largest_free_block"] == 7
    assert frag["fragmentation"] == pytest.approx(1 - 7 / 9, abs=1e-4)
    with gw.transaction() as session:
        session.execute(update(Node).where(Node.id == "demo-node-2").values(state="lost"))
        frag = insights.fragmentation(session)
    assert frag["free_gpus"] == 2 and frag["fragmentation"] == 0.0  # a lost node offers nothing


def test_suggestions_idle_quota_stale_reservation_starved_tenant(console: Console) -> None:
    gw = console.gateway
    now = gw.clock()
    with gw.transaction() as session:
        session.add(QuotaRow(project="speech", gpus=8, borrow_limit=0, lend_limit=None, users={},
                             updated_at=now, updated_by="erin"))
    with gw.transaction(immediate=False) as session:
        assert [s["kind"] for s in insights.suggestions(session, now)] == ["idle_quota"]
    stale = submit(console)
    with gw.transaction() as session:
        session.execute(update(SchedJob).where(SchedJob.job_id == stale).values(
            estimated_start=now - timedelta(minutes=20), blocked_reason="behind the reservation of j-x"))
        session.execute(update(Job).where(Job.id == stale).values(submitted_at=now - timedelta(hours=1)))
    with gw.transaction(immediate=False) as session:
        tips = insights.suggestions(session, now)
    kinds = {(t["kind"], t["tenant"]) for t in tips}
    assert kinds == {("idle_quota", "speech"), ("stale_reservation", "vision"), ("starved_tenant", "vision")}
    stale_tip = next(t for t in tips if t["kind"] == "stale_reservation")
    assert stale_tip["job_id"] == stale and "behind the reservation" in stale_tip["text"]
    # speech gets busy: no longer idle; vision runs something: no longer starved.
    other = submit(console, who="mallory", project="speech", gpus_per_node=4)
    running = submit(console, gpus_per_node=1)
    ran(console, other, started_ago=timedelta(minutes=1), waited=timedelta(0))
    ran(console, running, started_ago=timedelta(minutes=1), waited=timedelta(0))
    with gw.transaction(immediate=False) as session:
        assert [t["kind"] for t in insights.suggestions(session, now)] == ["stale_reservation"]
