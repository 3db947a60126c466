"""Which replica does the leader-only work: the scheduler cycle (with node health, lost-node detection, stop
escalation and runtime limits), occupancy, reconciliation of decisions left without an outcome, and the
housekeeping chores (notice time-outs, expiries, retention, purges).

Many replicas serve one PostgreSQL business database (with one PostgreSQL ledger, which any number of processes
append to); every one serves the whole API, and one leads. The leader is the replica holding a session advisory
lock (LEADER_LOCK) on a connection of its own, the lock connection. Followers try to take it every RETRY_S; a
leader killed with kill -9 loses its session, and with it the lock, the moment PostgreSQL sees its socket close,
so a follower leads within about RETRY_S (the bound stated and measured: bench/replicas.py --failover).

A lock alone does not stop a leader that lost its lock connection (a network cut, a server-side kill) from
finishing work on its other connections after another replica took over. So each takeover bumps an epoch in
the `leader_state` row, and every leader-only transaction starts with fence(): it reads that row FOR SHARE and
goes on only if the epoch is still its own. The share lock holds a takeover's UPDATE of the row until that
transaction ends, so a leader-only transaction either commits before the next epoch begins or sees it and
rolls back: two replicas' cycles never interleave (two placements of one job, two lost-node verdicts, two
outcomes closing one decision). Requests are not fenced: every replica serves them, under row locks.

When its lock connection fails the replica stops leader work at once (the loops ask leads() before each round)
and tries again as a follower once the connection is back.

A SQLite business database, or a ledger only one process may write (SQLite), has one gateway process: it leads
from the start, with nothing to elect (SoleLeadership).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.orm import Session

log = logging.getLogger("jobgate.leadership")

LEADER_LOCK = 7305618  # session advisory lock key of the leader (gateway/store/db.py's gateway lock is 7305617)
RETRY_S = 1.0  # how often a follower tries to lead, and the leader checks its lock connection
SEEN_S = 5.0  # a replica not seen for longer is reported as gone
GONE_KEPT_S = 7 * 86400  # a gone replica's row (and its readiness probe's) is kept this long for operators to see
READY_PROBE = "ready_probe:"  # meta key prefix of the row each replica's readiness check writes (gateway/api/health.py)
# The lock connection's bounds: a leader whose connection hangs (a network cut) must notice within a few seconds
# that it may have lost the lock, not after the kernel's default TCP timeouts (minutes).
_CONNECT = {"connect_timeout": 3, "keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1,
            "keepalives_count": 2, "tcp_user_timeout": 3000}


class NotLeader(Exception):
    """A leader-only transaction found that this replica does not lead (any more); it is rolled back."""


def new_replica_id(port: int | None = None) -> str:
    """host:port/pid and a random tail: unique among restarts, and an operator reading it knows which process."""
    return f"{socket.gethostname()}:{port or 0}/{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Leadership(Protocol):
    replica_id: str
    started: bool

    def leads(self) -> bool: ...

    def fence(self, session: Session) -> None: ...

    def start(self, on_elected: Callable[[int], None]) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def leader_known(self) -> str | None: ...

    def cycle_ran(self) -> None: ...


class SoleLeadership:
    """The only gateway process on its business database: always the leader, epoch 0, nothing to fence."""

    def __init__(self, replica_id: str, address: str | None = None) -> None:
        self.replica_id, self.address = replica_id, address
        self.elected_at = datetime.now(UTC)
        self.first_cycle_at: datetime | None = None
        self.started = False

    def leads(self) -> bool:
        return True

    def fence(self, session: Session) -> None:
        return None

    def start(self, on_elected: Callable[[int], None]) -> None:
        self.started = True
        on_elected(0)

    def stop(self) -> None:
        return None

    def cycle_ran(self) -> None:
        if self.first_cycle_at is None:
            self.first_cycle_at = datetime.now(UTC)

    def leader_known(self) -> str | None:
        return None

    def status(self) -> dict[str, Any]:
        me = {"id": self.replica_id, "address": self.address, "alive": True}
        return {"mode": "single", "replica": self.replica_id, "role": "leader", "epoch": 0,
                "leader": {**me, "epoch": 0, "elected_at": self.elected_at.isoformat()},
                "first_cycle_at": self.first_cycle_at.isoformat() if self.first_cycle_at else None,
                "replicas": [me]}


class ElectedLeadership:
    """Leader election among replicas on one PostgreSQL business database (see the module docstring).

    `url` is the business database's libpq URL; `read` opens a transaction on the gateway's own pool (status and
    readiness read through it, so a pool that cannot reach the database says so)."""

    def __init__(self, url: str, read: Callable[[], Any], replica_id: str, address: str | None = None, *,
                 retry_s: float = RETRY_S) -> None:
        self.url, self._read = url, read
        self.replica_id, self.address = replica_id, address
        self.retry_s = retry_s
        self._conn: Any = None  # the lock connection (psycopg, autocommit); the elector thread's alone after start
        self._epoch: int | None = None  # set while this replica leads
        self._state = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_elected: Callable[[int], None] = lambda _epoch: None
        self.started_at = datetime.now(UTC)
        self.elected_at: datetime | None = None
        self.first_cycle_at: datetime | None = None
        self.lock_error: str | None = None  # why the lock connection is down, while it is
        self.started = False

    # -- the elector -------------------------------------------------------------------------------------

    def start(self, on_elected: Callable[[int], None]) -> None:
        """Announce this replica and try once to lead, here (so `jobgate up` can say which it is, and the first
        replica does its start-up reconciliation before it serves); then go on trying in a thread. Raises
        psycopg.Error when the business database cannot be reached or written at all."""
        self._on_elected = on_elected
        self.started = True
        self._connect()
        self._round()
        self._thread = threading.Thread(target=self._run, name="jobgate-leadership", daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        import psycopg

        given = psycopg.conninfo.conninfo_to_dict(self.url)
        bounds: dict[str, Any] = {k: v for k, v in _CONNECT.items() if k not in given}
        self._conn = psycopg.connect(self.url, autocommit=True, application_name="jobgate-leadership", **bounds)
        self._conn.execute(
            "INSERT INTO replicas (id, address, started_at, seen_at) VALUES (%s, %s, %s, now())"
            " ON CONFLICT (id) DO UPDATE SET seen_at = now()", (self.replica_id, self.address, self.started_at))
        self.lock_error = None

    def _run(self) -> None:
        while not self._stop.wait(self.retry_s):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._connect()
                self._round()
            except Exception as e:  # the lock connection failed: whatever this replica held, it holds no more
                self._lost(e)

    def _round(self) -> None:
        """One round on the lock connection: say this replica lives; a follower tries to lead."""
        conn = self._conn
        conn.execute("UPDATE replicas SET seen_at = now() WHERE id = %s", (self.replica_id,))
        if self._epoch is not None:
            return  # the session (and its lock) lives: the statement above went through on it
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()[0]:
            return
        with conn.transaction():
            # Waits for a fenced transaction of the previous leader to end (its FOR SHARE on this row).
            epoch = conn.execute(
                "INSERT INTO leader_state (id, epoch, holder, address, elected_at) VALUES (1, 1, %s, %s, now())"
                " ON CONFLICT (id) DO UPDATE SET epoch = leader_state.epoch + 1, holder = EXCLUDED.holder,"
                " address = EXCLUDED.address, elected_at = now() RETURNING epoch",
                (self.replica_id, self.address)).fetchone()[0]
        with self._state:
            self._epoch, self.elected_at, self.first_cycle_at = epoch, datetime.now(UTC), None
        log.info("replica %s leads (epoch %d)", self.replica_id, epoch)
        try:
            self._on_elected(epoch)
        except Exception:  # the leader's loops still run: a failed start-up chore is retried by housekeeping
            log.exception("leader start-up work failed (epoch %d)", epoch)

    def _lost(self, e: Exception) -> None:
        with self._state:
            was, self._epoch = self._epoch, None
        self.lock_error = f"{e.__class__.__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if was is not None:
            log.error("replica %s lost its lock connection; stopped leader work (epoch %d): %s",
                      self.replica_id, was, self.lock_error)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection: nothing to tell
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._state:
            self._epoch = None
        if self._conn is not None:
            self._conn.close()  # ends the session, and the lock with it: a follower leads within RETRY_S
            self._conn = None

    # -- what the rest asks ------------------------------------------------------------------------------

    def leads(self) -> bool:
        return self._epoch is not None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def cycle_ran(self) -> None:
        with self._state:
            if self.first_cycle_at is None and self._epoch is not None:
                self.first_cycle_at = datetime.now(UTC)

    def fence(self, session: Session) -> None:
        """At the start of a leader-only transaction: raises NotLeader unless this replica leads under the epoch
        the database holds; then holds the row (FOR SHARE) so no takeover completes before the transaction ends."""
        mine = self._epoch
        if mine is None:
            raise NotLeader(f"replica {self.replica_id} does not lead")
        row = session.execute(text("SELECT epoch, holder FROM leader_state WHERE id = 1 FOR SHARE")).first()
        if row is None or row[0] != mine or row[1] != self.replica_id:
            with self._state:
                if self._epoch == mine:
                    self._epoch = None
            raise NotLeader(f"replica {self.replica_id} led under epoch {mine}; the database holds"
                            f" {row[0] if row else 'none'} ({row[1] if row else 'nobody'})")

    def _rows(self) -> tuple[Any, list[Any], datetime]:
        with self._read() as session:
            leader = session.execute(text(
                "SELECT holder, address, epoch, elected_at FROM leader_state WHERE id = 1")).first()
            replicas = session.execute(text(
                "SELECT id, address, started_at, seen_at, now() - seen_at <= make_interval(secs => :s) AS alive"
                " FROM replicas WHERE now() - seen_at <= interval '1 hour' ORDER BY started_at"),
                {"s": SEEN_S}).all()
            now = session.execute(text("SELECT now()")).scalar_one()
        return leader, replicas, now

    def leader_known(self) -> str | None:
        """None when a leader is known (this replica, or one seen within SEEN_S); else why not."""
        if self._epoch is not None:
            return None
        leader, replicas, _ = self._rows()
        if leader is None:
            return "no replica has led yet"
        seen = {r.id: r.alive for r in replicas}
        if not seen.get(leader.holder):
            return (f"the last leader ({leader.holder}, epoch {leader.epoch}) has not been seen for {SEEN_S:g} s;"
                    f" a follower takes over within {self.retry_s:g} s of its lock being released")
        return None

    def status(self) -> dict[str, Any]:
        leader, replicas, _ = self._rows()
        alive = {r.id: bool(r.alive) for r in replicas}
        return {
            "mode": "replicas",
            "replica": self.replica_id,
            "role": "leader" if self._epoch is not None else "follower",
            "epoch": self._epoch,
            "leader": None if leader is None else {
                "id": leader.holder, "address": leader.address, "epoch": leader.epoch,
                "elected_at": leader.elected_at.isoformat(), "alive": alive.get(leader.holder, False)},
            "first_cycle_at": self.first_cycle_at.isoformat() if self.first_cycle_at else None,
            "lock_connection": "ok" if self.lock_error is None else self.lock_error,
            "replicas": [{"id": r.id, "address": r.address, "started_at": r.started_at.isoformat(),
                          "seen_at": r.seen_at.isoformat(), "alive": bool(r.alive)} for r in replicas],
        }


class FencedWork:
    """The gateway as leader-only work sees it: each transaction starts with the fence, so a replica that no
    longer leads writes nothing. `name` "scheduler" marks the scheduler's cycles (the first after an election is
    what the failover bound counts to). Everything else is the gateway's own."""

    def __init__(self, gateway: Any, leadership: Leadership, name: str) -> None:
        self._gateway, self._leadership, self._name = gateway, leadership, name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)

    @contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator[Session]:
        with self._gateway.transaction(immediate=immediate) as session:
            self._leadership.fence(session)
            yield session
        if self._name == "scheduler":
            self._leadership.cycle_ran()


def forget_gone_replicas(session: Session) -> int:
    """Delete the rows of replicas not seen for GONE_KEPT_S, and their readiness probes' (a chore: every start
    adds a replica row, and nothing else removes one). Returns how many replicas were forgotten."""
    gone = [r for (r,) in session.execute(text(
        "DELETE FROM replicas WHERE seen_at < now() - make_interval(secs => :s) RETURNING id"), {"s": GONE_KEPT_S})]
    if gone:
        session.execute(text("DELETE FROM meta WHERE key = ANY(:keys)"),
                        {"keys": [READY_PROBE + r[:50] for r in gone]})
    return len(gone)
