"""Opens a gateway's stores, keys and policy set from settings (shared by the server and the CLI)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import text
from sqlalchemy.orm import Session

from gateway.access import breakglass
from gateway.context import Gateway
from gateway.decisions import approvals, obligations, reconcile, refusals
from gateway.decisions.policy.factory import make_engine
from gateway.decisions.policy.testing import load_tested_set
from gateway.decisions.policy_sync import BINDINGS, load_bindings
from gateway.decisions.ratelimit import RateLimiter
from gateway.errors import LedgerMismatch, LedgerUnavailable
from gateway.execution.inprocess import InProcessExecution
from gateway.execution.port import Execution
from gateway.execution.slurm import SlurmClient, SlurmConfigError, SlurmConnection
from gateway.execution.slurm.execution import SlurmExecution
from gateway.housekeeping import Chore
from gateway.identity.token_cache import TokenCache
from gateway.jobs import emergency, figures, lifecycle, priority, quotas, stops
from gateway.jobs.reports import JobReports
from gateway.leadership import ElectedLeadership, Leadership, SoleLeadership, forget_gone_replicas, new_replica_id
from gateway.native.bus import CommandBus
from gateway.native.command_key import load_or_create_command_key
from gateway.native.execution import NativeExecution
from gateway.settings import Settings
from gateway.store import idempotency
from gateway.store.db import Database
from gateway.store.models import Meta
from gateway.store.schema import create_schema
from gateway.store.signals import Signals
from ledger.keys import load_or_create_signer
from ledger.service import Ledger

ExecutionFactory = Callable[[Gateway], Execution]


def native_execution(gateway: Gateway) -> Execution:
    """jobgate's own: the scheduler loop and node agents (gateway/native/)."""
    return NativeExecution(gateway)


def in_process_execution(nodes: Mapping[str, int]) -> ExecutionFactory:
    """An executor in this process with these nodes (name: GPUs), carried out when its run() is called
    (gateway/execution/inprocess.py); for tests that are not about agents."""

    def make(gateway: Gateway) -> Execution:
        return InProcessExecution(nodes, transaction=gateway.transaction, clock=lambda: gateway.clock(),
                                  reports=JobReports(gateway))

    return make


def slurm_cluster_name(slurm_conf: Path) -> str:
    """ClusterName in slurm.conf (Slurm's own default, "cluster", when it sets none)."""
    try:
        text = slurm_conf.read_text()
    except OSError:
        return "cluster"
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip().lower() == "clustername":
            return value.strip()
    return "cluster"


def slurm_execution(gateway: Gateway) -> Execution:
    """A Slurm cluster's (gateway/execution/slurm/execution.py), from the settings. Raises SlurmError (one line)
    when the cluster cannot be used: no slurm.conf, no such user, or slurmctld does not answer."""
    s = gateway.settings
    conn = SlurmConnection(slurm_conf=s.slurm_conf, user=s.slurm_service_user, timeout_s=s.slurm_timeout_s,
                           rest_url=s.slurm_rest_url, jwt_key=s.slurm_jwt_key)
    if s.slurm_jwt_key is not None and not s.slurm_jwt_key.is_file():
        raise SlurmConfigError("slurm", f"no JWT key at {s.slurm_jwt_key}")
    client = SlurmClient(conn)
    client.ping()
    execution = SlurmExecution(client, cluster=s.slurm_cluster or slurm_cluster_name(s.slurm_conf),
                               checkpoint_root=s.slurm_checkpoint_dir or s.data_dir / "slurm-checkpoints",
                               transaction=gateway.transaction, clock=lambda: gateway.clock(),
                               reports=JobReports(gateway), after_commit=gateway.after_commit)
    execution.prepare_storage()
    return execution


def execution_for(settings: Settings) -> ExecutionFactory:
    """The executor the settings name (JOBGATE_BACKEND)."""
    return slurm_execution if settings.backend == "slurm" else native_execution


