"""`jobgate nodes`: the pool's nodes, their health (alive, lost), GPUs in use and withheld."""

from __future__ import annotations

import click

from gateway.cli.client import Client, client_options, emit_json, table

COLUMNS = [("id", "node"), ("state", "state"), ("gpus", "gpus"), ("gpus_used", "used"),
           ("gpus_withheld", "withheld"), ("jobs_n", "jobs"), ("last_heartbeat", "last heartbeat")]


@click.command("nodes")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
def nodes_cmd(gateway: str, token: str | None, trigger: str | None, as_json: bool) -> None:
    """List nodes: `alive`, `lost` (missed heartbeats: its jobs are `lost` and their GPUs withheld until the
    node returns or on-call confirms with `jobgate job confirm-stopped ID --reason ...`), or `registered`.
    A node whose agent reports fewer GPUs than its jobs hold is marked degraded: it takes no new work until
    they fit again."""
    data = Client(gateway, token, trigger).request("GET", "nodes")
    if as_json:
        emit_json(data)
        return
    rows = [{**n, "state": n["state"] + (" (degraded)" if n.get("degraded") else ""),
             "jobs_n": len(n.get("jobs", [])), "gpus_withheld": n.get("gpus_withheld", 0)}
            for n in data["nodes"]]
    click.echo(table(rows, COLUMNS))
    lost = [n["id"] for n in data["nodes"] if n["state"] == "lost"]
    if lost:
        click.echo(f"lost: {', '.join(lost)} — contact on-call; their jobs wait for the node or a person")
    degraded = [n["id"] for n in data["nodes"] if n.get("degraded")]
    if degraded:
        click.echo(f"degraded: {', '.join(degraded)} — the agent reports fewer GPUs than its jobs hold; no new work"
                   " goes there until they fit (on-call is alerted)")
