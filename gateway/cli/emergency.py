"""`jobgate emergency-stop ...`: stop a job, workload or scope for a safety or security concern, and watch it."""

from __future__ import annotations

import time
from typing import Any

import click

from gateway.cli.client import Client, ClientGroup, emit_json, fail, is_tty, table

JOB_COLUMNS = [("job_id", "job"), ("category", "outcome"), ("state", "state"), ("node", "node"),
               ("stop_latency_s", "latency s"), ("owner", "owner")]
FINAL_STATES = ("done", "rejected", "expired")  # as gateway.jobs.emergency.FINAL_STATES (this client speaks only HTTP)
SUMMARY_ORDER = ("stopped_graceful", "stopped_forced", "cancelled", "confirmed_by_person", "stop_failed",
                 "unreachable", "in_progress")


def _parse_scope(scope: str) -> dict[str, Any]:
    kind, sep, value = scope.partition("=")
    if not sep or not value:
        fail(f"--scope {scope!r} must look like job=ID, workload=NAME, environment=NAME or label=key:value[,k:v]")
    if kind == "label":
        labels = {}
        for pair in value.split(","):
            k, s2, v = pair.partition(":")
            if not s2 or not k:
                fail(f"label selector {pair!r} must look like key:value")
            labels[k] = v
        return {"kind": "selector", "value": labels}
    if kind not in ("job", "workload", "environment"):
        fail(f"unknown scope kind {kind!r}; use job, workload, environment or label")
    return {"kind": kind, "value": value}


def _summary_line(es: dict[str, Any]) -> str:
    s = es["summary"]
    parts = [f"{k} {s[k]}" for k in SUMMARY_ORDER if s.get(k)]
    return (f"{es['id']} {es['state']}: {s['accounted_for']}/{s['targets']} accounted for"
            + (f" ({', '.join(parts)})" if parts else "")
            + (f"; {s['blind_spots']} blind spots" if s.get("blind_spots") else ""))


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"


def _print(es: dict[str, Any]) -> None:
    click.echo(f"emergency stop {es['id']}  state {es['state']}  trigger {es['trigger']}  "
               f"scope {es['scope']['kind']}={es['scope']['value']}  grace {es['grace_seconds']:g}s")
    if es["state"] == "pending_approval":  # only the requester has decided: that is what "requested" says
        click.echo(f"requested by {es['requested_by']}")
    else:
        click.echo(f"requested by {es['requested_by']}; decided by {', '.join(es['deciders'])}")
    if es.get("approval_id") and es["state"] == "pending_approval":
        click.echo(f"waiting for approval {es['approval_id']}: nothing is stopped until a second person holding the"
                   f" other of the on-call and security-reviewer roles runs `jobgate approve {es['approval_id']}`;"
                   f" follow it with `jobgate emergency-stop show {es['id']} --watch`")
    rows = [{**j, "node": ",".join(j["nodes"]), "stop_latency_s": _seconds(j.get("stop_latency_s"))}
            for j in es.get("jobs", [])]
    click.echo(table(rows, JOB_COLUMNS))
    for b in es.get("blind_spots", []):
        click.echo(f"blind spot: {b['job_id']} ({b['reason']})")
    summary = es["summary"]
    click.echo("summary: " + ", ".join(f"{k} {summary.get(k, 0)}" for k in SUMMARY_ORDER))
    click.echo(_hold_line(es["id"], es.get("hold") or {"state": "none"}))


def _hold_line(es_id: str, hold: dict[str, Any]) -> str:
    state = hold["state"]
    if state == "in_force":
        return (f"hold: in force since {hold['since']}: new jobs in this scope are refused; lift it with"
                f" `jobgate emergency-stop lift {es_id} --reason ...`")
    if state == "lifted":
        return f"hold: lifted at {hold['lifted_at']} by {hold['lifted_by']} ({hold['reason']})"
    if state == "pending":
        return "hold: from when the stop is carried out, new jobs in this scope will be refused"
    return "hold: none"


def _watch(client: Client, es_id: str, timeout: float, as_json: bool) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        es = client.request("GET", "emergency-stops", es_id)
        line = _summary_line(es)
        if line != last and not as_json:
            click.echo(("\r" if is_tty() else "") + line, nl=not is_tty())
            last = line
        if es["state"] in FINAL_STATES or time.monotonic() >= deadline:
            if is_tty() and not as_json:
                click.echo()
            return dict(es)
        time.sleep(0.5)


