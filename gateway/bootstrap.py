"""Opens a gateway's stores, keys and policy set from settings (shared by the server and the CLI)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy.orm import Session

from gateway.access import breakglass
from gateway.context import Gateway
from gateway.decisions import approvals, obligations, reconcile, refusals
from gateway.decisions.policy.factory import make_engine
from gateway.decisions.policy.testing import load_tested_set
from gateway.decisions.policy_sync import BINDINGS, load_bindings
from gateway.decisions.ratelimit import RateLimiter
from gateway.execution.inprocess import InProcessExecution
from gateway.execution.port import Execution
from gateway.identity.token_cache import TokenCache
from gateway.jobs import emergency, figures, lifecycle, priority, quotas, stops
from gateway.jobs.reports import JobReports
from gateway.native.bus import CommandBus
from gateway.native.command_key import load_or_create_command_key
from gateway.native.execution import NativeExecution
from gateway.settings import Settings
from gateway.store.db import Database
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


def open_gateway(settings: Settings, *, execution: ExecutionFactory = native_execution) -> Gateway:
    """Create the data dir, keys and schema on first start; reuse them after. Raises on a bad policy set,
    DatabaseInUse when another gateway process runs on the business database."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url(), lock_timeout_s=settings.database_lock_timeout_s)
    try:
        db.claim()  # before the ledger is opened: a second process must not start writing a ledger of its own
        create_schema(db.engine)
        signer = load_or_create_signer(settings.keys_dir, settings.ledger_origin)
        ledger = Ledger.open(settings.resolved_ledger_url(), signer=signer)
    except BaseException:
        db.close()
        raise
    policy_set = load_tested_set(settings.policies_dir)  # as a reload would: compiled and passing its own tests
    with db.transaction() as session:
        bindings = load_bindings(session)
    engine = make_engine(policy_set, bindings, kind=settings.policy_engine, opa_url=settings.opa_url,
                         opa_timeout_s=settings.opa_timeout_s)
    signals = Signals(None if db.is_sqlite else libpq_url(db.url))
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
    )
    listen_to_replicas(gateway)
    gateway.execution = execution(gateway)
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


def register_executors(gateway: Gateway) -> None:
    """Each room's executors of approved actions (M2), bound to this gateway: approvals know only the registry."""
    for room in (stops, lifecycle, priority, quotas, emergency, breakglass):
        for action, carry_out in room.EXECUTORS.items():
            gateway.executors[action] = partial(carry_out, gateway)


def register_chores(gateway: Gateway) -> None:
    """The periodic chores of every room (gateway/housekeeping.py runs them), bound to this gateway, in the order
    they run."""
    chores: list[tuple[str, Callable[[Gateway, Session], object]]] = [
        ("receipts", obligations.sweep_timed_out_receipts), ("break-glass expiry", breakglass.sweep_expired),
        ("approval expiry", approvals.expire_due), ("decisions without an outcome", reconcile.reconcile_task),
        ("counts of repeated refusals", lambda gw, _session: refusals.flush_counts(gw)), *lifecycle.CHORES]
    gateway.chores.extend((name, partial(chore, gateway)) for name, chore in chores)
