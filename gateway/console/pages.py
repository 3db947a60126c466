"""Console pages for everyone: sign in/out, my jobs (researcher), one job, notices, the approvals inbox."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import or_, select

from gateway.api.approvals import ApproveBody, RejectBody
from gateway.console import figures, job_actions
from gateway.console.sessions import COOKIE, LOGIN_COOKIE, check_token, csrf_ok
from gateway.console.web import need_view, new_login_nonce, page, store, templates
from gateway.context import Gateway
from gateway.decisions import approvals, pipeline
from gateway.decisions.obligations import acknowledge, note_json
from gateway.decisions.policy_sync import load_bindings
from gateway.errors import Forbidden, GatewayError, Invalid
from gateway.execution.slurm.execution import slurm_view
from gateway.jobs import insights, priority_history, records, stops
from gateway.schemas import StopRequest
from gateway.store.models import Job, Project
from gateway.store.scheduler_tables import SchedJob
from gateway.store.service_tables import Approval, Notification

router = APIRouter(prefix="/ui", include_in_schema=False)
Field_ = Annotated[str | None, Form()]


def _cookie_flags(request: Request) -> dict[str, Any]:
    # Secure only over HTTPS: `make run` serves plain HTTP on localhost and the cookie must still work there.
    return {"httponly": True, "samesite": "strict", "secure": request.url.scheme == "https", "path": "/ui"}


def _login_form(request: Request, error: str | None = None, status: int = 200) -> HTMLResponse:
    nonce = new_login_nonce()
    resp = templates.TemplateResponse(request, "login.html", {"me": None, "nav": [], "csrf": nonce, "error": error},
                                      status_code=status)
    resp.set_cookie(LOGIN_COOKIE, nonce, max_age=1800, **_cookie_flags(request))
    return resp


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> Response:
    return _login_form(request)


@router.post("/login")
def login(request: Request, token: Field_ = None, csrf: Field_ = None) -> Response:
    """Paste a token → a server-side session. The form is CSRF-checked by double submit (cookie + field)."""
    if not csrf_ok(request.cookies.get(LOGIN_COOKIE, ""), csrf):
        return _login_form(request, "The sign-in form expired or was not sent from this page; try again.", 403)
    gw: Gateway = request.app.state.gateway
    try:
        with gw.transaction(immediate=False) as session:
            digest, principal = check_token(session, token or "", gw.clock())
    except GatewayError as e:
        return _login_form(request, f"Not signed in: {e.detail}.", 401)
    cs = store(request).create(digest, principal, gw.clock())
    resp = RedirectResponse("/ui/", status_code=303)
    resp.set_cookie(COOKIE, cs.id, **_cookie_flags(request))
    resp.delete_cookie(LOGIN_COOKIE, path="/ui")
    return resp


@router.post("/logout")
@page
def logout(request: Request, csrf: Field_ = None) -> Response:
    view = need_view(request)
    view.require_csrf(csrf)
    store(request).drop(view.cs.id)
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def _queue_facts(job: Job, row: SchedJob | None) -> dict[str, Any]:
    pending = job.state == "pending"
    return {
        "position": row.position if row and pending else None,
        "estimated_start": row.estimated_start if row and pending else None,
        "why": ((row.blocked_reason if row and pending else "") or job.state_reason) or "",
        "priority": row.priority if row else None,
        "parts": dict(row.parts) if row else {},
        "quota": ("borrowed" if row and row.borrowed else "owned") if job.state in insights.RUNNING_STATES else None,
        "preemptions": row.preemptions if row else 0,
    }


def _my_jobs(gw: Gateway, session: Any, caller: Any, limit: int = 100) -> list[dict[str, Any]]:
    """Jobs the caller owns or created, newest first, in projects the policy lets them see (A1)."""
    me = caller.real_identity
    visible = pipeline.visible_projects(gw, session, caller, list(session.scalars(select(Project.id)).all()))
    if not visible:
        return []
    rows = session.execute(select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                           .where(Job.project.in_(sorted(visible)), or_(Job.owner == me, Job.creator == me))
                           .order_by(Job.submitted_at.desc(), Job.id.desc()).limit(limit)).all()
    # The policy is asked only about jobs still going (job_actions.offers): most of a person's list has ended.
    return [{"job": j, **_queue_facts(j, s), "offers": job_actions.offers(gw, session, caller, j, s)}
            for j, s in rows]


@router.get("/", response_class=HTMLResponse)
@page
def home(request: Request) -> Response:
    """Researcher home: the F5 first screen, my jobs with where they stand, my notices, the queues."""
    view = need_view(request)
    with view.gw.transaction(immediate=False) as session:
        caller = view.caller(session)
        me = caller.real_identity
        rows = _my_jobs(view.gw, session, caller)
        notes = [note_json(n, view.gw.clock()) for n in session.scalars(
            select(Notification).where(Notification.principal == me)
            .order_by(Notification.created_at.desc()).limit(30)).all()]
        usage = insights.cluster_usage(session)
        use = insights.usage_over_time(session, view.gw.clock())
        visible = pipeline.visible_projects(view.gw, session, caller, list(session.scalars(select(Project.id)).all()))
        queues = _queues(session, visible)
        contacts = _contacts(session, me)
    return view.render("home.html", rows=rows, notes=notes, usage=usage, queues=queues, contacts=contacts,
                       use_chart=figures.usage_timeline(use, width=540))


def _contacts(session: Any, me: str) -> dict[str, Any]:
    """F5 "whom to contact", from the role bindings in force: the queue admins of each project the person
    works in, the on-call engineers and the security reviewers. A role bound to "*" holds in every project."""
    bindings = load_bindings(session)
    mine = sorted({b.project for b in bindings if b.principal == me and b.project != "*"})

    def holders(role: str, project: str = "*") -> list[str]:
        return sorted({b.principal for b in bindings if b.role == role and b.project in (project, "*")})

    return {"queue_admins": {p: holders("queue_admin", p) for p in mine}, "oncall": holders("oncall"),
            "security": holders("security_reviewer")}


def _queues(session: Any, visible: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Waiting jobs per queue in order with their priority (Q10); ids only where the caller may look."""
    out: dict[str, list[dict[str, Any]]] = {}
    # Plain columns only: whole rows would decode every job's JSON columns for nothing.
    rows = session.execute(select(Job.id, Job.project, Job.queue, Job.gpus_per_node, Job.nodes, Job.submitted_at,
                                  SchedJob.priority)
                           .join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                           .where(Job.state == "pending")).all()
    for job_id, project, queue, g, n, _, priority in sorted(rows, key=lambda r: (-(r[6] or 0.0), r[5], r[0])):
        out.setdefault(queue, []).append({
            "id": job_id if project in visible else None,
            "project": project if project in visible else "(other tenant)", "priority": priority, "gpus": g * n})
    return out


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
@page
def job_page(request: Request, job_id: str) -> Response:
    """One job: state and history, queue position and priority parts, stop evidence and checkpoints."""
    view = need_view(request)
    with view.gw.transaction(immediate=False) as session:
        caller = view.caller(session)
        job = records.get_job(view.gw, session, caller, job_id)
        row = session.get(SchedJob, job.id)
        facts = {**_queue_facts(job, row), "slurm": slurm_view(session, job.id)}
        history = priority_history.history(session, job.id)
        offers = job_actions.offers(view.gw, session, caller, job, row)
    # Reload while the job moves by itself (starting, stopping); never while someone may be typing a reason.
    refresh = job.state in ("starting", "stop_requested", "stopping")
    return view.render("job.html", job=job, q=facts, priority_history=history, offers=offers, refresh=refresh)


