"""`jobgate role grant|revoke|list`: role bindings (M1) through the gateway's API; platform admins only."""

from __future__ import annotations

from typing import Any

import click

from gateway.cli.client import Client, ClientGroup, emit_json, table

_project = click.option("--project", required=True, help="Project the role is bound in; '*' for a global role.")
_reason = click.option("--reason", help="Why; kept in the ledger.")
_json = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.group("role", cls=ClientGroup)
def role_group() -> None:
    """Grant, revoke and list role bindings (needs role.manage: platform admin). Each change is ledgered."""


def _print_change(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
    else:
        click.echo(f"{result['result']}: {result['principal']} {result['role']} in {result['project']} "
                   f"(ledger decision {result['decision_seq']}, outcome {result['outcome_seq']})")


@role_group.command("grant")
@click.argument("principal")
@click.argument("role")
@_project
@_reason
@_json
@click.pass_obj
def grant(client: Client, principal: str, role: str, project: str, reason: str | None, as_json: bool) -> None:
    """Bind PRINCIPAL to ROLE in a project, e.g. `jobgate role grant bob queue_admin --project vision`."""
    body = {"principal": principal, "role": role, "project": project, "reason": reason}
    _print_change(client.request("POST", "roles", json=body), as_json)


@role_group.command("revoke")
@click.argument("principal")
@click.argument("role")
@_project
@_reason
@_json
@click.pass_obj
def revoke(client: Client, principal: str, role: str, project: str, reason: str | None, as_json: bool) -> None:
    """Remove PRINCIPAL's ROLE binding in a project."""
    body = {"principal": principal, "role": role, "project": project, "reason": reason}
    _print_change(client.request("POST", "roles:revoke", json=body), as_json)


@role_group.command("list")
@click.option("--principal", help="Only this principal.")
@click.option("--project", help="Only this project ('*' for global roles).")
@_json
@click.pass_obj
def list_cmd(client: Client, principal: str | None, project: str | None, as_json: bool) -> None:
    """List role bindings."""
    params = {k: v for k, v in {"principal": principal, "project": project}.items() if v}
    bindings = client.request("GET", "roles", params=params)["bindings"]
    if as_json:
        emit_json(bindings)
    else:
        click.echo(table(bindings, [("principal", "principal"), ("role", "role"), ("project", "project"),
                                    ("created_at", "since")]))
