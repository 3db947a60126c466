"""A person's controls on a job in the console: priority (A2 own job, A3 another's), pause and resume (A5) beside
the stop (A4), each posted through the service the API calls, with the signed-in person as caller.

A page offers a control only where the policy would not refuse it: it asks the decision that control's service
asks (`decide`, not recorded), so nobody is shown a form the console then answers 403. A form may still ask for a
second person (the answer is the approval's page), and a value past what the person may set alone is refused
with the policy's reason, which the form states beforehand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from gateway.api.lifecycle import Reasoned, ResumeBody
from gateway.api.priority import PriorityRequest, change_priority
from gateway.console.web import need_view, page
from gateway.context import Gateway
from gateway.decisions import facts
from gateway.decisions.pipeline import decide
from gateway.errors import Invalid, NotFound
from gateway.identity.auth import Caller
from gateway.jobs import lifecycle, retention
from gateway.jobs.stops import not_stoppable
from gateway.store.models import Job
from gateway.store.scheduler_tables import SchedJob
from gateway.store.states import PAST_STATES, STOPPABLE_STATES

router = APIRouter(prefix="/ui", include_in_schema=False)
Field_ = Annotated[str | None, Form()]

# The forms ask for a written reason where one is needed; the policy is asked with one, so that a control which
# needs only the reason is offered (record=False: this text never reaches the ledger).
_ASKED_WITH_A_REASON = "the reason the person will write in the form"


@dataclass(frozen=True)
class Offers:
    """What this person may do to one job from the console, and the figures its priority form needs."""

    stop: bool = False
    priority: bool = False
    pause: bool = False
    resume: bool = False
    priority_value: float | None = None  # the form's starting value: the priority now, rounded down for people
    alone_up_to: float | None = None  # A2: the most this person may set by herself; None: more goes the A3 way
    restore_to: float | None = None  # what taking her own lowering back sets, when there is one to take back

    @property
    def any(self) -> bool:
        return self.stop or self.priority or self.pause or self.resume


def _open(gw: Gateway, session: Session, caller: Caller, job: Job, action: str,
          params: dict[str, Any] | None = None) -> str:
    """The effect the policy would give this person for `action` on the job now, asked as its service asks."""
    return decide(gw, session, caller, action, targets=[job], project=job.project, params=params,
                  reason=_ASKED_WITH_A_REASON, record=False).decision.effect


def _floor(value: float, places: int) -> float:
    """Rounded down: a ceiling shown or sent rounded up would be refused."""
    scale = 10.0**places
    return math.floor(value * scale) / scale


def offers(gw: Gateway, session: Session, caller: Caller, job: Job, row: SchedJob | None) -> Offers:
    """The controls to show on `job`, each where its own decision would not deny it (pause: only where it is
    allowed outright, as its service refuses a pause that needs a second person)."""
    stop = not_stoppable(job) is None and _open(gw, session, caller, job, "job.stop") != "deny"
    pause = job.state in STOPPABLE_STATES and _open(gw, session, caller, job, "job.pause", {
        "checkpoint_retention": retention.stated(job, retention.important_days(gw)),
        "resume_priority_rule": lifecycle.RESUME_PRIORITY_RULE}) == "allow"
    resume = job.state == "paused" and _open(gw, session, caller, job, "job.resume",
                                             {"resume_priority_rule": lifecycle.RESUME_PRIORITY_RULE}) != "deny"
    if row is None or job.state in PAST_STATES:
        return Offers(stop=stop, pause=pause, resume=resume)
    # The figures the policy judges an owner's own change by (A2): the priority now and without its manual part.
    now, unadjusted = facts.priority_standing(session, [job.id])[job.id]
    # Asked with its own value, the change nobody's order depends on: who may touch this job's priority at all.
    priority = _open(gw, session, caller, job, "job.priority", {"priority": now}) != "deny"
    mine = caller.real_identity in (job.owner, job.creator)
    manual = now - unadjusted
    may_raise = "job.priority.any" in gw.policy.capabilities(caller.real_identity, job.project)
    return Offers(stop=stop, pause=pause, resume=resume, priority=priority, priority_value=_floor(now, 2),
                  alone_up_to=_floor(max(now, unadjusted), 2) if mine and not may_raise else None,
                  restore_to=_floor(unadjusted, 3) if mine and abs(manual) >= 0.005 else None)


def _after(job_id: str, approval_id: str | None) -> RedirectResponse:
    """To the approval a second person must give, or back to the job."""
    return RedirectResponse(f"/ui/approvals/{approval_id}" if approval_id else f"/ui/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/priority")
@page
def set_priority(request: Request, job_id: str, csrf: Field_ = None, priority: Field_ = None,
                 restore: Field_ = None, reason: Field_ = None, ticket: Field_ = None) -> Response:
    """POST /v1/jobs/{id}/priority's service. `restore` sets the job back to what the scheduler alone gives it,
    as `jobgate job priority ID --restore` does."""
    view = need_view(request)
    view.require_csrf(csrf)
    with view.gw.transaction() as session:
        if restore:
            if session.get(SchedJob, job_id) is None:
                raise NotFound(f"job {job_id} has no priority to restore yet")
            value: float = _floor(facts.priority_standing(session, [job_id])[job_id][1], 3)
        else:
            try:
                value = float((priority or "").strip())
            except ValueError as e:
                raise Invalid(f"a priority is a number (higher runs first), not {priority!r}") from e
        try:
            body = PriorityRequest(priority=value, reason=(reason or "").strip() or None,
                                   ticket=(ticket or "").strip() or None)
        except ValidationError as e:
            raise Invalid("a priority is a number from -1,000,000 to 1,000,000, a reason at most 1000 characters"
                          " and a ticket at most 200") from e
        out, _ = change_priority(view.gw, session, view.caller(session), job_id, body)
    return _after(job_id, out.approval_id)


@router.post("/jobs/{job_id}/pause")
@page
def pause(request: Request, job_id: str, csrf: Field_ = None, reason: Field_ = None,
          ticket: Field_ = None) -> Response:
    """POST /v1/jobs/{id}/pause's service: a graceful stop that keeps the checkpoint; the job ends `paused`."""
    view = need_view(request)
    view.require_csrf(csrf)
    try:
        body = Reasoned(reason=(reason or "").strip(), ticket=(ticket or "").strip() or None)
    except ValidationError as e:
        raise Invalid("a pause needs a written reason of 3 to 2000 characters, and a ticket is at most 200") from e
    with view.gw.transaction() as session:
        lifecycle.pause(view.gw, session, view.caller(session), job_id, body.reason, body.ticket)
    return _after(job_id, None)


@router.post("/jobs/{job_id}/resume")
@page
def resume(request: Request, job_id: str, csrf: Field_ = None, reason: Field_ = None) -> Response:
    """POST /v1/jobs/{id}/resume's service: back in its queue with its priority and the wait it had (P2)."""
    view = need_view(request)
    view.require_csrf(csrf)
    try:
        body = ResumeBody(reason=(reason or "").strip() or None)
    except ValidationError as e:
        raise Invalid("a resume's reason is at most 2000 characters") from e
    with view.gw.transaction() as session:
        _, _, approval = lifecycle.resume(view.gw, session, view.caller(session), job_id, body.reason)
        approval_id = approval.id if approval is not None else None
    return _after(job_id, approval_id)
