"""`jobgate nodes`: the pool's nodes, their health (alive, lost), GPUs in use and withheld."""

from __future__ import annotations

import os
from pathlib import Path

import click

from gateway.cli.client import Client, ClientGroup, client_options, emit_json, table
from nodeagent.layout import private_state_dir

COLUMNS = [("id", "node"), ("state", "state"), ("gpus", "gpus"), ("gpus_used", "used"),
           ("gpus_withheld", "withheld"), ("jobs_n", "jobs"), ("isolation", "isolation"),
           ("last_heartbeat", "last heartbeat")]


@click.command("nodes")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
def nodes_cmd(gateway: str, token: str | None, trigger: str | None, as_json: bool) -> None:
    """List nodes: `alive`, `lost` (missed heartbeats: its jobs are `lost` and their GPUs withheld until the
    node returns or on-call confirms with `jobgate job confirm-stopped ID --reason ...`), or `registered`.
    A node whose agent reports fewer GPUs than its jobs hold is marked degraded: it takes no new work until
    they fit again. `isolation` says how a node keeps jobs apart: uid+cgroup (each job its own uid and cgroup),
    uid, or none (jobs run as the agent's user)."""
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
    bare = [n["id"] for n in data["nodes"] if n.get("isolation") == "none"]
    if bare:
        click.echo(f"isolation none: {', '.join(bare)} — jobs there run as the agent's own user and could act as the"
                   " node; keep other tenants' work off it")
    degraded = [n["id"] for n in data["nodes"] if n.get("degraded")]
    if degraded:
        click.echo(f"degraded: {', '.join(degraded)} — the agent reports fewer GPUs than its jobs hold; no new work"
                   " goes there until they fit (on-call is alerted)")


@click.group("node", cls=ClientGroup)
def node_group() -> None:
    """Add nodes to the pool (platform admins)."""


@node_group.command("enrol")
@click.argument("name")
@click.option("--gpus", type=click.IntRange(0, 1024), required=True, help="GPUs the node offers.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The agent's work dir on this machine: the token goes to WORK_DIR/state/token (0600) and is not "
                   "printed.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer (with the token) as JSON.")
@click.pass_obj
def enrol(client: Client, name: str, gpus: int, work_dir: Path | None, as_json: bool) -> None:
    """Enrol node NAME and mint its agent's token, shown once. The agent reads it from its private state dir;
    never put it on a command line."""
    data = client.request("POST", "nodes", json={"id": name, "gpus": gpus})
    if work_dir is not None:
        path = private_state_dir(work_dir.resolve()) / "token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(data.pop("token")) + "\n")
        data["token_file"] = str(path)
    if as_json:
        emit_json(data)
        return
    click.echo(f"enrolled {name} ({gpus} GPUs); its token expires {data['expires_at']}")
    if work_dir is not None:
        click.echo(f"token written to {data['token_file']}; start its agent (as root, so jobs get uids of their own):")
        click.echo(f"  JOBGATE_AGENT_WORK_DIR={work_dir.resolve()} jobgate-agent --node {name} --gpus {gpus} "
                   f"--gateway https://GATEWAY --command-key COMMAND.PUB")
    else:
        click.echo(f"token (shown once; put it in the agent's WORK_DIR/state/token, mode 0600): {data['token']}")
