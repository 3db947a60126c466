"""Rule 5 of run_cycle (Q4, Q5): cluster, tenant and user tiers; borrowing within limits and lend caps;
owned/borrowed marking; Q1 hard-limit precheck."""

from __future__ import annotations

import pytest
from scheduler_builders import NOW, JobBuilder, admitted, job, node, reasons, running, snap

from scheduler.cycle import run_cycle
from scheduler.model import ProjectId, Quotas, RunningJob, TenantQuota
from scheduler.quota import hard_limit_problems

V, S = ProjectId("vision"), ProjectId("speech")
NODES = [node("a"), node("b"), node("c"), node("d")]  # 32 GPUs


def quotas(**kw: object) -> Quotas:
    base: dict[str, object] = {"tenants": {V: TenantQuota(8, borrow_limit=8), S: TenantQuota(16, borrow_limit=0)}}
    base.update(kw)
    return Quotas(**base)  # type: ignore[arg-type]


CASES: list[tuple[str, list[JobBuilder], list[RunningJob], Quotas, dict[str, bool], dict[str, str]]] = [
    ("within owned quota: owned", [job("v1").gpus(8)], [], quotas(), {"v1": False}, {}),
    ("beyond owned quota, idle quota elsewhere: borrowed", [job("v1").gpus(8), job("v2").gpus(8).waited(0.1)], [],
     quotas(), {"v2": False, "v1": True}, {}),
    ("borrow limit reached: waits on the tenant tier",
     [job("v3").gpus(4)], [running("r1", {"a": range(8)}), running("r2", {"b": range(8)}, borrowed=True)],
     quotas(), {}, {"v3": "tenant quota of vision"}),
    ("borrowing disabled for speech", [job("s1", project="speech").gpus(8)],
     [running("r1", {"a": range(8)}, project="speech"), running("r2", {"b": range(8)}, project="speech")],
     quotas(), {}, {"s1": "tenant quota of speech"}),
    ("lender caps lending: only 4 of speech's idle 16", [job("v1").gpus(8), job("v2").gpus(8).waited(0.1)], [],
     quotas(tenants={V: TenantQuota(8, borrow_limit=None), S: TenantQuota(24, lend_limit=4)}),
     {"v2": False}, {"v1": "only 4 idle GPUs"}),
    ("a job that cannot be stopped runs on owned quota", [job("v1").gpus(8).not_stoppable()], [], quotas(),
     {"v1": False}, {}),
    ("a job that cannot be stopped never borrows: no reclaim could take the GPUs back",
     [job("v1").gpus(8).not_stoppable(), job("v2").gpus(8).waited(0.1)], [], quotas(),
     {"v2": False}, {"v1": "cannot be stopped runs only on its tenant's own quota"}),
    ("a job that cannot be stopped, past its tenant's whole quota (lowered since), is told it cannot run",
     [job("v1").gpus(4).nodes(3).not_stoppable()], [], quotas(), {},
     {"v1": "more than the tenant owns: it cannot run unless the quota grows"}),
    ("user quota", [job("v1", user="bob").gpus(4)], [running("r1", {"a": range(4)}, user="bob")],
     quotas(users={"bob": 6}), {}, {"v1": "user quota of bob"}),
    ("cluster hard cap below capacity", [job("v1").gpus(8)], [running("r1", {"a": range(8)}, project="speech")],
     quotas(cluster_gpus=12), {}, {"v1": "cluster quota"}),
    ("a lender's waiting work is not lent away", [job("v1").gpus(8), job("s1", project="speech").gpus(8)],
     [running("r1", {"a": range(8)}, project="speech")],
     quotas(tenants={V: TenantQuota(8, borrow_limit=8), S: TenantQuota(16, borrow_limit=0)}),
     {"v1": False, "s1": False}, {}),
]


@pytest.mark.parametrize(("pending", "run", "q", "modes", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_quota_tiers(pending: list[JobBuilder], run: list[RunningJob], q: Quotas, modes: dict[str, bool],
                     why: dict[str, str]) -> None:
    result = run_cycle(snap(NODES, pending, run, quotas=q), now=NOW)
    assert {a.job_id: a.borrowed for a in result.admits} == modes
    for job_id, text in why.items():
        assert text in reasons(result)[job_id]


def test_reclaimed_gpus_are_not_lent_to_the_borrower_again() -> None:
    # speech's borrowed job was preempted and is back in the queue with more priority than vision's job;
    # vision still waits for its owned quota, so speech may not borrow those GPUs again.
    q = Quotas(tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)})
    pending = [job("s-back", project="speech").gpus(8).requeued(2, 50), job("v-new").gpus(8)]
    result = run_cycle(snap([node("a"), node("b")], pending, [running("s-own", {"a": range(8)}, project="speech")],
                            quotas=q), now=NOW)
    assert admitted(result) == {"v-new": {"b": tuple(range(8))}}
    assert "idle GPUs" in reasons(result)["s-back"]


