"""Rule 1 of run_cycle and Q3: queue baseline + contribution + capped aging; deterministic ties."""

from __future__ import annotations

import math

import pytest
from scheduler_builders import NOW, JobBuilder, admitted, at, job, node, snap

from scheduler.cycle import run_cycle
from scheduler.errors import InvalidConfig
from scheduler.model import SchedulerConfig
from scheduler.priority import PriorityParts, effective_priority

PARTS = [
    ("urgent fresh", job("j").queue("urgent"), PriorityParts(1000, 0, 0)),
    ("urgent never ages", job("j").queue("urgent").waited(50), PriorityParts(1000, 0, 0)),
    ("normal 3h", job("j").waited(3), PriorityParts(500, 0, 30)),
    ("normal capped at 200", job("j").waited(100), PriorityParts(500, 0, 200)),
    ("batch 10h", job("j").queue("batch").waited(10), PriorityParts(100, 0, 50)),
    ("batch capped at 300", job("j").queue("batch").waited(1000), PriorityParts(100, 0, 300)),
    ("contribution adds", job("j").priority(42).waited(1), PriorityParts(500, 42, 10)),
    ("future submission counts as no wait", job("j").waited(-1), PriorityParts(500, 0, 0)),
]


@pytest.mark.parametrize(("builder", "expected"), [c[1:] for c in PARTS], ids=[c[0] for c in PARTS])
def test_effective_priority(builder: JobBuilder, expected: PriorityParts) -> None:
    parts = effective_priority(builder.build(), NOW, SchedulerConfig())
    assert parts == expected
    assert parts.total == expected.baseline + expected.contribution + expected.aging


# One 8-GPU node, every job wants all of it: whoever is first in rule 1's order gets it.
WINNERS = [
    ("urgent beats normal", [job("n").waited(5), job("u").queue("urgent")], "u"),
    ("normal beats batch", [job("b").queue("batch"), job("n")], "n"),
    ("old batch overtakes new batch", [job("new").queue("batch"), job("old").queue("batch").waited(10)], "old"),
    ("capped batch stays below fresh normal", [job("b").queue("batch").waited(10_000), job("n")], "n"),
    ("contribution beats a little aging", [job("aged").waited(2), job("rich").priority(25)], "rich"),
    ("aging beats contribution once it is larger", [job("aged").waited(3), job("rich").priority(25)], "aged"),
    ("aging capped: 100h and 1000h tie, earlier submission wins",
     [job("z100").waited(100), job("a1000").waited(1000)], "a1000"),
    ("equal priority: earlier submission wins",
     [job("a").submitted(at(minutes=-1)).priority(10), job("b").submitted(at(minutes=-2)).priority(10)], "b"),
    ("equal priority and time: lower id wins", [job("b"), job("a"), job("c")], "a"),
]


@pytest.mark.parametrize(("pending", "winner"), [c[1:] for c in WINNERS], ids=[c[0] for c in WINNERS])
def test_order(pending: list[JobBuilder], winner: str) -> None:
    """Q2: three levels, urgent before normal before batch; batch tolerates long waits (it ages, capped
    below a fresh normal job). Q3: within a queue, contribution and aging decide."""
    jobs = [b.gpus(8) for b in pending]
    assert list(admitted(run_cycle(snap([node("n1")], jobs), now=NOW))) == [winner]


def test_admits_come_in_priority_order_with_their_parts() -> None:
    """Q2: the three queue levels' baselines, highest first."""
    result = run_cycle(snap([node("n1")], [job("n"), job("u").queue("urgent"), job("b").queue("batch")]), now=NOW)
    assert [a.job_id for a in result.admits] == ["u", "n", "b"]
    assert [a.priority.baseline for a in result.admits] == [1000, 500, 100]


def test_custom_config_reorders() -> None:
    config = SchedulerConfig(queue_baseline={"urgent": 1000, "normal": 100, "batch": 500})
    result = run_cycle(snap([node("n1")], [job("n").gpus(8), job("b").gpus(8).queue("batch")]), now=NOW,
                       config=config)
    assert list(admitted(result)) == ["b"]


BAD_CONFIG = [
    ("missing queue", {"queue_baseline": {"urgent": 1, "normal": 1}}, "queue_baseline"),
    ("unknown queue", {"aging_cap": {"urgent": 0, "normal": 1, "batch": 1, "gold": 1}}, "aging_cap"),
    ("negative rate", {"aging_per_hour": {"urgent": 0, "normal": -1, "batch": 1}}, "aging_per_hour"),
    ("zero window", {"reservation_window_s": 0}, "reservation_window_s"),
    ("negative depth", {"backfill_depth": -1}, "backfill_depth"),
    ("NaN rate", {"aging_per_hour": {"urgent": 0, "normal": math.nan, "batch": 1}}, "aging_per_hour.normal"),
    ("NaN baseline", {"queue_baseline": {"urgent": 1, "normal": math.nan, "batch": 1}}, "queue_baseline.normal"),
    ("NaN compensation", {"preemption_compensation": math.nan}, "preemption_compensation"),
    ("infinite fair share", {"fairshare_weight": math.inf}, "fairshare_weight"),
    ("infinite window", {"reservation_window_s": math.inf}, "reservation_window_s"),
    ("infinite default runtime", {"default_runtime_s": math.inf}, "default_runtime_s"),
    ("a renewal window past any date", {"renewal_window_s": 1e300}, "renewal_window_s"),
    ("a minimum runtime past any date", {"min_runtime_s": {"urgent": 1e300, "normal": 1, "batch": 1}},
     "min_runtime_s.urgent"),
]


@pytest.mark.parametrize(("kwargs", "field"), [c[1:] for c in BAD_CONFIG], ids=[c[0] for c in BAD_CONFIG])
def test_bad_config(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidConfig) as e:
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]
    assert e.value.field == field


def test_config_cannot_be_changed_through_the_dict_passed_in() -> None:
    baseline = {"urgent": 1000.0, "normal": 500.0, "batch": 100.0}
    config = SchedulerConfig(queue_baseline=baseline)
    baseline["batch"] = 9999.0
    assert config.queue_baseline["batch"] == 100.0
