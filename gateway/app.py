"""Builds the FastAPI application; nothing is created at import time."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import anyio.to_thread
import fastapi.routing
from fastapi import FastAPI

from gateway.api import docs_pages, openapi_doc
from gateway.api.body_limit import BodyLimitMiddleware
from gateway.api.idempotency import IdempotencyMiddleware
from gateway.api.routes import ROUTERS
from gateway.bootstrap import ExecutionFactory, bind_ledger, native_execution, open_gateway
from gateway.console.routes import ROUTERS as CONSOLE_ROUTERS
from gateway.console.web import ConsoleHeadersMiddleware
from gateway.context import Gateway
from gateway.decisions.policy_reload import PolicyReloader
from gateway.decisions.policy_sync import POLICY
from gateway.decisions.reconcile import reconcile_at_startup
from gateway.decisions.refusals import flush_counts, on_api_refusal
from gateway.errors import install_error_handlers
from gateway.execution.slurm.execution import SlurmExecution
from gateway.execution.slurm.oversight import SlurmWatch, SlurmWatchLoop
from gateway.execution.slurm.poll import SlurmLoop
from gateway.housekeeping import HousekeepingLoop
from gateway.jobs.oversight import JobOversight
from gateway.leadership import FencedWork
from gateway.logging_setup import RequestIdMiddleware, configure_json_logging
from gateway.native.execution import NativeExecution
from gateway.native.planner_process import PlannerProcess
from gateway.native.scheduler_loop import SchedulerLoop
from gateway.settings import Settings

LONG_POLL_THREADS = 500  # node agents waiting at once per gateway replica

DESCRIPTION = """
jobgate is the one door through which anyone changes a training job on the shared GPU pool.

Every mutation is authenticated (bearer token), decided against the policy set that security reviewers
own (Casbin role matrix + Rego guards), **recorded in a signed, hash-chained ledger before anything
changes**, and only then carried out by the scheduler and the node agents.

