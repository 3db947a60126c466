"""`jobgate forensics export`: one offline-verifiable bundle of everything about a job or a period (F4)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import click
import httpx

from gateway.cli.client import Client, ClientGroup, api_path, emit_json, fail


@click.group("forensics", cls=ClientGroup, timeout=300)
def forensics_group() -> None:
    """Freeze and export evidence for an investigation (needs ledger.read: auditors, security reviewers)."""


@forensics_group.command("export")
@click.option("--job", "job_id", help="Everything about this job.")
@click.option("--since", help="Everything since this ISO 8601 time, e.g. 2026-11-29T10:00:00+00:00.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Bundle file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def export_cmd(client: Client, job_id: str | None, since: str | None, out: Path, as_json: bool) -> None:
    """Write, in order: the ledger range with proofs and checkpoints, the queue snapshots, the scheduler's
    job events, the node-side process records and evidence, and checkpoint integrity results.

    Verify offline: `jobgate ledger verify --bundle FILE --public-key <data-dir>/keys/ledger.vkey`.
    """
    if (job_id is None) == (since is None):
        fail("give exactly one of --job or --since")
    body: dict[str, str] = {"job_id": job_id} if job_id else {}
    if since:
        try:
            body["since"] = datetime.fromisoformat(since).isoformat()
        except ValueError:
            fail(f"--since {since!r} is not an ISO 8601 time")
    try:
        r = client.http.post(api_path("forensics", "exports"), json=body)
    except httpx.HTTPError as e:
        fail(f"cannot reach the gateway at {client.url} ({e.__class__.__name__}: {e})")
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail") or r.json().get("title")
        except ValueError:
            detail = r.text.strip()[:300]
        fail(f"{r.status_code} {detail}")
    tmp = out.with_name(out.name + ".part")
    try:
        tmp.write_bytes(r.content)
        os.replace(tmp, out)
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")
    summary = json.loads(r.headers.get("x-jobgate-forensics", "{}"))
    summary["out"] = str(out)
    summary["bytes"] = len(r.content)
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"Wrote {out}: ledger entries {summary.get('from_seq')}..{summary.get('to_seq')}"
                   f" for {len(summary.get('jobs', []))} job(s); sections at seq "
                   + ", ".join(f"{x['name']} {x['seq']}" for x in summary.get("sections") or []))
        click.echo(f"Verify: jobgate ledger verify --bundle {out} --public-key <data-dir>/keys/ledger.vkey")