def is_replicated(settings: Settings) -> bool:
    """Replicas of one gateway may share the business database: it and the ledger are PostgreSQL (a SQLite ledger
    is one process's, and a SQLite business database one data dir's)."""
    return (not settings.resolved_database_url().startswith("sqlite")
            and settings.resolved_ledger_url().startswith(("postgresql://", "postgres://")))


def open_gateway(settings: Settings, *, execution: ExecutionFactory = native_execution,
                 replica_id: str | None = None) -> Gateway:
    """Create the data dir, keys and schema on first start; reuse them after. Raises on a bad policy set,
    DatabaseInUse when a gateway process that may not share it runs on the business database, LedgerMismatch when
    the business database's records cite another ledger, LedgerUnavailable when the ledger cannot be written."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url(), lock_timeout_s=settings.database_lock_timeout_s)
    replicated = is_replicated(settings)
    ledger = None
    try:
        # Before the ledger is opened: a second process must not start writing a ledger of its own.
        db.claim(shared=replicated)
        create_schema(db.engine)
        signer = load_or_create_signer(settings.keys_dir, settings.ledger_origin)
        ledger = Ledger.open(settings.resolved_ledger_url(), signer=signer)
        if (problem := ledger.write_problem()) is not None:
            raise LedgerUnavailable(f"the ledger cannot be written: {problem}")
        if not db.is_sqlite:
            bind_ledger(db, ledger)
    except BaseException:
        if ledger is not None:
            ledger.close()
        db.close()
        raise
    policy_set = load_tested_set(settings.policies_dir)  # as a reload would: compiled and passing its own tests
    with db.transaction() as session:
        bindings = load_bindings(session)
    engine = make_engine(policy_set, bindings, kind=settings.policy_engine, opa_url=settings.opa_url,
                         opa_timeout_s=settings.opa_timeout_s)
    replica = replica_id or new_replica_id(settings.port)
    # Alone on its database (SQLite, or a PostgreSQL one beside a ledger of its own) there is nobody to tell.
    signals = Signals(libpq_url(db.url) if replicated else None, replica=replica)
    address = f"http://{settings.host}:{settings.port}"
    leadership: Leadership = (
        ElectedLeadership(db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                          partial(db.transaction, immediate=False), replica, address)
        if replicated else SoleLeadership(replica, address))
    gateway = Gateway(
        settings=settings,
        db=db,
        ledger=ledger,
        policy_set=policy_set,
        policy=engine,
        command_key=load_or_create_command_key(settings.keys_dir),
        limiter=RateLimiter(settings.rate_limit_storage, policy_set.data.get("limits", {}),
                            timeout_s=settings.rate_limit_timeout_s),
        token_cache=TokenCache(settings.auth_cache_s),
        signals=signals,
        bus=CommandBus(signals),
        leadership=leadership,
    )
    try:
        listen_to_replicas(gateway)
        gateway.execution = execution(gateway)
    except BaseException:
        gateway.close()
        raise
    register_executors(gateway)
    register_chores(gateway)
    gateway.figures.extend([approvals.figures, figures.figures])  # /metrics, in this order
    if signals.enabled:
        gateway.figures.append(partial(signal_figures, signals))
    return gateway


def libpq_url(url: str) -> str:
    """The business DB's URL as libpq takes it (a SQLAlchemy driver name, if one was given, left out)."""
    scheme, sep, rest = url.partition("://")
    return scheme.split("+", 1)[0] + sep + rest


def listen_to_replicas(gateway: Gateway) -> None:
    """What this replica keeps in memory and learns from the others' signals (gateway/store/signals.py): tokens
    revoked (out of the auth cache), commands queued (wake the long polls), role bindings changed (into the
    engine). The policy set's hash is handled by the app, which owns the reloader (gateway/app.py). After a
    reconnect, what may have been missed is treated as all of it."""
    signals, cache, bus = gateway.signals, gateway.token_cache, gateway.bus
    if not signals.enabled:
        return
    signals.on("token_revoked", lambda digest: cache.forget(digest) if digest else cache.clear())
    signals.on("wake", lambda nodes: bus.notify(nodes) if nodes else bus.notify_all())

    def bindings_changed(_: object) -> None:
        with gateway.transaction(immediate=False) as session:
            gateway.policy_sync.refresh_bindings(lambda: gateway.policy, session)

    signals.on(BINDINGS, bindings_changed)
    signals.on_connect(cache.clear)
    signals.on_connect(bus.notify_all)
    signals.start()


