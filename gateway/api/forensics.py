"""/v1/forensics/exports: freeze the evidence about a job (or a period) in F4 order and download it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.deps import Ctx
from gateway.jobs import forensics
from gateway.schemas import Name

router = APIRouter(prefix="/v1/forensics", tags=["forensics"])

SUMMARY_HEADER = "X-Jobgate-Forensics"


class ExportRequest(BaseModel):
    """What to freeze: one job's story, or everything since a time; exactly one of the two."""

    model_config = ConfigDict(extra="forbid")

    job_id: Name | None = Field(None, description="Everything the ledger holds about this job.")
    since: datetime | None = Field(None, description="Everything from this time on (aware timestamp).")


@router.post("/exports", summary="Freeze and download a forensics bundle (F4)",
             response_class=Response, responses={200: {"content": {"application/x-ndjson": {}}}})
def export(body: ExportRequest, ctx: Ctx) -> Response:
    """Appends, in order, the queue snapshot, the scheduler's job events, the node-side process records and
    evidence, and the checkpoint integrity results to the ledger as signed entries, then returns the ledger
    range (with proofs, blobs and checkpoints) as one `jobgate-ledger-bundle/1` file. Verify it offline
    with `jobgate ledger verify --bundle FILE --public-key <data-dir>/keys/ledger.vkey`. Needs `ledger.read`."""
    since = body.since
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    with ctx.gw.transaction() as session:
        data, summary = forensics.export(ctx.gw, session, ctx.caller(session), job_id=body.job_id, since=since,
                                         exported_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return Response(data, media_type="application/x-ndjson",
                    headers={SUMMARY_HEADER: json.dumps(summary, sort_keys=True)})
