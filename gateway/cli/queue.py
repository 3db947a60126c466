"""`jobgate job why`, `jobgate job renew`, `jobgate queue`, `jobgate stats preemptions`, `jobgate quota`:
what the scheduler thinks, for the person waiting (Q9, Q10) and the admin (A7)."""

from __future__ import annotations

from typing import Any

import click

from gateway.cli.client import Client, ClientGroup, client_options, emit_json, fail, table
from gateway.cli.jobs import job_group


def _parts(parts: dict[str, Any]) -> str:
    """`baseline 500 + contribution 20 + aging 0.42`: two decimals at most, and parts that round to 0 left out
    (aging a few seconds old is 7e-06, which only reads as noise)."""
    keys = ("baseline", "contribution", "aging", "fairshare", "compensation", "manual", "slurm")
    shown = ((k, round(float(parts[k]), 2)) for k in keys if parts.get(k))
    return " + ".join(f"{k} {v:g}" for k, v in shown if v)


def describe_why(q: dict[str, Any]) -> str:
    lines = [f"{q['job_id']}  [{q['state']}]  queue {q['queue']}"]
    if q["position"] is not None:
        lines.append(f"  position {q['position']} of {q['queue_length']} waiting in {q['queue']}")
    pr = q["priority"]
    if pr["effective"] is not None:
        lines.append(f"  effective priority {pr['effective']:.1f} = {_parts(pr['parts']) or '0'}")
    if q["blocking_reason"]:
        # Only a pending job waits; for one that runs or ended the API gives its state reason instead.
        label = "waiting because" if q["state"] == "pending" else "state reason"
        lines.append(f"  {label}: {q['blocking_reason']}")
    if q["state"] == "pending":
        est = q["estimated_start"] or ("unknown (the GPUs it needs are withheld or on degraded nodes, or no running"
                                       " job's end makes room for it under its quota)")
        lines.append(f"  estimated start: {est}" + (f" (as of {q['estimated_at']})" if q["estimated_at"] else ""))
    if q.get("slurm"):
        s = q["slurm"]
        est = f", expected start {s['estimated_start']} (squeue --start)" if s["estimated_start"] else ""
        reason = f" ({s['reason']})" if s["reason"] and s["state"] == "PENDING" else ""
        lines.append(f"  Slurm says: job {s['slurm_job_id']} on {s['cluster']} {s['state']}{reason}, priority "
                     f"{s['priority'] if s['priority'] is not None else '-'}{est}")
    if q.get("quota"):
        lines.append(f"  {'running' if q['state'] in ('starting', 'running') else 'ran'} on {q['quota']} quota")
    if q["preemptions"]:
        lines.append(f"  preempted {q['preemptions']} time(s); wait carried over {q['wait_credit_s']:.0f} s")
    others = [o for o in q["others_in_queue"] if not o["this_job"]]
    if others:
        shown = ", ".join(f"#{o['position']} {o['priority']}" for o in others[:10])
        lines.append(f"  others in {q['queue']}: {shown}" + (" ..." if len(others) > 10 else ""))
    for h in q["priority_history"][-5:]:
        lines.append(f"  {h['at']}  {h['basis']}: {h['before'] if h['before'] is not None else '-'} -> "
                     f"{h['after']:.1f}" + (f"  ({h['note']})" if h["note"] else ""))
    return "\n".join(lines)


@job_group.command("why")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the full explanation as JSON.")
@click.pass_obj
def why(client: Client, job_id: str, as_json: bool) -> None:
    """Why JOB_ID waits: queue position, priority and its parts, blocking reason, estimated start."""
    q = client.request("GET", "jobs", job_id, "queue")
    emit_json(q) if as_json else click.echo(describe_why(q))


