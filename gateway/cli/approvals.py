"""`jobgate approvals list`, `jobgate approve ID`, `jobgate reject ID --reason`: the second person's tools."""

from __future__ import annotations

from typing import Any

import click

from gateway.cli.client import Client, client_options, emit_json, table


def _client(gateway: str, token: str | None, trigger: str | None) -> Client:
    return Client(gateway, token, trigger)


_RADIUS_LABELS = {"jobs": "job(s)", "running": "running", "gpus": "GPU(s)", "gpu_hours_at_stake": "GPU-hours at stake"}


def _radius(radius: dict[str, Any]) -> str:
    """`3 job(s), 2 running, 16 GPU(s), 41.5 GPU-hours at stake, projects speech, vision`, not a Python dict."""
    parts = [f"{radius[k]} {label}" for k, label in _RADIUS_LABELS.items() if k in radius]
    for key, value in radius.items():
        if key == "projects" and isinstance(value, list):
            parts.append(f"project(s) {', '.join(map(str, value)) or '-'}")
        elif key not in _RADIUS_LABELS:
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def _summary(a: dict[str, Any]) -> str:
    lines = [
        f"{a['id']}  {a['action']}  [{a['state']}]  requested by {a['requester']}"
        + (f" (for {a['requester_real']})" if a["requester_real"] != a["requester"] else ""),
        f"  targets ({len(a['targets'])}): {', '.join(a['targets'])}",
        f"  reason: {a['reason']}" + (f"  ticket: {a['ticket']}" if a.get("ticket") else ""),
        f"  expires {a['expires_at']}; approvals so far: {', '.join(x['by'] for x in a['approvals']) or 'none'}",
    ]
    if a.get("blast_radius"):
        lines.append(f"  blast radius: {_radius(a['blast_radius'])}")
    if a.get("resolution", {}).get("skipped"):
        skipped = [f"{j['id']} ({j['state']})" if isinstance(j, dict) else str(j) for j in a["resolution"]["skipped"]]
        lines.append(f"  skipped (ended meanwhile): {', '.join(skipped)}")
    return "\n".join(lines)


@click.group("approvals")
def approvals_group() -> None:
    """Approval requests (two-person rule)."""


@approvals_group.command("list")
@client_options
@click.option("--state", type=click.Choice(["pending", "executed", "rejected", "expired"]), default="pending",
              show_default=True, help="Only requests in this state.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def list_approvals(gateway: str, token: str | None, trigger: str | None, state: str, as_json: bool) -> None:
    """Requests you made or could approve."""
    found = _client(gateway, token, trigger).request("GET", "approvals", params={"state": state})["approvals"]
    if as_json:
        emit_json(found)
        return
    rows = [{**a, "targets": ",".join(a["targets"]), "n": len(a["targets"])} for a in found]
    click.echo(table(rows, [("id", "id"), ("action", "action"), ("requester", "requester"), ("n", "jobs"),
                            ("reason", "reason"), ("expires_at", "expires")]))


@click.command("approve")
@client_options
@click.argument("approval_id")
@click.option("--comment", help="Optional note kept with your approval.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def approve(gateway: str, token: str | None, trigger: str | None, approval_id: str, comment: str | None,
            as_json: bool) -> None:
    """Approve APPROVAL_ID as the second person; it executes once enough approvals are recorded."""
    body = {"comment": comment} if comment else {}
    result = _client(gateway, token, trigger).request("POST", "approvals", approval_id, "approve", json=body)
    if as_json:
        emit_json(result)
    else:
        click.echo(_summary(result))


@click.command("reject")
@client_options
@click.argument("approval_id")
@click.option("--reason", required=True, help="Why; kept in the ledger and sent to the requester.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def reject(gateway: str, token: str | None, trigger: str | None, approval_id: str, reason: str,
           as_json: bool) -> None:
    """Reject APPROVAL_ID (or withdraw your own request)."""
    result = _client(gateway, token, trigger).request("POST", "approvals", approval_id, "reject",
                                                      json={"reason": reason})
    if as_json:
        emit_json(result)
    else:
        click.echo(_summary(result))
