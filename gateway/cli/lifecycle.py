"""`jobgate job priority|pause|resume`: what a researcher does to her own job besides submitting and stopping it
(A2, A5). The API had these from the start; without commands a newcomer had to find the bodies in /docs."""

from __future__ import annotations

import math
from typing import Any

import click

from gateway.cli.client import Client, emit_json
from gateway.cli.jobs import echo_needs_approval, job_group


def _manual_part(client: Client, job_id: str) -> tuple[float, float]:
    """The job's effective priority and its manual part, as `jobgate job why` shows them."""
    q = client.request("GET", "jobs", job_id, "queue")["priority"]
    return float(q["effective"] or 0.0), float((q.get("parts") or {}).get("manual") or 0.0)


@job_group.command("priority")
@click.argument("job_id")
@click.argument("value", type=float, required=False)
@click.option(
    "--restore",
    is_flag=True,
    help="Take your own lowering back: set the job to what the scheduler alone gives it (its priority "
    "without the manual part shown by `jobgate job why`).",
)
@click.option("--reason", help="Written reason; needed for another's job or a raise (A3), kept in the ledger.")
@click.option("--ticket", help="Linked ticket or incident id.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def priority(
    client: Client,
    job_id: str,
    value: float | None,
    restore: bool,
    reason: str | None,
    ticket: str | None,
    as_json: bool,
) -> None:
    """Set JOB_ID's priority to VALUE (higher runs first), e.g. `jobgate job priority ID 100` to give way;
    without VALUE, show it.

    Your own job: at once, up to the higher of its priority now and what the scheduler alone gives it; so you
    may lower it and later take that back with `--restore`. A higher value, or another's job, needs a queue
    admin or on-call, `--reason` and a second person (the answer names the approval)."""
    if restore and value is not None:
        raise click.UsageError("give VALUE or --restore, not both")
    if value is None:
        effective, manual = _manual_part(client, job_id)
        unadjusted = effective - manual
        manual = manual if abs(manual) >= 0.005 else 0.0  # what `jobgate job why` shows as no manual part
        if not restore:
            click.echo(
                f"{job_id}: priority {effective:.1f}; the scheduler alone gives it {unadjusted:.1f}"
                f" (manual part {manual:+.1f}). Set it with `jobgate job priority {job_id} VALUE`"
                + (", or take the manual part back with --restore" if manual else "")
            )
            return
        if not manual:
            click.echo(f"{job_id}: nothing to restore (no manual change in force; priority {effective:.1f})")
            return
        # Rounded down so that aging between this read and the write cannot push it past the A2 limit.
        value = math.floor(unadjusted * 1000) / 1000
    body: dict[str, Any] = {
        "priority": value,
        **({"reason": reason} if reason else {}),
        **({"ticket": ticket} if ticket else {}),
    }
    r = client.request("POST", "jobs", job_id, "priority", json=body)
    if as_json:
        emit_json(r)
    elif r.get("approval_id"):
        echo_needs_approval(job_id, r["decision"], r["approval_id"])
    else:
        click.echo(
            f"{job_id}: priority {r['priority_before']:.1f} -> {r['priority_after']:.1f}"
            f"  [decision recorded at ledger seq {r['decision']['ledger_seq']}]"
        )


@job_group.command("pause")
@click.argument("job_id")
@click.option("--reason", required=True, help="Written reason (3 characters or more); kept in the ledger.")
@click.option("--ticket", help="Linked ticket or incident id.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def pause(client: Client, job_id: str, reason: str, ticket: str | None, as_json: bool) -> None:
    """Pause JOB_ID: prepare signal, grace window, then SIGKILL, as for a stop; the job ends `paused`, its
    checkpoint is kept, and `jobgate job resume` puts it back in its queue with its priority."""
    body = {"reason": reason, **({"ticket": ticket} if ticket else {})}
    r = client.request("POST", "jobs", job_id, "pause", json=body)
    if as_json:
        emit_json(r)
    else:
        state = r["job"]["state"]
        click.echo(
            f"{job_id}: {state}  [decision recorded at ledger seq {r['decision']['ledger_seq']}]"
            + ("" if state == "paused" else f"; it is paused once it has exited (`jobgate job show {job_id}`)")
        )


@job_group.command("resume")
@click.argument("job_id")
@click.option("--reason", help="Why; kept in the ledger.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def resume(client: Client, job_id: str, reason: str | None, as_json: bool) -> None:
    """Resume a paused JOB_ID: it goes back to its queue keeping its priority and the wait it had (P2)."""
    r = client.request("POST", "jobs", job_id, "resume", json={"reason": reason} if reason else None)
    if as_json:
        emit_json(r)
    elif r.get("approval_id"):
        echo_needs_approval(job_id, r["decision"], r["approval_id"])
    else:
        click.echo(
            f"{job_id}: {r['job']['state']}  [decision recorded at ledger seq {r['decision']['ledger_seq']}];"
            f" `jobgate job why {job_id}` shows its place in the queue"
        )


@job_group.command("confirm-stopped")
@click.argument("job_id")
@click.option("--reason", required=True, help="How you know it no longer runs (3 characters or more); ledgered.")
@click.option("--ticket", help="Linked ticket or incident id.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def confirm_stopped(client: Client, job_id: str, reason: str, ticket: str | None, as_json: bool) -> None:
    """On-call: confirm that JOB_ID, whose stop its node could not confirm (stop_failed) or whose node is lost,
    no longer runs. It becomes `stopped` (outcome confirmed) and its withheld GPUs are released; if the node
    comes back, its agent is told to stop the job."""
    body = {"reason": reason, **({"ticket": ticket} if ticket else {})}
    r = client.request("POST", "jobs", job_id, "confirm-stopped", json=body)
    if as_json:
        emit_json(r)
    elif r.get("approval_id"):
        echo_needs_approval(job_id, r["decision"], r["approval_id"])
    else:
        click.echo(f"{job_id}: {r['job']['state']} (confirmed)  [decision recorded at ledger seq"
                   f" {r['decision']['ledger_seq']}]")
