"""One policy set and one set of role bindings for every replica of a business database (issue 28).

The set in force is the one the business database names (table `policy_state`): the last one any replica loaded,
at its start or by a reload. Before each decision a replica reads that row (one primary-key read) and compares:
- another hash: it loads the set from its own policy files (`adopt`, PolicyReloader.adopt: tested and ledgered like
  any load) and decides under it if the files hash to the named set; if they do not, or it cannot load them, it
  refuses the request (503 `policy-out-of-step`, nothing changed, nothing decided) until they do. It never decides
  under a stale hash.
- another count of role binding changes: it reads the role bindings into its engine first, so a role revoked
  through one replica stops granting on every replica at the next decision.
A reload or a role change also signals the others (gateway/store/signals.py), which then load at once rather
than at their next decision. On SQLite (one process) the row is neither written nor read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gateway.decisions.policy.engine import EmbeddedEngine, RoleBinding
from gateway.errors import GatewayError
from gateway.store.models import RoleBinding as RoleBindingRow
from gateway.store.replica_tables import PolicyState
from gateway.store.signals import Signals

log = logging.getLogger("jobgate.policy")

ROW = 1
POLICY = "policy"  # signal kinds
BINDINGS = "bindings"
_NAMED = f"SELECT policy_hash, bindings_version FROM {PolicyState.__tablename__} WHERE id = {ROW}"
# The same two values as columns of another statement (a submission's first facts, gateway/jobs/submission.py).
NAMED_COLUMNS = tuple(select(column).where(PolicyState.id == ROW).scalar_subquery().label(column.key)
                      for column in (PolicyState.policy_hash, PolicyState.bindings_version))
_READ_AHEAD = "policy_state_read_ahead"  # session.info: the row as the caller's statement read it (read_with)


class PolicyOutOfStep(GatewayError):
    """This replica cannot decide under the policy set the business database names (fail closed)."""

    status, kind, title = 503, "policy-out-of-step", "Policy set in force not loaded on this replica: request refused"


def load_bindings(session: Session) -> list[RoleBinding]:
    """The role bindings of the business DB (M1), as the policy engine takes them."""
    rows = session.scalars(select(RoleBindingRow)).all()
    return [RoleBinding(principal=r.principal_id, role=r.role, project=r.project) for r in rows]


@dataclass
class PolicySync:
    signals: Signals
    lock: threading.RLock  # the gateway's policy lock: held while its engine or the engine's bindings change
    # Loads the named set from this replica's files or raises PolicyOutOfStep; the app sets it (PolicyReloader).
    adopt: Callable[[str], None] | None = None
    bindings_version: int = -1  # the count of role binding changes this replica's engine holds (-1: unknown)
    _bindings_read: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.signals.enabled

    def read_with(self, session: Session, row: tuple[str | None, int | None]) -> None:
        """The caller has just read NAMED_COLUMNS in a statement of its own (one round trip for several reads): the
        next check in this session takes them from there rather than reading them again."""
        policy_hash, version = row
        session.info[_READ_AHEAD] = None if policy_hash is None or version is None else (policy_hash, version)

    def named(self, session: Session) -> tuple[str, int] | None:
        """(hash, count of role binding changes) the business database names, or None before any replica did."""
        if _READ_AHEAD in session.info:  # read once only: a second call (refresh_bindings) reads it again
            ahead: tuple[str, int] | None = session.info.pop(_READ_AHEAD)
            return ahead
        # Driver SQL: read before every decision, where the ORM's statement cost several times the read itself.
        row = session.connection().exec_driver_sql(_NAMED).first()
        return None if row is None else (row[0], row[1])

    def check(self, engine: Callable[[], EmbeddedEngine], session: Session) -> None:
        """Before a decision: make this replica's engine the one in force, or raise PolicyOutOfStep."""
        if not self.enabled:
            return
        named = self.named(session)
        if named is None:
            return  # no replica has started yet on this database (this one is starting): its own set is in force
        policy_hash, version = named
        if engine().policy_hash != policy_hash:
            if self.adopt is None:
                raise PolicyOutOfStep(f"the business database names policy set {policy_hash[:12]}, this process"
                                      f" decides under {engine().policy_hash[:12]} and cannot load another")
            self.adopt(policy_hash)
        if version != self.bindings_version:
            self.refresh_bindings(engine, session)

    def refresh_bindings(self, engine: Callable[[], EmbeddedEngine], session: Session) -> None:
        """Read the role bindings into the engine. Under the policy lock, so that a change made through this
        replica (which holds it from its transaction to its engine) is either wholly before or wholly after."""
        with self.lock:
            named = self.named(session)
            if named is None or named[1] == self.bindings_version:
                return
            engine().replace_bindings(load_bindings(session))
            self.bindings_version = named[1]

    def publish_set(self, session: Session, policy_hash: str, directory: str, now: datetime) -> None:
        """Name `policy_hash` as the set in force (a load on this replica) and tell the others."""
        if not self.enabled:
            return
        values = {"policy_hash": policy_hash, "directory": directory, "loaded_by": self.signals.replica,
                  "changed_at": now}
        statement = insert(PolicyState).values(id=ROW, bindings_version=0, **values)
        session.execute(statement.on_conflict_do_update(index_elements=[PolicyState.id], set_=values))
        self.signals.publish(session, POLICY, policy_hash)

    def bindings_changed(self, session: Session) -> None:
        """In the transaction that changes a role binding: count it, so every replica reads the bindings again."""
        if not self.enabled:
            return
        session.execute(update(PolicyState).where(PolicyState.id == ROW)
                        .values(bindings_version=PolicyState.bindings_version + 1))
        self.signals.publish(session, BINDINGS, None)
