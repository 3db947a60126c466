"""`jobgate job ...`: submit, list, show and stop jobs through the gateway's HTTP API."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, get_args

import click

from gateway.cli.client import Client, ClientGroup, emit_json, fail, table
from gateway.schemas import StopSignal
from gateway.store.states import JOB_STATES

JOB_COLUMNS = [("id", "id"), ("name", "name"), ("project", "project"), ("queue", "queue"), ("state", "state"),
               ("gpus", "gpus"), ("owner", "owner"), ("where", "where")]


def _row(job: dict[str, Any]) -> dict[str, Any]:
    return {
        **job,
        "gpus": f"{job['nodes']}x{job['gpus_per_node']}",
        "owner": job["ownership"]["owner"],
        "where": ",".join(p["node"] for p in job["placement"]) or job.get("state_reason", "")[:40],
    }


def who_confirms(required: dict[str, Any]) -> str:
    """`alice, or someone holding oncall or queue_admin in vision or cluster-wide`: whom to hand the id to."""
    projects = [p for p in required.get("projects") or [] if p != "*"]
    roles = " or ".join(required.get("roles") or [])
    where = f" in {', '.join(projects)}" if projects else ""
    if "*" in (required.get("projects") or []):
        where += " or cluster-wide" if where else " cluster-wide"
    anyone = f"someone holding {roles}{where}" if roles else ""
    return ", or ".join(x for x in (", ".join(required.get("principals") or []), anyone) if x)


def echo_needs_approval(job_id: str, decision: dict[str, Any], approval_id: str | None) -> None:
    """What a 202 means for JOB_ID: why, who may confirm, and the command they run."""
    click.echo(f"{job_id}: needs approval ({'; '.join(decision['reasons'])})")
    if approval_id:
        who = who_confirms(decision.get("approvals_required") or {})
        click.echo(f"  approval {approval_id}: nothing changes until a second person"
                   + (f" ({who})" if who else "")
                   + f" runs `jobgate approve {approval_id}` (`jobgate approvals show {approval_id}` shows them"
                   " exactly what)")


@click.group("job", cls=ClientGroup)
def job_group() -> None:
    """Submit, list, show, stop, pause, resume and reprioritise jobs."""


# The API field behind each of submit's options, for the server's 422s.
SUBMIT_OPTIONS = {"name": "--name", "project": "--project", "queue": "--queue", "gpus_per_node": "--gpus",
                  "nodes": "--nodes", "command": "COMMAND", "grace_seconds": "--grace", "stop_signal": "--signal",
                  "owner": "--owner", "environment": "--environment", "workload": "--workload", "labels": "--label",
                  "runtime_limit_seconds": "--runtime-limit", "mounts": "--mount", "datasets": "--dataset"}


@job_group.command("submit")
@click.option("--name", required=True, help="Human-readable job name.")
@click.option("--project", required=True, help="Project to run in.")
@click.option("--queue", type=click.Choice(["urgent", "normal", "batch"]), default="normal", show_default=True,
              help="Queue to wait in; urgent jobs may preempt others', so only queue admins may use it.")
# The API's bounds (gateway/schemas.py JobSubmit), checked here so that a refusal names the option typed.
@click.option("--gpus", "gpus_per_node", type=click.IntRange(1, 64), default=1, show_default=True,
              help="GPUs per node (1-64).")
@click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True, help="Nodes in the gang.")
@click.option("--grace", "grace_seconds", type=click.FloatRange(0, 3600), default=30.0, show_default=True,
              help="Seconds between the prepare signal and SIGKILL (0-3600).")
@click.option("--signal", "stop_signal", type=click.Choice(get_args(StopSignal)), default="SIGTERM",
              show_default=True, help="Prepare signal.")
@click.option("--owner", help="Responsible owner (default: you).")
@click.option("--environment", type=click.Choice(["research", "staging", "production"]), default="research",
              show_default=True, help="Environment the job belongs to (policy and emergency stops select by it).")
@click.option("--workload", help="Group this job with others of one goal (e.g. a sweep); an emergency stop can "
                                 "target it with `--scope workload=NAME`.")
@click.option("--label", "labels", multiple=True, help="key=value, repeatable.")
@click.option("--runtime-limit", type=float, help="Declared runtime limit in seconds.")
@click.option("--mount", "mounts", multiple=True, help="Storage mount the job needs (checked at submit); repeatable.")
@click.option("--dataset", "datasets", multiple=True, help="Data set the job reads (checked at submit); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, required=True)
@click.pass_obj
def submit(client: Client, name: str, project: str, queue: str, gpus_per_node: int, nodes: int,
           grace_seconds: float, stop_signal: str, owner: str | None, environment: str, workload: str | None,
           labels: tuple[str, ...],
           runtime_limit: float | None, mounts: tuple[str, ...], datasets: tuple[str, ...], as_json: bool,
           command: tuple[str, ...]) -> None:
    """Submit COMMAND (after `--`) as a job, e.g. `jobgate job submit --name t --project vision -- python train.py`."""
    parsed = {}
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--label {item!r} must look like key=value")
        parsed[key] = value
    body: dict[str, Any] = {"name": name, "project": project, "queue": queue, "gpus_per_node": gpus_per_node,
                            "nodes": nodes, "command": list(command), "grace_seconds": grace_seconds,
                            "stop_signal": stop_signal, "environment": environment, "labels": parsed}
    if owner:
        body["owner"] = owner
    if workload:
        body["workload"] = workload
    if runtime_limit:
        body["runtime_limit_seconds"] = runtime_limit
    if mounts:
        body["mounts"] = list(mounts)
    if datasets:
        body["datasets"] = list(datasets)
    job = client.request("POST", "jobs", json=body, options=SUBMIT_OPTIONS)
    if as_json:
        emit_json(job)
    else:
        click.echo(f"submitted {job['id']} ({job['name']}) to {job['project']}/{job['queue']}: {job['state']}")


@job_group.command("list")
@click.option("--project", help="Only this project.")
@click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def list_jobs(client: Client, project: str | None, state: str | None, as_json: bool) -> None:
    """List the jobs you may see, newest first."""
    params = {k: v for k, v in {"project": project, "state": state}.items() if v}
    jobs = client.request("GET", "jobs", params=params)["jobs"]
    if as_json:
        emit_json(jobs)
    else:
        click.echo(table([_row(j) for j in jobs], JOB_COLUMNS))


def _when(unix: float | None) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="seconds") if unix else "-"


def _yes_no(flag: bool | None) -> str:
    return "unknown" if flag is None else "yes" if flag else "no"


def _exit_status(ev: dict[str, Any]) -> str:
    """`exit code 1`, `ended by SIGKILL`, or, when the agent saw neither (it had no such process), unknown."""
    if ev.get("exit_code") is not None:
        return f"exit code {ev['exit_code']}"
    if ev.get("exit_signal"):
        return f"ended by {ev['exit_signal']}"
    return "exit status unknown"


def _describe(job: dict[str, Any]) -> str:
    own = job["ownership"]
    lines = [
        f"{job['id']}  {job['name']}  [{job['state']}]" + (f"  {job['state_reason']}" if job["state_reason"] else ""),
        f"  project {job['project']}, queue {job['queue']}, {job['nodes']} node(s) x {job['gpus_per_node']} GPU(s)",
        f"  creator {own['creator']} ({own['creator_kind']}), owner {own['owner']},"
        f" beneficiary {own['beneficiary_project']}, rights holder {own['rights_holder']}"
        + (" (external rights)" if own["external_rights"] else ""),
        f"  command: {' '.join(job['command'])}",
    ]
    for p in job["placement"]:
        lines.append(f"  on {p['node']} GPUs {p['gpus']}")
    if job["stop_request"]:
        s = job["stop_request"]
        lines.append(f"  stop requested by {s['by']} at {s['at']}: {s['reason']}")
    if job["outcome"]:
        lines.append(f"  outcome: {job['outcome']}" + (f", exit code {job['exit_code']}" if job["exit_code"] is not None
                                                        else ""))
    for node, ev in (job["evidence"].get("nodes") or {}).items():
        sent = f"{ev['signal']} sent at {_when(ev.get('signal_sent_at'))}" if ev.get("signal") else "no signal sent"
        lines.append(f"  evidence from {node}: {sent}, {_exit_status(ev)},"
                     f" process group gone: {_yes_no(ev.get('process_group_gone'))}"
                     + (f" ({ev['note']})" if ev.get("note") else ""))
        for c in ev.get("checkpoints") or []:
            lines.append(f"    checkpoint {c['path']} {c['size']} bytes sha256 {c['sha256']}")
    if kept := job.get("checkpoint_retention"):
        lines.append(f"  checkpoints: {_retention(kept)}")
    return "\n".join(lines)


def _retention(kept: dict[str, Any]) -> str:
    """Whether the checkpoints listed above are still there (a stop never deletes them; retention later may)."""
    tier = f"{kept['tier']} tier"
    if kept["state"] == "cleaned":
        return f"removed from the nodes at {kept['cleaned_at']} ({tier} retention ended)"
    if kept["state"] == "cleaning":
        return f"being removed from the nodes ({tier} retention ended)"
    if kept["state"] == "in_use":
        return "in use by the resumed run"
    until = (f"until {kept['keep_until']}" if kept["keep_until"]
             else f"until the next job on quota {kept['until_next_job_on_quota']} starts")
    return f"kept ({tier}) {until}"


@job_group.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def show(client: Client, job_id: str, as_json: bool) -> None:
    """Show one job: state, placement, ownerships, stop evidence, and whether its checkpoints are still kept."""
    job = client.request("GET", "jobs", job_id)
    if as_json:
        emit_json(job)
    else:
        click.echo(_describe(job))


@job_group.command("stop")
@click.argument("job_id")
@click.option("--reason", required=True, help="Written reason (3 characters or more); kept in the ledger.")
@click.option("--ticket", help="Linked ticket or incident id.")
@click.option("--wait", "wait_s", type=float, default=0, help="Wait up to this many seconds for the final state.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def stop(client: Client, job_id: str, reason: str, ticket: str | None, wait_s: float, as_json: bool) -> None:
    """Stop a job: prepare signal, grace window, then SIGKILL. Decided by policy; recorded in the ledger."""
    body = {"reason": reason, **({"ticket": ticket} if ticket else {})}
    result = client.request("POST", "jobs", job_id, "stop", json=body)
    job, decision = result["job"], result["decision"]
    deadline = time.monotonic() + wait_s
    while wait_s and job["state"] in ("stop_requested", "stopping") and time.monotonic() < deadline:
        time.sleep(0.5)
        job = client.request("GET", "jobs", job_id)
    if as_json:
        emit_json({"job": job, "decision": decision, "approval_id": result.get("approval_id")})
        return
    if decision["effect"] == "needs_approval":
        echo_needs_approval(job_id, decision, result.get("approval_id"))
    else:
        click.echo(f"{job_id}: {job['state']}" + (f" ({job['outcome']})" if job.get("outcome") else "")
                   + f"  [decision recorded at ledger seq {decision['ledger_seq']}]")
