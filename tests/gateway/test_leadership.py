"""Leader election among replicas on one PostgreSQL business database (gateway/leadership.py): one leads, another
takes over when its session ends, and a leader that lost its lock cannot write leader-only work (the fence)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import psycopg
import pytest
from sqlalchemy import text

from gateway.leadership import READY_PROBE, ElectedLeadership, NotLeader, forget_gone_replicas
from gateway.store.db import Database
from gateway.store.schema import create_schema

pytestmark = pytest.mark.integration


@pytest.fixture
def shared_db(fresh_pg_database: Callable[[str], str]) -> Iterator[tuple[str, Database]]:
    url = fresh_pg_database("jobgate_lead")
    db = Database(url)
    create_schema(db.engine)
    yield url, db
    db.close()


def replica(url: str, db: Database, name: str, *, retry_s: float = 0.1) -> ElectedLeadership:
    return ElectedLeadership(url, partial(db.transaction, immediate=False), name, f"http://{name}", retry_s=retry_s)


def until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_one_replica_leads_and_another_takes_over_under_a_new_epoch_when_its_session_ends(
        shared_db: tuple[str, Database]) -> None:
    url, db = shared_db
    elected: list[tuple[str, int]] = []
    a, b = replica(url, db, "a"), replica(url, db, "b")
    try:
        a.start(lambda epoch: elected.append(("a", epoch)))
        b.start(lambda epoch: elected.append(("b", epoch)))
        assert a.leads() and not b.leads() and elected == [("a", 1)]
        with db.transaction() as session:
            a.fence(session)  # the leader's leader-only work goes on
        with pytest.raises(NotLeader), db.transaction() as session:
            b.fence(session)  # a follower's is refused
        status = b.status()
        assert status["role"] == "follower" and status["leader"]["id"] == "a" and status["leader"]["epoch"] == 1
        assert {r["id"] for r in status["replicas"] if r["alive"]} == {"a", "b"}
        assert b.leader_known() is None
        a.stop()  # its session, and the lock, end
        assert until(b.leads, 2.0)
        assert elected == [("a", 1), ("b", 2)] and b.status()["leader"]["id"] == "b"
    finally:
        a.stop()
        b.stop()


def _cut_lock_connection(url: str, lead: ElectedLeadership) -> None:
    """What a network cut or a server-side kill does to the leader's lock session."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lead._conn.info.backend_pid,))


def test_a_leader_that_lost_its_lock_cannot_write_leader_only_work_once_another_leads(
        shared_db: tuple[str, Database]) -> None:
    url, db = shared_db
    # a's own rounds are slow: it still believes it leads when b has taken over (what a stalled process sees).
    a, b = replica(url, db, "a", retry_s=30.0), replica(url, db, "b")
    try:
        a.start(lambda _epoch: None)
        b.start(lambda _epoch: None)
        _cut_lock_connection(url, a)
        assert until(b.leads)
        assert a.leads()  # stale belief
        with pytest.raises(NotLeader, match="epoch 1; the database holds 2"), db.transaction() as session:
            a.fence(session)
        assert not a.leads()  # the fence also ended the belief
    finally:
        a.stop()
        b.stop()


def test_a_leader_stops_leading_at_its_first_round_after_its_lock_connection_fails(
        shared_db: tuple[str, Database]) -> None:
    url, db = shared_db
    a = replica(url, db, "a")
    try:
        a.start(lambda _epoch: None)
        _cut_lock_connection(url, a)
        assert until(lambda: not a.leads(), 2.0)  # the loops skip their next round
        assert until(a.leads, 3.0)  # back as a follower that finds the lock free: it leads again, a new epoch
        assert a.epoch == 2
    finally:
        a.stop()


def test_a_takeover_waits_for_the_old_leaders_fenced_transaction_to_end(shared_db: tuple[str, Database]) -> None:
    """The fence's share lock on leader_state: the old leader's cycle either commits before the next epoch
    begins or never (so two replicas' cycles never interleave)."""
    url, db = shared_db
    a, b = replica(url, db, "a", retry_s=30.0), replica(url, db, "b")
    release = threading.Event()
    fenced = threading.Event()

    def old_leaders_cycle() -> None:
        with db.transaction() as session:
            a.fence(session)
            fenced.set()
            release.wait(10)

    try:
        a.start(lambda _epoch: None)
        b.start(lambda _epoch: None)
        cycle = threading.Thread(target=old_leaders_cycle)
        cycle.start()
        assert fenced.wait(5)
        _cut_lock_connection(url, a)
        time.sleep(0.5)  # five of b's rounds: it has the advisory lock, but its epoch waits for the cycle
        assert not b.leads()
        release.set()
        cycle.join(5)
        assert until(b.leads)
    finally:
        release.set()
        a.stop()
        b.stop()


def test_replicas_gone_for_a_week_are_forgotten_with_their_readiness_probe(shared_db: tuple[str, Database]) -> None:
    _url, db = shared_db
    with db.transaction() as s:
        for rid, age in (("gone", "8 days"), ("recent", "6 days")):
            s.execute(text("INSERT INTO replicas (id, started_at, seen_at) VALUES (:i, now(), now() - CAST(:a AS"
                           " interval))"), {"i": rid, "a": age})
            s.execute(text("INSERT INTO meta (key, value) VALUES (:k, 'x')"), {"k": READY_PROBE + rid})
    with db.transaction() as s:
        assert forget_gone_replicas(s) == 1
    with db.transaction() as s:
        assert [r for (r,) in s.execute(text("SELECT id FROM replicas"))] == ["recent"]
        assert [k for (k,) in s.execute(text("SELECT key FROM meta WHERE key LIKE 'ready_probe:%'"))] == [
            READY_PROBE + "recent"]
