"""Console pages for operators: admin (usage, heat map, waits, preemptions, fragmentation, suggestions,
nodes), emergency stops with live progress, the active policy set, and the auditor's ledger browser."""

from __future__ import annotations

import shutil
import threading
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from sqlalchemy import select
from starlette.background import BackgroundTask

from gateway.console import figures, ledger_view
from gateway.console.access import emergency_viewer, ledger_reader, may, operator
from gateway.console.web import need_view, page
from gateway.decisions.policy import whatif
from gateway.decisions.policy.errors import PolicyLoadError
from gateway.decisions.policy_sync import load_bindings
from gateway.errors import Invalid
from gateway.jobs import emergency, insights, preemption
from gateway.store.models import Allocation, Node
from gateway.store.stop_tables import AgentSession

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/admin", response_class=HTMLResponse)
@page
def admin(request: Request, period: str = "month") -> Response:
    view = need_view(request)
    operator(view)
    if period not in ("month", "quarter"):
        raise Invalid("period must be month or quarter")
    now = view.gw.clock()
    with view.gw.transaction(immediate=False) as session:
        view.caller(session)
        usage = insights.cluster_usage(session)
        heat = insights.heatmap(session, now)
        waits = insights.waits(session, now)
        use = insights.usage_over_time(session, now)
        frag = insights.fragmentation(session)
        tips = insights.suggestions(session, now)
        pre = preemption.stats(session, None, period)
        nodes = _nodes(session)
    return view.render("admin.html", usage=usage, heat_chart=figures.quota_heatmap(heat),
                       waits_chart=figures.wait_histograms(waits), use_chart=figures.usage_timeline(use, width=1100),
                       frag=frag, tips=tips, pre=pre, period=period, nodes=nodes, refresh=True)


def _nodes(session: object) -> list[dict[str, object]]:
    from sqlalchemy.orm import Session
    assert isinstance(session, Session)
    used: dict[str, int] = {}
    for node, gpus in session.execute(select(Allocation.node, Allocation.gpus)
                                      .where(Allocation.released.is_(False))).all():
        used[node] = used.get(node, 0) + len(gpus)
    agents = {a.node: a for a in session.scalars(select(AgentSession)).all()}
    return [{"id": n.id, "state": n.state, "gpus": n.gpus, "used": used.get(n.id, 0),
             "last_heartbeat": n.last_heartbeat, "agent_since": agents[n.id].since if n.id in agents else None,
             "isolation": n.isolation or "unknown"}
            for n in session.scalars(select(Node).order_by(Node.id)).all()]


@router.get("/emergency", response_class=HTMLResponse)
@page
def emergency_list(request: Request) -> Response:
    view = need_view(request)
    emergency_viewer(view)
    with view.gw.transaction(immediate=False) as session:
        view.caller(session)
        rows = emergency.list_stops(session, 50)
        stops = emergency.reports(session, rows, view.gw.clock())
    emergency.settle_after_read(view.gw, rows, stops)
    return view.render("emergency.html", stops=stops, one=None, refresh=True)


@router.get("/emergency/{emergency_id}", response_class=HTMLResponse)
@page
def emergency_one(request: Request, emergency_id: str) -> Response:
    """Per-job progress of one emergency stop; the page reloads itself every few seconds until it is over."""
    view = need_view(request)
    with view.gw.transaction(immediate=False) as session:
        row = emergency.load(view.gw, session, view.caller(session), emergency_id)
        one = emergency.report(session, row, view.gw.clock())
    emergency.settle_after_read(view.gw, [row], [one])
    return view.render("emergency.html", stops=[], one=one, refresh=one["state"] not in emergency.FINAL_STATES)


@router.get("/policy", response_class=HTMLResponse)
@page
def policy(request: Request) -> Response:
    """What GET /v1/policy shows: the active set, its hash, and the reload history with errors."""
    view = need_view(request)
    status = request.app.state.policy_reloader.status()
    return view.render("policy.html", status=status, whatif=None, last=WHATIF_LAST, may_replay=may(view, ledger_reader))


WHATIF_LAST = 2000
_whatif_lock = threading.Lock()  # the replay's in-process engine is a module global of gateway.decisions.policy.whatif


@router.post("/policy/whatif", response_class=HTMLResponse)
@page
def policy_whatif(request: Request, csrf: Annotated[str | None, Form()] = None) -> Response:
    """Replay the last recorded decisions under the policy files now in the policy directory (for example a
    change the watcher refused, or one not yet reloaded) and list the decisions that would flip. Reads
    decision inputs from the ledger, so it needs `ledger.read`; it changes nothing."""
    view = need_view(request)
    view.require_csrf(csrf)
    ledger_reader(view)
    gw = view.gw
    size = gw.ledger.size()
    start = max(0, size - WHATIF_LAST * 3)  # decisions are about a third of the entries or more
    entries = [e.value for e in gw.ledger.entries(start, size - start)]
    records = list(whatif.records_from_entries(entries))[-WHATIF_LAST:]
    with gw.transaction(immediate=False) as session:
        bindings = load_bindings(session)
    try:
        with _whatif_lock:
            report = whatif.replay(gw.settings.policies_dir, records, bindings,
                                   bindings_source="the gateway's current role bindings", workers=1)
    except PolicyLoadError as e:
        raise Invalid(f"the policy files on disk do not load: {e}") from e
    status = request.app.state.policy_reloader.status()
    return view.render("policy.html", status=status, whatif=report.to_json(), last=WHATIF_LAST, may_replay=True)


@router.get("/ledger", response_class=HTMLResponse)
@page
def ledger_browser(request: Request, job: str = "", actor: str = "", action: str = "", effect: str = "",
                   kind: str = "", since: str = "", until: str = "",
                   before: Annotated[int | None, Query(ge=0)] = None) -> Response:
    view = need_view(request)
    ledger_reader(view)
    f = ledger_view.Filter(job=job.strip() or None, actor=actor.strip() or None, action=action.strip() or None,
                           effect=effect.strip() or None, kind=kind.strip() or None,
                           since=ledger_view.parse_time(since, "since"), until=ledger_view.parse_time(until, "until"))
    found = ledger_view.search(view.gw, f, before=before)
    form = {"job": job, "actor": actor, "action": action, "effect": effect, "kind": kind, "since": since,
            "until": until}
    return view.render("ledger.html", found=found, form=form)


@router.get("/ledger/export")
@page
def ledger_export(request: Request) -> Response:
    """A bundle of every signed entry, for
    `jobgate ledger verify --bundle FILE --public-key <data-dir>/keys/ledger.vkey`."""
    view = need_view(request)
    ledger_reader(view)
    path = ledger_view.export(view.gw)
    return FileResponse(path, filename="jobgate-ledger.bundle", media_type="application/octet-stream",
                        background=BackgroundTask(shutil.rmtree, path.parent, ignore_errors=True))


@router.get("/ledger/{seq}", response_class=HTMLResponse)
@page
def ledger_entry(request: Request, seq: int) -> Response:
    view = need_view(request)
    ledger_reader(view)
    detail = ledger_view.entry_detail(view.gw, seq)
    return view.render("entry.html", d=detail, pretty=ledger_view.pretty)