Errors are RFC 9457 `application/problem+json` with a stable `type`. Request bodies are limited to 1 MiB
(node agents: 16 MiB); a larger one is refused with 413 before it is read.
"""


def serialize_responses_in_the_loop() -> None:
    """Let FastAPI validate and encode a sync endpoint's return value where it awaits it, not in a second hop
    to the thread pool after the endpoint's own (it does so in case a validator blocks; ours never do).

    Pydantic holds the GIL while it validates, so the pool thread ran no faster than the event loop would;
    the hop itself (hand-offs, wake-ups, GIL switches) cost 0.07-0.1 ms of CPU per call, a sixth of a
    no-op request. Applied once per process; tests/gateway/api/test_thread_pools.py notices if FastAPI
    changes so that it no longer takes."""
    original = fastapi.routing.serialize_response
    if getattr(original, "in_the_loop", False):
        return

    async def in_the_loop(**kwargs: Any) -> Any:
        return await original(**{**kwargs, "is_coroutine": True})

    in_the_loop.in_the_loop = True  # type: ignore[attr-defined]
    fastapi.routing.serialize_response = in_the_loop


def lead_or_follow(gw: Gateway) -> None:
    """Start this replica's part in the election (once; `jobgate up` does it before it prints which part it has).
    Whenever it comes to lead, first the allowed decisions a previous leader (or this database's last run) left
    without an outcome are closed, then the scheduler cycles at once: the failover bound counts to that cycle.
    Raises when the business database cannot be reached (psycopg.Error)."""
    if gw.leadership.started:
        return

    def elected(_epoch: int) -> None:
        reconcile_at_startup(cast(Gateway, FencedWork(gw, gw.leadership, "reconcile")))
        gw.scheduler_kick.set()

    gw.leadership.start(elected)


def create_app(settings: Settings | None = None, *, run_scheduler: bool = True,
               gateway: Gateway | None = None, execution: ExecutionFactory = native_execution) -> FastAPI:
    """The app; it opens its gateway from `settings` when it starts, unless given one already open (`jobgate up`
    opens it first, so that a start-up failure is one line rather than uvicorn's traceback). `execution` is what
    runs the jobs (gateway/bootstrap.py); the scheduler loop runs only for jobgate's own."""
    settings = settings or Settings()
    serialize_responses_in_the_loop()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        # Long polls from node agents each hold a thread for up to a minute: their own pool, so they never
        # take the API's threads (see gateway/api/agents.py).
        app.state.long_poll_limiter = anyio.CapacityLimiter(LONG_POLL_THREADS)
        gw = gateway or open_gateway(settings, execution=execution)
        app.state.gateway = gw
        # Before serving, if this replica leads: an allowed decision the last run left without an outcome is
        # closed with one.
        lead_or_follow(gw)
        # Policy: ledger the start-up set, then watch the directory for reviewers' changes (issue 4).
        reloader = PolicyReloader(gw)
        app.state.policy_reloader = reloader
        reloader.record_startup()
        # Replicas: load a set another replica loaded before deciding again, and at once when it says so.
        gw.policy_sync.adopt = reloader.adopt
        gw.signals.on(POLICY, reloader.on_signal)
        if not gw.db.is_sqlite:
            bind_ledger(gw.db, gw.ledger)  # a ledger that was empty at open has its first entry now
        reloader.start(settings.policy_watch_interval_s)
        # What start-up built (modules, the ORM's mappers, the policy engine, routes) lives as long as the
        # process: keep it out of the cyclic collector's full passes, which otherwise walk all of it and
        # stalled requests for 60-90 ms every few seconds under load.
        gc.freeze()
        loops: list[SchedulerLoop | SlurmLoop | SlurmWatchLoop | HousekeepingLoop] = []
        planner: PlannerProcess | None = None
        if run_scheduler:
            # The loops' cycles run Python for tens of ms at a time beside the requests (gil_switch_interval_s).
            sys.setswitchinterval(settings.gil_switch_interval_s)
            # Every replica has its loops; each round runs only where it leads, and fenced (gateway/leadership.py).
            # jobgate's scheduler places only on its own nodes; on Slurm, Slurm places and the loop reads it.
            leads = gw.leadership.leads
            loops = [HousekeepingLoop(cast(Gateway, FencedWork(gw, gw.leadership, "housekeeping")), leads=leads)]
            if isinstance(gw.execution, NativeExecution):
                if gw.db.is_sqlite and settings.scheduler_planner == "process":
                    planner = PlannerProcess(gw.db.url)
                loops.insert(0, SchedulerLoop(cast(Gateway, FencedWork(gw, gw.leadership, "scheduler")), leads=leads,
                                              planner=planner))
            elif isinstance(gw.execution, SlurmExecution):
                watch = SlurmWatch(gw.execution.client, gw.execution.cluster, JobOversight(gw), gw.transaction,
                                   clock=gw.clock)
                loops[:0] = [SlurmLoop(gw.execution, settings.slurm_poll_interval_s, leads=leads),
                             SlurmWatchLoop(watch, settings.slurm_watch_interval_s, leads=leads)]
        for loop in loops:
            loop.start()
        try:
            yield
        finally:
            gw.bus.close()
            for loop in loops:
                loop.stop()
            if planner is not None:
                planner.close()
            reloader.stop()
            flush_counts(gw, everything=True)  # refusals counted in windows still open
            gw.policy.close()
            gw.close()

    # /docs and /redoc: FastAPI's own load their scripts from a CDN; docs_pages serves installed copies.
    app = FastAPI(title="jobgate", version="0.1.0", description=DESCRIPTION, lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    app.openapi = partial(openapi_doc.document, app)  # type: ignore[method-assign]
    docs_pages.install(app)
    install_error_handlers(app, on_refusal=on_api_refusal)
    for router in (*ROUTERS, *CONSOLE_ROUTERS):  # the console's pages after the API's routes
        app.include_router(router)
    logging.getLogger("jobgate").setLevel(logging.INFO)
    configure_json_logging()
    app.add_middleware(IdempotencyMiddleware)  # inside the body limit: it reads a keyed request's body whole
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(ConsoleHeadersMiddleware)
    app.add_middleware(RequestIdMiddleware)  # X-Request-Id on every response and log line (the outermost)
    return app
