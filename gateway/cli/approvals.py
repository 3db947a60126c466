"""`jobgate approvals list|show`, `jobgate approve ID`, `jobgate reject ID --reason`: the second person's tools.

M2: the second person sees exactly what they confirm, every field the request's digest binds (action, target
ids, project, parameters, reason, granularity) before they approve it.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gateway.cli.client import Client, ClientGroup, client_options, emit_json, table
from gateway.cli.jobs import who_confirms

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


def _text(text: str | None) -> str:
    """Free text (a reason, a ticket) as is, unless it holds a character that could fake the lines around it
    (a newline, a control or direction character): then JSON-escaped."""
    return "-" if text is None else text if text.isprintable() else json.dumps(text)


def _summary(a: dict[str, Any]) -> str:
    lines = [
        f"{a['id']}  {a['action']}  [{a['state']}]  requested by {a['requester']}"
        + (f" (for {a['requester_real']})" if a["requester_real"] != a["requester"] else ""),
        f"  targets ({len(a['targets'])}): {', '.join(a['targets'])}",
        f"  reason: {_text(a['reason'])}" + (f"  ticket: {_text(a['ticket'])}" if a.get("ticket") else ""),
        f"  expires {a['expires_at']}; approvals so far: {', '.join(x['by'] for x in a['approvals']) or 'none'}",
    ]
    if a.get("blast_radius"):
        lines.append(f"  blast radius: {_radius(a['blast_radius'])}")
    if a.get("resolution", {}).get("skipped"):
        skipped = [f"{j['id']} ({j['state']})" if isinstance(j, dict) else str(j) for j in a["resolution"]["skipped"]]
        lines.append(f"  skipped (ended meanwhile): {', '.join(skipped)}")
    return "\n".join(lines)


LIST_TARGETS = 2  # target ids a row of `approvals list` names before "+N more"
_QUOTA_FIELDS = ("gpus", "borrow_limit", "lend_limit", "users", "effective_from", "effective_until")


def _value(value: Any) -> str:
    """A parameter as the digest binds it: JSON (`null`, `"a b"`, `["a"]`), not Python's repr, with every
    newline and control or direction character escaped, so no value can draw lines of its own."""
    return json.dumps(value, sort_keys=True)


def _changes(params: dict[str, Any]) -> str:
    """`gpus 32 -> 64, borrow_limit 0 -> 8`: the fields a quota change sets, each with what it was."""
    before = params.get("before") if isinstance(params.get("before"), dict) else None
    parts = []
    for key in _QUOTA_FIELDS:
        if key not in params:
            continue
        new = _value(params[key])
        if before is None:
            parts.append(f"{key} {new}")
        elif before.get(key) != params[key]:
            parts.append(f"{key} {_value(before.get(key))} -> {new}")
    return ", ".join(parts) or "no field changes"


def what(a: dict[str, Any]) -> str:
    """What a request without target jobs would do, in a line: `quota vision: gpus 32 -> 64`,
    `break-glass for vision: job.stop.any, 2h, 3 use(s)`; otherwise the action and its parameters."""
    params = a.get("params") or {}
    if a["action"] == "quota.change":
        project = a.get("project")
        tenant = "cluster cap" if project == "*" else f"quota {project}"
        return f"{tenant}{' (new)' if params.get('before') is None else ''}: {_changes(params)}"
    if a["action"] == "breakglass.request":
        hours = float(params.get("duration_seconds") or 0) / 3600
        return (f"break-glass for {', '.join(params.get('projects') or []) or '-'}:"
                f" {', '.join(params.get('actions') or []) or '-'}, {hours:g}h, {params.get('max_uses')} use(s)")
    shown = ", ".join(f"{k}={_value(v)}" for k, v in sorted(params.items()))
    return f"{a['action']} {shown}".strip()


def _clipped(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def what_cell(a: dict[str, Any]) -> str:
    """What a list row's request does, in words (`priority 520 -> 900`, `stop 1 job`), from the gateway's
    summary; `-` from a gateway that sends none."""
    summary = a.get("summary")
    return _clipped(_text(summary.get("short"))) if isinstance(summary, dict) and summary.get("short") else "-"


def targets_cell(a: dict[str, Any]) -> str:
    """`j-1, j-2 +3 more` for a list row; a request without targets says what it would do instead."""
    ids = a["targets"]
    if not ids:
        return _clipped(what(a))
    more = len(ids) - LIST_TARGETS
    return ", ".join(ids[:LIST_TARGETS]) + (f" +{more} more" if more > 0 else "")


def _still_required(required: dict[str, Any]) -> str:
    count = int(required.get("count") or 0)
    if count <= 0:
        return "none"
    who = who_confirms(required)
    return f"{count} approval(s)" + (f", from {who}" if who else "")


def _said(a: dict[str, Any]) -> list[str]:
    """The gateway's summary in words (approval_summary): the action and every parameter before -> after. Free text
    in it (a job name, a reason) is escaped as everywhere else, so it cannot draw lines of its own."""
    summary = a.get("summary")
    if not isinstance(summary, dict):
        return []  # a gateway from before summaries: the fields below still say everything
    out = [f"  what: {_text(summary.get('what'))}"]
    out += [f"    {_text(c.get('text'))}" for c in summary.get("changes") or [] if isinstance(c, dict)]
    return out


def describe(a: dict[str, Any]) -> str:
    """Every field of one request, for `approvals show`: what the second person confirms (M2)."""
    lines = [
        f"{a['id']}  {a['action']}  [{a['state']}]",
        *_said(a),
        f"  requested by {a['requester']}" + (f" (for {a['requester_real']})"
                                              if a["requester_real"] != a["requester"] else "")
        + f" at {a['created_at']}; decision recorded at ledger seq {a['decision_seq']}",
        f"  reason: {_text(a['reason'])}" + (f"  ticket: {_text(a['ticket'])}" if a.get("ticket") else ""),
        f"  project: {a.get('project') or '-'}, granularity: {a['granularity']}",
    ]
    if a["targets"]:
        lines.append(f"  targets ({len(a['targets'])}):")
        lines.extend(f"    {t}" for t in a["targets"])
    else:
        lines.append(f"  targets: none; what: {what(a)}")
    params = a.get("params") or {}
    lines.append("  params:" + ("" if params else " none"))
    lines.extend(f"    {k}: {_value(v)}" for k, v in sorted(params.items()))
    lines.append(f"  blast radius: {_radius(a['blast_radius']) if a.get('blast_radius') else '-'}")
    lines.append(f"  digest: {a['digest']}")
    given = [f"{x['by']}" + (f" at {x['at']}" if x.get("at") else "")
             + (f" ({_text(x['comment'])})" if x.get("comment") else "") for x in a["approvals"]]
    lines.append(f"  approvals so far: {'; '.join(given) or 'none'}")
    summary = a["summary"] if isinstance(a.get("summary"), dict) else {}
    if a["state"] == "pending":
        lines.append(f"  still needed: {_text(summary['still_needed'])}" if summary.get("still_needed")
                     else f"  still required: {_still_required(a.get('required') or {})}")
        lines.append(f"  expires {a['expires_at']}")
    else:
        lines.append(f"  {a['state']} at {a.get('resolved_at') or '-'}"
                     + (f" by {a['resolved_by']}" if a.get("resolved_by") else "")
                     + f" (it would have expired {a['expires_at']})")
        if a.get("resolution", {}).get("skipped"):
            skipped = [f"{j['id']} ({j['state']})" if isinstance(j, dict) else str(j)
                       for j in a["resolution"]["skipped"]]
            lines.append(f"  skipped (ended meanwhile): {', '.join(skipped)}")
    return "\n".join(lines)


@click.group("approvals", cls=ClientGroup)
def approvals_group() -> None:
    """Approval requests (two-person rule)."""


@approvals_group.command("list")
@click.option("--state", type=click.Choice(["pending", "executed", "rejected", "expired"]), default="pending",
              show_default=True, help="Only requests in this state.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def list_approvals(client: Client, state: str, as_json: bool) -> None:
    """Requests you made or could approve; `jobgate approvals show ID` prints one in full."""
    found = client.request("GET", "approvals", params={"state": state})["approvals"]
    if as_json:
        emit_json(found)
        return
    rows = [{**a, "what": what_cell(a), "targets": targets_cell(a), "reason": _text(a["reason"])} for a in found]
    click.echo(table(rows, [("id", "id"), ("action", "action"), ("what", "what"), ("requester", "requester"),
                            ("targets", "targets"), ("reason", "reason"), ("expires_at", "expires")]))


@approvals_group.command("show")
@click.argument("approval_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def show_approval(client: Client, approval_id: str, as_json: bool) -> None:
    """Everything APPROVAL_ID would do: action and every parameter before -> after, every target id, reason,
    blast radius, the digest an approval is bound to, who approved so far, who still must, and when it expires."""
    found = client.request("GET", "approvals", approval_id)
    if as_json:
        emit_json(found)
    else:
        click.echo(describe(found))


@click.command("approve")
@client_options
@click.argument("approval_id")
@click.option("--comment", help="Optional note kept with your approval.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def approve(gateway: str, token: str | None, trigger: str | None, approval_id: str, comment: str | None,
            as_json: bool) -> None:
    """Approve APPROVAL_ID as the second person; it executes once enough approvals are recorded."""
    body = {"comment": comment} if comment else {}
    result = Client(gateway, token, trigger).request("POST", "approvals", approval_id, "approve", json=body)
    if as_json:
        emit_json(result)
    else:
        click.echo(_summary(result))


@click.command("reject")
@client_options
@click.argument("approval_id")
@click.option("--reason", required=True, help="Why (3 characters or more); ledgered and sent to the requester.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def reject(gateway: str, token: str | None, trigger: str | None, approval_id: str, reason: str,
           as_json: bool) -> None:
    """Reject APPROVAL_ID (or withdraw your own request)."""
    result = Client(gateway, token, trigger).request("POST", "approvals", approval_id, "reject",
                                                     json={"reason": reason})
    if as_json:
        emit_json(result)
    else:
        click.echo(_summary(result))