def test_a_waiting_job_the_alive_nodes_cannot_hold_does_not_keep_its_tenants_quota_from_being_lent() -> None:
    # vision owns the whole cluster; its gang needs a third node, lost for now. Its claim on vision's idle quota
    # kept speech from borrowing any of it: every GPU sat idle while speech waited.
    q = Quotas(tenants={V: TenantQuota(16), S: TenantQuota(0, borrow_limit=None)})
    pending = [job("v-big").gpus(8).nodes(3), job("s1", project="speech").gpus(8)]
    result = run_cycle(snap([node("a"), node("b")], pending, quotas=q), now=NOW)
    assert {a.job_id: a.borrowed for a in result.admits} == {"s1": True}
    assert "only 2 alive nodes" in reasons(result)["v-big"]
    # A job the nodes can hold still claims its tenant's quota (rule 5: reclaimed GPUs are not lent again).
    pending = [job("v-fits").gpus(8).nodes(2), job("s1", project="speech").gpus(8)]
    result = run_cycle(snap([node("a", busy=range(1)), node("b")], pending, quotas=q), now=NOW)
    assert not result.admits and "idle GPUs" in reasons(result)["s1"]


def test_no_quotas_means_everything_is_owned() -> None:
    result = run_cycle(snap(NODES, [job("v1").gpus(8), job("v2").gpus(8)]), now=NOW)
    assert [a.borrowed for a in result.admits] == [False, False]


@pytest.mark.parametrize(("gpus", "user", "expected"), [
    (8, "ada", []),
    (16, "ada", ["more than tenant vision may ever hold"]),  # a job is owned or borrowed as a whole
    (40, "ada", ["more than the cluster's hard quota of 32", "more than tenant vision"]),
    (4, "bob", ["more than the user quota of bob"]),
], ids=["owned", "beyond-borrow", "beyond-cluster", "user"])
def test_hard_limit_precheck(gpus: int, user: str, expected: list[str]) -> None:
    problems = hard_limit_problems(quotas(users={"bob": 2}), V, user, gpus, capacity=32)
    assert len(problems) == len(expected)
    for p, e in zip(problems, expected, strict=True):
        assert e in p


@pytest.mark.parametrize(("tenants", "gpus", "expected"), [
    ({S: TenantQuota(32, lend_limit=0)}, 2, ["more than tenant vision owns (0), and other tenants lend at most 0"]),
    ({S: TenantQuota(24, lend_limit=4)}, 12, []),  # 4 lent + 8 nobody owns
    ({S: TenantQuota(24, lend_limit=4)}, 13, ["other tenants lend at most 12"]),
    ({S: TenantQuota(24, lend_limit=4), V: TenantQuota(16)}, 16, []),  # fits its own quota, lends aside
], ids=["nothing-lent", "exactly-what-is-lent", "past-what-is-lent", "owned"])
def test_hard_limit_precheck_counts_what_other_tenants_may_ever_lend(tenants: dict[ProjectId, TenantQuota], gpus: int,
                                                                    expected: list[str]) -> None:
    # A job past its tenant's own quota runs only on lent GPUs; past what the lend caps allow it waited for ever.
    tenants = {V: TenantQuota(0, borrow_limit=None), **tenants}
    problems = hard_limit_problems(Quotas(tenants=tenants), V, "ada", gpus, capacity=32)
    assert len(problems) == len(expected)
    for p, e in zip(problems, expected, strict=True):
        assert e in p


def test_a_job_past_every_lend_cap_is_told_it_cannot_run_unless_quotas_change() -> None:
    q = Quotas(tenants={V: TenantQuota(0, borrow_limit=None), S: TenantQuota(24, lend_limit=4)})
    result = run_cycle(snap(NODES, [job("v1").gpus(8).nodes(2), job("v2").gpus(4)], [], quotas=q), now=NOW)
    assert "other tenants lend at most 12 even when idle, so it cannot run unless the quotas change" in \
        reasons(result)["v1"]
    assert {a.job_id for a in result.admits} == {"v2"}


@pytest.mark.parametrize(("project", "gpus", "expected"), [
    (V, 8, []),
    (V, 12, ["cannot be stopped, but tenant vision owns only 8"]),  # within the borrow limit, but never borrows
    (ProjectId("nlp"), 1, ["cannot be stopped, but tenant nlp owns only 0"]),  # no quota row: owns nothing
], ids=["owned", "past-owned-within-borrow", "tenant-without-quota"])
def test_hard_limit_precheck_of_a_job_that_cannot_be_stopped(project: ProjectId, gpus: int,
                                                             expected: list[str]) -> None:
    # The cycle never lets such a job borrow (rule 5): past its tenant's owned quota it would wait for ever.
    q = quotas(tenants={V: TenantQuota(8, borrow_limit=16)})
    problems = hard_limit_problems(q, project, "ada", gpus, capacity=32, stoppable=False)
    assert len(problems) == len(expected)
    for p, e in zip(problems, expected, strict=True):
        assert e in p
    assert hard_limit_problems(q, project, "ada", gpus, capacity=32) == []  # stoppable: it may borrow


def test_a_blocked_job_names_the_quota_tier_that_holds_it_back() -> None:
    # The gateway leaves such jobs out of its start estimates (they hold nothing; GPUs being free says nothing).
    q = quotas(users={"bob": 2})
    pending = [job("v1", user="bob").gpus(4), job("s1", project="speech").gpus(8).nodes(3),
               job("v2").gpus(8).nodes(5)]
    result = run_cycle(snap(NODES, pending, [running("r1", {"a": range(8)}, project="speech")], quotas=q), now=NOW)
    assert {b.job_id: b.quota_tier for b in result.blocked} == {"v1": "user", "s1": "tenant", "v2": ""}