@router.post("/jobs/{job_id}/stop")
@page
def stop_job(request: Request, job_id: str, csrf: Field_ = None, reason: Field_ = None,
             ticket: Field_ = None) -> Response:
    """The same service and decision as POST /v1/jobs/{id}/stop, with the signed-in person as caller."""
    view = need_view(request)
    view.require_csrf(csrf)
    try:
        body = StopRequest(reason=(reason or "").strip(), ticket=(ticket or "").strip() or None)
    except ValidationError as e:
        raise Invalid("a stop needs a written reason of 3 to 2000 characters, and a ticket is at most 200") from e
    with view.gw.transaction() as session:
        _, _rec, approval = stops.stop(view.gw, session, view.caller(session), job_id, body)
        approval_id = approval.id if approval is not None else None
    if approval_id is not None:
        return RedirectResponse(f"/ui/approvals/{approval_id}", status_code=303)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.post("/notifications/{notification_id}/ack")
@page
def ack_notice(request: Request, notification_id: str, csrf: Field_ = None) -> Response:
    view = need_view(request)
    view.require_csrf(csrf)
    with view.gw.transaction() as session:
        acknowledge(view.gw, session, view.caller(session), notification_id)
    return RedirectResponse("/ui/#notices", status_code=303)


@router.get("/approvals", response_class=HTMLResponse)
@page
def approvals_inbox(request: Request, state: str = "pending") -> Response:
    """Requests I made or could approve: exact targets, blast radius, reason, requester, expiry."""
    view = need_view(request)
    if state not in ("pending", "executed", "rejected", "expired", "all"):
        raise Invalid(f"unknown approval state {state!r}")
    with view.gw.transaction() as session:
        caller = view.caller(session)
        found = approvals.visible_to(view.gw, session, caller, None if state == "all" else state)
        items = _approval_views(view.gw, session, caller, found)
    return view.render("approvals.html", items=items, state=state)