@job_group.command("renew")
@click.argument("job_id")
@click.option("--progress", required=True, help="What the job has achieved so far (kept in the ledger).")
@click.option("--remaining", "remaining_s", type=float, required=True, help="Expected remaining seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def renew(client: Client, job_id: str, progress: str, remaining_s: float, as_json: bool) -> None:
    """Renew a long job past its maximum continuous occupancy (P3); without it, it is stopped and requeued."""
    r = client.request("POST", "jobs", job_id, "renew",
                       json={"progress": progress, "expected_remaining_seconds": remaining_s})
    emit_json(r) if as_json else click.echo(f"{job_id}: renewed until {r['occupancy_until']}")


@click.command("queue")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def queue_cmd(gateway: str, token: str | None, trigger: str | None, as_json: bool) -> None:
    """The queues: waiting jobs' priorities (ids only where you may see them) and cluster usage."""
    data = Client(gateway, token, trigger).request("GET", "queues")
    if as_json:
        emit_json(data)
        return
    c = data["cluster"]
    click.echo(f"cluster: {c['in_use']} of {c['gpus']} GPUs in use, {c['free']} free")
    for tenant, use in sorted(c["by_tenant"].items()):
        click.echo(f"  {tenant}: {use['owned']} owned, {use['borrowed']} borrowed")
    for name, q in data["queues"].items():
        click.echo(f"\n{name}: {q['waiting']} waiting")
        if q["jobs"]:
            click.echo(table(q["jobs"][:50], [("position", "#"), ("priority", "priority"), ("id", "id"),
                                              ("project", "project"), ("gpus", "gpus")]))


@click.group("stats", cls=ClientGroup)
def stats_group() -> None:
    """Scheduler statistics."""


@stats_group.command("preemptions")
@click.option("--by", type=click.Choice(["tenant"]), default="tenant", show_default=True,
              help="Break the counts down by this.")
@click.option("--month", "period", flag_value="month", default=True, help="Per calendar month (default).")
@click.option("--quarter", "period", flag_value="quarter", help="Per calendar quarter.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def preemption_stats(client: Client, by: str, period: str, as_json: bool) -> None:
    """Preemptions per tenant: count and GPU-hours lost (Q9)."""
    data = client.request("GET", "stats", "preemptions", params={"by": by, "period": period})
    if as_json:
        emit_json(data)
    else:
        click.echo(table(data["rows"], [("tenant", "tenant"), ("period", period), ("count", "preemptions"),
                                        ("gpu_hours_lost", "gpu-hours lost")]))


@click.group("quota", cls=ClientGroup)
def quota_group() -> None:
    """Show and change quotas (changes need a second platform admin, A7)."""


@quota_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def quota_list(client: Client, as_json: bool) -> None:
    """Quota tiers and what each tenant uses now."""
    data = client.request("GET", "quotas")
    if as_json:
        emit_json(data)
        return
    rows = [{**q, "owned": q["in_use"]["owned"], "borrowed": q["in_use"]["borrowed"]} for q in data["quotas"]]
    click.echo(table(rows, [("project", "project"), ("gpus", "gpus"), ("borrow_limit", "borrow limit"),
                            ("lend_limit", "lend limit"), ("owned", "owned"), ("borrowed", "borrowed")]))


@quota_group.command("set")
@click.argument("project")
@click.option("--gpus", type=int, required=True, help="GPUs the tenant owns ('*' project: cluster hard cap).")
@click.option("--borrow-limit", type=int, help="Most GPUs it may borrow (default 0; -1: no limit).", default=0)
@click.option("--lend-limit", type=int, help="Most idle GPUs it lends (default: all).")
@click.option("--user", "users", multiple=True, help="user=GPUS per-user limit, repeatable.")
@click.option("--from", "effective_from", help="Effective from (ISO 8601).")
@click.option("--until", "effective_until", help="Effective until (ISO 8601).")
@click.option("--reason", required=True, help="Written reason; kept in the ledger.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def quota_set(client: Client, project: str, gpus: int, borrow_limit: int, lend_limit: int | None,
              users: tuple[str, ...], effective_from: str | None, effective_until: str | None, reason: str,
              as_json: bool) -> None:
    """Ask to change PROJECT's quota; prints the approval id a second platform admin must approve."""
    limits: dict[str, int] = {}
    for item in users:
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            fail(f"--user {item!r} must look like user=GPUS")
        limits[name] = int(value)
    body: dict[str, Any] = {"gpus": gpus, "borrow_limit": None if borrow_limit < 0 else borrow_limit,
                            "lend_limit": lend_limit, "users": limits, "reason": reason,
                            "effective_from": effective_from, "effective_until": effective_until}
    r = client.request("PUT", "quotas", project, json=body)
    if as_json:
        emit_json(r)
    elif "approval_id" in r:
        click.echo(f"quota change for {project} needs a second platform admin: approval {r['approval_id']}")
    else:
        click.echo(f"quota of {project} changed: {r['applied']['after']}")
