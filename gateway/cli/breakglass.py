"""`jobgate break-glass request|list|revoke`: temporary one-time grants for on-call (F2)."""

from __future__ import annotations

import click

from gateway.cli.client import Client, ClientGroup, emit_json, table


@click.group("break-glass", cls=ClientGroup)
def break_glass_group() -> None:
    """Temporary, one-time, ledgered grants for on-call troubleshooting."""


@break_glass_group.command("request")
@click.option("--project", "projects", multiple=True, required=True, help="Project covered; repeatable.")
@click.option("--action", "actions", multiple=True, required=True,
              help="Action covered, e.g. job.stop or job.pause; repeatable. A misspelt one is refused with the list.")
@click.option("--minutes", type=click.FloatRange(0, 240, min_open=True), required=True,
              help="Lifetime in minutes, at most 240 (4 hours).")
@click.option("--uses", type=int, default=1, show_default=True, help="Calls it may make.")
@click.option("--reason", required=True, help="Why you need it (10 characters or more); kept in the ledger.")
@click.option("--ticket", required=True, help="Incident ticket.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def request(client: Client, projects: tuple[str, ...], actions: tuple[str, ...], minutes: float, uses: int,
            reason: str, ticket: str, as_json: bool) -> None:
    """Ask for a grant. The credential is printed once; every use is ledgered and raises an alert."""
    body = {"projects": list(projects), "actions": list(actions), "duration_minutes": minutes, "max_uses": uses,
            "reason": reason, "ticket": ticket}
    g = client.request("POST", "break-glass", json=body)
    if as_json:
        emit_json(g)
        return
    if g["state"] == "pending":
        click.echo(f"grant {g['id']} waits for a second on-call: approval {g['approval_id']}")
    else:
        click.echo(f"grant {g['id']} active until {g['expires_at']}, {g['max_uses']} use(s)")
    click.echo("credential (shown once; use it as the bearer token):")
    click.echo(g["credential"])


@break_glass_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def list_grants(client: Client, as_json: bool) -> None:
    """Your grants (auditors and reviewers see all)."""
    rows = client.request("GET", "break-glass")["grants"]
    if as_json:
        emit_json(rows)
        return
    rows = [{**r, "projects": ",".join(r["projects"]), "used": f"{r['uses']}/{r['max_uses']}"} for r in rows]
    click.echo(table(rows, [("id", "id"), ("holder", "holder"), ("state", "state"), ("projects", "projects"),
                            ("used", "used"), ("expires_at", "expires"), ("ticket", "ticket")]))


@break_glass_group.command("revoke")
@click.argument("grant_id")
@click.pass_obj
def revoke(client: Client, grant_id: str) -> None:
    """End GRANT_ID now."""
    g = client.request("POST", "break-glass", grant_id, "revoke")
    click.echo(f"revoked {g['id']} at {g['revoked_at']}")
