"""/v1/jobs: submit, list, show and stop jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from gateway.api.deps import Ctx, JobId
from gateway.decisions import verdict
from gateway.jobs import records, retention, stops, submission
from gateway.schemas import JobList, JobOut, JobSubmit, StopRequest, StopResponse

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut, summary="Submit a job")
async def submit_job(spec: JobSubmit, ctx: Ctx) -> JobOut:
    """Queue a job after the admission pre-check (Q1). Creator is the caller; owner defaults to the caller."""
    job, _ = await submission.submit(ctx.gw, ctx.caller, spec)
    return records.job_out(job)


@router.get("", response_model=JobList, summary="List jobs you may see")
def list_jobs(
    ctx: Ctx,
    project: Annotated[str | None, Query(description="Only this project")] = None,
    state: Annotated[str | None, Query(description="Only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 100,
) -> JobList:
    """Newest first, from the projects where you may view jobs (your own jobs always)."""
    with ctx.gw.transaction(immediate=False) as session:
        found = records.list_jobs(ctx.gw, session, ctx.caller(session), project=project, state=state, limit=limit)
        return JobList(jobs=[records.job_out(j) for j in found])


@router.get("/{job_id}", response_model=JobOut, summary="Show one job")
def show_job(job_id: JobId, ctx: Ctx) -> JobOut:
    """State, placement, the four ownerships and, once stopped, the stop evidence and how long its checkpoints
    are kept."""
    with ctx.gw.transaction(immediate=False) as session:
        job = records.get_job(ctx.gw, session, ctx.caller(session), job_id)
        kept = retention.retention_out(session, job.id)
        return records.job_out(job).model_copy(update={"checkpoint_retention": kept})


@router.post(
    "/{job_id}/stop",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=StopResponse,
    summary="Stop a job (graceful window, then forced)",
)
def stop_job(job_id: JobId, body: StopRequest, ctx: Ctx) -> StopResponse:
    """Decided by policy and recorded in the ledger before anything changes. A queued job is cancelled at
    once; a running one gets its prepare signal, its grace window, then SIGKILL. Poll the job for
    `stopped` and its evidence. When policy requires a second person, the response carries
    `approval_id` and nothing changes until someone eligible approves it."""
    with ctx.gw.transaction() as session:
        job, rec, approval = stops.stop(ctx.gw, session, ctx.caller(session), job_id, body)
        return StopResponse(job=records.job_out(job), decision=verdict.decision_out(rec),
                            approval_id=approval.id if approval else None)
