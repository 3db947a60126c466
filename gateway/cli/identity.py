"""`jobgate token create|list|revoke` and `jobgate service-account create|list` (F1)."""

from __future__ import annotations

import click

from gateway.cli.client import Client, ClientGroup, emit_json, table


@click.group("token", cls=ClientGroup)
def token_group() -> None:
    """Scoped, expiring bearer tokens."""


@token_group.command("create")
@click.option("--for", "principal", help="A service account you answer for (default: yourself).")
@click.option("--purpose", required=True, help="What the token is for; kept with it.")
@click.option("--project", "projects", multiple=True, required=True, help="Project it may act in; repeatable.")
@click.option("--action", "actions", multiple=True, default=["*"], show_default=True,
              help="Action it may request (job.submit, job.stop, ...); repeatable.")
@click.option("--days", type=float, required=True,
              help="Lifetime in days (service tokens at most 90); never past the end of the token you use.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def create(client: Client, principal: str | None, purpose: str, projects: tuple[str, ...], actions: tuple[str, ...],
           days: float, as_json: bool) -> None:
    """Create a token. The secret is printed once and never stored."""
    body = {"purpose": purpose, "projects": list(projects), "actions": list(actions), "expires_in_days": days}
    if principal:
        body["principal"] = principal
    result = client.request("POST", "tokens", json=body)
    if as_json:
        emit_json(result)
        return
    click.echo(f"token {result['id']} for {result['principal']}, expires {result['expires_at']}")
    capped = result.get("lifetime_capped")
    if capped:
        click.echo(f"note: its lifetime was cut to that end (asked: --days {days:g}, until"
                   f" {capped['asked_expires_at']}): a token ends no later than the token that made it, and"
                   f" {capped['by_token']} expires then")
    click.echo("secret (shown once, store it now):")
    click.echo(result["token"])


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def list_tokens(client: Client, as_json: bool) -> None:
    """Tokens you manage."""
    rows = client.request("GET", "tokens")["tokens"]
    if as_json:
        emit_json(rows)
        return
    rows = [{**r, "projects": ",".join(r["projects"]), "actions": ",".join(r["actions"])} for r in rows]
    click.echo(table(rows, [("id", "id"), ("principal", "principal"), ("purpose", "purpose"),
                            ("projects", "projects"), ("actions", "actions"), ("expires_at", "expires"),
                            ("revoked_at", "revoked")]))


@token_group.command("revoke")
@click.argument("token_id")
@click.option("--reason", required=True, help="Why; kept in the ledger.")
@click.pass_obj
def revoke(client: Client, token_id: str, reason: str) -> None:
    """Revoke TOKEN_ID at once."""
    result = client.request("POST", "tokens", token_id, "revoke",
                                                     json={"reason": reason})
    click.echo(f"revoked {result['id']} at {result['revoked_at']}")


@click.group("service-account", cls=ClientGroup)
def service_account_group() -> None:
    """Automation identities, each answered for by a person."""


@service_account_group.command("create")
@click.argument("name")
@click.option("--project", required=True, help="Project the account acts in.")
@click.option("--description", default="", help="What the account is for.")
@click.pass_obj
def create_account(client: Client, name: str, project: str, description: str) -> None:
    """Create service account NAME in PROJECT; you become its responsible person."""
    result = client.request(
        "POST", "service-accounts", json={"name": name, "project": project, "description": description})
    click.echo(f"service account {result['id']} in {result['project']}, responsible: {result['responsible']}")


@service_account_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def list_accounts(client: Client, as_json: bool) -> None:
    """Service accounts you answer for."""
    rows = client.request("GET", "service-accounts")["service_accounts"]
    if as_json:
        emit_json(rows)
        return
    click.echo(table(rows, [("id", "id"), ("responsible", "responsible"), ("description", "description")]))
