"""What the console says to people: notices as sentences, numbers rounded, lists and records as words, never a
Python repr ("['j-1']", "{'node': ...}", "None") and never "exit code None"."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from console_testkit import Console, submit
from sqlalchemy import update

from gateway.console import wording
from gateway.store.models import Job

REPR = re.compile(r"\[['\"]|['\"]\]|\{['\"]|\bNone\b|\bTrue\b|\bFalse\b|\d\.\d{4,}")


@pytest.mark.parametrize(("value", "said"), [
    (570.0491041888889, "570.05"), (570.0, "570"), (3, "3"), (0.5, "0.5"), (-0.001, "0"), (1e-9, "0"),
    (-12.3456, "-12.35"), (True, "yes"), (None, "none"),
], ids=repr)
def test_numbers_are_rounded_for_people(value: Any, said: str) -> None:
    assert wording.number(value) == said


@pytest.mark.parametrize(("value", "said"), [
    (["demo-node-1", "demo-node-2"], "demo-node-1, demo-node-2"), ([], "none"),
    ({"node": "n1", "exit_code": 3}, "node n1; exit code 3"),
    ({"outcome": None, "gone": False}, "outcome none; gone no"),
    ("2026-11-29T10:00:05.123456+00:00", "2026-11-29 10:00:05 UTC"),
    (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02 03:04:05 UTC"),
    (2.34567, "2.35"), ("plain words", "plain words"),
], ids=repr)
def test_values_are_said_as_words(value: Any, said: str) -> None:
    assert wording.words(value) == said


@pytest.mark.parametrize(("seconds", "said"), [(0, "0 s"), (59.6, "1 min"), (90, "1 min 30 s"), (7200, "2 h"),
                                               (9000, "2 h 30 min"), (90000, "1 d 1 h"), (None, "none")], ids=repr)
def test_durations(seconds: Any, said: str) -> None:
    assert wording.duration(seconds) == said


def test_an_unknown_exit_status_is_said_so() -> None:
    assert wording.exit_status(3) == "exit code 3" and wording.exit_status(0) == "exit code 0"
    assert wording.exit_status(None) == "exit status unknown"


AT = "2026-11-29T10:00:05.123456+00:00"
NOTICES = [
    ("job_action", {"job_id": "j-1", "job_name": "resnet", "action": "job.stop", "by": "carol", "reason": "queue hog"},
     "carol is stopping your job resnet (j-1): “queue hog”."),
    ("approval_requested", {"approval_id": "apr-1", "action": "job.stop", "targets": ["j-1", "j-2"],
                            "requester": "carol", "reason": "queue hog", "expires_at": AT},
     "carol asks for a stop of j-1, j-2, which needs a second person: “queue hog”. Request apr-1, open until"
     " 2026-11-29 10:00:05 UTC."),
    ("approval_executed", {"approval_id": "apr-1", "action": "job.priority", "skipped": []},
     "Your request apr-1 (a priority change) was approved and carried out."),
    ("approval_rejected", {"approval_id": "apr-1", "action": "job.stop", "by": "alice", "reason": "not now"},
     "Request apr-1 (a stop) was turned down by alice: “not now”; nothing was done."),
    ("approval_expired", {"approval_id": "apr-1", "action": "quota.change", "expired_at": AT},
     "Request apr-1 (a quota change) expired at 2026-11-29 10:00:05 UTC with nothing done."),
    ("preempted", {"job_id": "j-1", "reason": "urgent eval", "kind": "priority", "preemptor": "j-9",
                   "preemptor_project": "speech", "expected_restart": "back in the queue once stopped",
                   "checkpoint": "prepare signal SIGTERM, 30 s to write a checkpoint"},
     "Your job j-1 is being preempted by j-9 of project speech (a higher-priority job needs its GPUs): “urgent eval”."
     " Prepare signal SIGTERM, 30 s to write a checkpoint. Back in the queue once stopped."),
    ("preempted", {"job_id": "j-1", "reason": "reclaimed", "kind": "reclaim", "preemptor": None,
                   "preemptor_project": None, "expected_restart": "", "checkpoint": ""},
     "Your job j-1 is being preempted (its lender reclaims the GPUs it borrowed): “reclaimed”."),
    ("requeued", {"job_id": "j-1", "outcome": "graceful", "priority": 570.0491041888889,
                  "checkpoint": {"outcome": "graceful", "files": [{"path": "last.ckpt", "size": 7}]},
                  "expected_restart": "see its queue position"},
     "Your job j-1 is back in its queue after its preemption (graceful exit), with priority 570.05; 1 checkpoint"
     " file kept (last.ckpt). See its queue position."),
    ("expected_restart", {"job_id": "j-1", "position": 2, "queue": "normal", "reason": "waits for 8 GPUs",
                          "expected_restart": None},
     "Your job j-1 waits at position 2 in the normal queue and starts once the GPUs it needs are free: “waits for 8"
     " GPUs”."),
    ("job_runtime_limit", {"job_id": "j-1", "runtime_limit_s": 7200, "started_at": AT},
     "Your job j-1 ran past its declared runtime limit of 2 h (it started 2026-11-29 10:00:05 UTC): the system is"
     " stopping it gracefully."),
    ("job_gang_member_failed", {"job_id": "j-1", "node": "n2", "exit_code": None, "stopping": ["n1", "n3"]},
     "A member of your job j-1 failed on n2 (exit status unknown); the system is stopping the others on n1, n3."),
    ("job_paused", {"job_id": "j-1", "by": "dave", "reason": "node maintenance"},
     "dave paused your job j-1: “node maintenance”."),
    # An alert has no sentence of its own: its fields as words.
    ("node_lost", {"node": "n2", "last_heartbeat": AT, "jobs": ["j-1", "j-2"]},
     "Node lost: node n2; last heartbeat 2026-11-29 10:00:05 UTC; jobs j-1, j-2."),
    # A field the sentence does not use is not dropped.
    ("job_paused", {"job_id": "j-1", "by": "dave", "reason": "maintenance", "window": {"from": AT, "hours": 2.5}},
     "dave paused your job j-1: “maintenance”. (window from 2026-11-29 10:00:05 UTC; hours 2.5)"),
]


@pytest.mark.parametrize(("kind", "body", "said"), NOTICES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(NOTICES)])
def test_notices_are_sentences(kind: str, body: dict[str, Any], said: str) -> None:
    assert wording.notice(kind, body) == said
    assert not REPR.search(said)


def test_a_notice_of_another_shape_is_still_words() -> None:
    said = wording.notice("requeued", {"job_id": "j-1", "checkpoint": ["odd"], "priority": {"weird": 1}})
    assert not REPR.search(said) and "j-1" in said


def test_console_pages_say_notices_and_figures_as_words(console: Console) -> None:
    """alice's notices (an approval asked of her) and dave's emergency page held Python reprs: "targets:
    ['j-…']", "nodes: ['demo-node-1']", "outcome: None"."""
    running = submit(console)
    gw = console.gateway
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == running).values(
            state="running", started_at=datetime.now(UTC), placement=[{"node": "demo-node-1", "gpus": [0, 1]}]))
    r = console.api("POST", f"/v1/jobs/{running}/stop", "carol", json={"reason": "queue hog"})
    assert r.status_code == 202, r.text
    r = console.api("POST", "/v1/emergency-stops", "dave", json={
        "scope": {"kind": "job", "value": running}, "trigger": "safety", "reason": "unsafe outputs"})
    assert r.status_code == 201, r.text
    alice, _ = console.sign_in("alice")
    notices = re.findall(r'<td class="notice">(.*?)</td>', alice.get("/ui/").text, re.S)
    assert any(f"carol asks for a stop of {running}, which needs a second person" in n for n in notices), notices
    dave, _ = console.sign_in("dave")
    for page in ("/ui/", f"/ui/emergency/{r.json()['id']}", f"/ui/jobs/{running}"):
        html = dave.get(page).text
        body = re.sub(r"<pre>.*?</pre>|<style>.*?</style>", "", html, flags=re.S)  # the raw evidence JSON is JSON
        assert not REPR.search(body), (page, REPR.search(body))
        assert "exit code None" not in html
    assert "nodes:</span> demo-node-1" in dave.get(f"/ui/emergency/{r.json()['id']}").text