def signal_figures(signals: Signals, _session: Session, _now: object) -> Iterator[Metric]:
    """Whether this replica hears the others (alert when 0: it learns of their changes only at its bounds)."""
    up = GaugeMetricFamily("jobgate_replica_signals_connected", "1 while listening to the other replicas' signals")
    up.add_metric([], 1.0 if signals.connected else 0.0)
    yield up
    got = CounterMetricFamily("jobgate_replica_signals_received", "Signals handled from other replicas")
    got.add_metric([], float(signals.received))
    yield got


LEDGER_IDENTITY = "ledger_identity"  # Meta key: the hash of entry 0 of the ledger this database's rows cite
_IDENTITY_LOCK = 7305619  # transaction advisory lock: two replicas' first starts record one identity


def bind_ledger(db: Database, ledger: Ledger) -> None:
    """Record, on the first start that sees an entry, which ledger this business database's rows cite (the hash of
    its entry 0, which no later append changes); on every later start, refuse another ledger. Replicas share the
    database only if they append to one ledger: one started with another PostgreSQL ledger (a typo in
    JOBGATE_LEDGER_URL, a restored copy) would fork the audit trail, its rows citing seqs that name other entries.
    A ledger still empty binds nothing yet (the app calls this again after its first entry). Raises
    LedgerMismatch."""
    first = ledger.entry(0).hash if ledger.size() else None
    with db.transaction() as session:
        if not db.is_sqlite:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _IDENTITY_LOCK})
        row = session.get(Meta, LEDGER_IDENTITY)
        if row is None:
            if first is not None:
                session.add(Meta(key=LEDGER_IDENTITY, value=first))
            return
        if row.value != first:
            raise LedgerMismatch(
                f"the business database's records cite the ledger whose entry 0 has hash {row.value[:16]}..., but"
                f" this ledger's {'is empty' if first is None else f'entry 0 has hash {first[:16]}...'}: start"
                " every replica with the one JOBGATE_LEDGER_URL the others use")


def register_executors(gateway: Gateway) -> None:
    """Each room's executors of approved actions (M2), bound to this gateway: approvals know only the registry."""
    for room in (stops, lifecycle, priority, quotas, emergency, breakglass):
        for action, carry_out in room.EXECUTORS.items():
            gateway.executors[action] = partial(carry_out, gateway)


def register_chores(gateway: Gateway) -> None:
    """The periodic chores of every room (gateway/housekeeping.py runs them), bound to this gateway, in the order
    they run."""
    chores: list[tuple[str, Chore]] = [
        ("receipts", partial(obligations.sweep_timed_out_receipts, gateway)),
        ("break-glass expiry", partial(breakglass.sweep_expired, gateway)),
        ("approval expiry", partial(approvals.expire_due, gateway)),
        ("decisions without an outcome", reconcile.reconcile_chore(gateway)),  # reads the ledger before it locks
        ("idempotency keys past retention", lambda session: idempotency.purge(session, gateway.clock())),
        *((name, partial(chore, gateway)) for name, chore in lifecycle.CHORES)]
    if not gateway.db.is_sqlite:  # replicas announce themselves only in a PostgreSQL business database
        chores.append(("replicas gone for a week", forget_gone_replicas))
    gateway.chores.extend(chores)
    # The counts are in this process's memory: a follower writes its own (the leader's chores are not its to run).
    gateway.own_chores.append(("counts of repeated refusals", partial(refusals.flush_counts, gateway)))