@click.group("emergency-stop", cls=ClientGroup)
def emergency_group() -> None:
    """Stop a job, a workload or a whole scope now, for a safety or security concern (C2, C6).

    A workload or scope stop needs a second person holding the other of the on-call and
    security-reviewer roles; `create` then prints the approval id to hand them. Once carried out, it
    holds its scope: new jobs there (and paused ones resuming) are refused until `lift`.
    """


class _ConcernOption(click.Option):
    """--concern: left out, click's "Missing option" also says that --trigger is something else here (the concern
    was `--trigger safety` before --trigger came to mean one thing in every command)."""

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        try:
            return super().process_value(ctx, value)
        except click.MissingParameter as e:
            raise click.MissingParameter(  # (click ends it with ". Choose from: ...")
                "It names the concern behind the stop; --trigger is the pipeline run of a service account's call,"
                " here as in every command", ctx=ctx, param=self) from e


@emergency_group.command("create")
@click.option("--scope", required=True,
              help="job=ID, workload=NAME, environment=research|staging|production, or label=key:value[,k:v].")
@click.option("--concern", cls=_ConcernOption, type=click.Choice(["safety", "security"]), required=True,
              help="The concern behind the stop: safety or security (recorded in the ledger as its trigger, C6).")
@click.option("--reason", required=True, help="Written reason (3 characters or more), kept in the ledger.")
@click.option("--grace", "grace_seconds", type=click.FloatRange(0, 300), default=5.0, show_default=True,
              help="Grace window for every target (0 = SIGKILL at once).")
@click.option("--ticket", help="Incident or ticket id.")
@click.option("--hold/--no-hold", default=True, show_default=True,
              help="A workload or scope stop keeps its scope closed to new jobs until `lift`.")
@click.option("--watch", is_flag=True, help="Follow progress until every job is accounted for; a stop that waits"
                                            " for a second person returns at once (then `show ID --watch`).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Give up watching after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print the emergency stop as JSON.")
@click.pass_obj
def create(client: Client, scope: str, concern: str, reason: str, grace_seconds: float, ticket: str | None,
           hold: bool, watch: bool, timeout: float, as_json: bool) -> None:
    """Request an emergency stop, e.g. `jobgate emergency-stop create --scope environment=production
    --concern safety --reason "unsafe outputs" --grace 0 --watch`."""
    body = {"scope": _parse_scope(scope), "trigger": concern, "reason": reason, "grace_seconds": grace_seconds,
            "ticket": ticket, "hold": hold}
    es = client.request("POST", "emergency-stops", json=body)
    if watch and es["state"] != "pending_approval":
        es = _watch(client, es["id"], timeout, as_json)
    if as_json:
        emit_json(es)
    else:
        _print(es)


@emergency_group.command("show")
@click.argument("emergency_id")
@click.option("--watch", is_flag=True, help="Follow progress (also while it waits for approval).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Give up watching after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def show(client: Client, emergency_id: str, watch: bool, timeout: float, as_json: bool) -> None:
    """Per-job state and the summary of one emergency stop."""
    es = _watch(client, emergency_id, timeout, as_json) if watch else client.request(
        "GET", "emergency-stops", emergency_id)
    if as_json:
        emit_json(es)
    else:
        _print(es)


@emergency_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def list_cmd(client: Client, as_json: bool) -> None:
    """Emergency stops, newest first."""
    data = client.request("GET", "emergency-stops")
    if as_json:
        emit_json(data)
        return
    rows = [{**e, "scope": f"{e['scope']['kind']}={e['scope']['value']}", "progress":
             f"{e['summary']['accounted_for']}/{e['summary']['targets']}", "hold_state": e["hold"]["state"]}
            for e in data["emergency_stops"]]
    click.echo(table(rows, [("id", "id"), ("state", "state"), ("trigger", "trigger"), ("scope", "scope"),
                            ("progress", "accounted"), ("hold_state", "hold"), ("requested_by", "by")]))


@emergency_group.command("lift")
@click.argument("emergency_id")
@click.option("--reason", required=True, help="Why the scope may take new jobs again (kept in the ledger).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.pass_obj
def lift(client: Client, emergency_id: str, reason: str, as_json: bool) -> None:
    """Lift the hold a workload or scope stop keeps on its scope, so new jobs may be submitted there again."""
    out = client.request("POST", "emergency-stops", emergency_id, "lift", json={"reason": reason})
    if as_json:
        emit_json(out)
    else:
        click.echo(_hold_line(emergency_id, out["hold"]))