def _approval_views(gw: Gateway, session: Any, caller: Any, found: list[Approval]) -> list[dict[str, Any]]:
    """Each request as the page shows it, with its summary in words (the same as the API's and the CLI's)."""
    return [_approval_view(gw, session, caller, a, shown)
            for a, shown in zip(found, approvals.with_summaries(gw, session, caller, found), strict=True)]


def _approval_view(gw: Gateway, session: Any, caller: Any, a: Approval,
                   shown: dict[str, Any]) -> dict[str, Any]:
    targets = list(session.scalars(select(Job).where(Job.id.in_(a.target_ids)).order_by(Job.id)).all())
    mine = caller.real_identity == a.requester_real
    # An approval can span projects (a cross-project batch, asked of each target's owner): the details of a
    # target are for those who may view its job (A1), as GET /v1/jobs/{id} decides; the others get its id
    # and project, what GET /v1/approvals/{id} gives them too.
    visible = pipeline.visible_projects(gw, session, caller, sorted({j.project for j in targets}))
    return {"a": shown, "s": shown["summary"], "targets": [j for j in targets if j.project in visible],
            "hidden": [(j.id, j.project) for j in targets if j.project not in visible], "mine": mine,
            "can_approve": a.state == "pending" and not mine and approvals.may_approve(gw, session, caller, a)}


@router.get("/approvals/{approval_id}", response_class=HTMLResponse)
@page
def approval_page(request: Request, approval_id: str) -> Response:
    view = need_view(request)
    with view.gw.transaction() as session:
        caller = view.caller(session)
        found = [a for a in approvals.visible_to(view.gw, session, caller, None) if a.id == approval_id]
        if not found:
            raise Forbidden(f"no approval request {approval_id!r} visible to {caller.id}")
        (item,) = _approval_views(view.gw, session, caller, found)
    return view.render("approvals.html", items=[item], state=item["a"]["state"], single=True)


@router.post("/approvals/{approval_id}/approve")
@page
def approve(request: Request, approval_id: str, csrf: Field_ = None, comment: Field_ = None) -> Response:
    """approvals.approve in one transaction: re-decided with the recorded approvals, executed once."""
    view = need_view(request)
    view.require_csrf(csrf)
    try:  # the API's bounds: what goes into the signed ledger is the same whichever way it came
        body = ApproveBody(comment=(comment or "").strip() or None)
    except ValidationError as e:
        raise Invalid("an approval's comment is at most 2000 characters") from e
    with approvals.answering(view.gw, approval_id) as session:
        approvals.approve(view.gw, session, view.caller(session), approval_id, body.comment)
    return RedirectResponse(f"/ui/approvals/{approval_id}", status_code=303)


@router.post("/approvals/{approval_id}/reject")
@page
def reject(request: Request, approval_id: str, csrf: Field_ = None, reason: Field_ = None) -> Response:
    view = need_view(request)
    view.require_csrf(csrf)
    try:
        body = RejectBody(reason=(reason or "").strip())
    except ValidationError as e:
        raise Invalid("a rejection needs a written reason of 3 to 2000 characters") from e
    with approvals.answering(view.gw, approval_id) as session:
        approvals.reject(view.gw, session, view.caller(session), approval_id, body.reason)
    return RedirectResponse(f"/ui/approvals/{approval_id}", status_code=303)

