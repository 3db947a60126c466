"""The `jobgate` command: server commands (up) and client commands (job, ledger, ...)."""

from __future__ import annotations

import click

from gateway.cli.approvals import approvals_group, approve, reject
from gateway.cli.breakglass import break_glass_group
from gateway.cli.console import STATS_COMMANDS, audit_group, notifications_cmd, policy_show
from gateway.cli.emergency import emergency_group
from gateway.cli.forensics import forensics_group
from gateway.cli.identity import service_account_group, token_group
from gateway.cli.jobs import job_group
from gateway.cli.lifecycle import priority as _registers_job_priority_pause_resume  # noqa: F401
from gateway.cli.nodes import node_group, nodes_cmd
from gateway.cli.policy import policy_group
from gateway.cli.queue import queue_cmd, quota_group, stats_group
from gateway.cli.roles import role_group
from gateway.cli.sim import sim_group
from gateway.cli.up import demo_token, up
from ledger.cli import ledger_group


def _misplaced_option(e: click.NoSuchOption) -> click.NoSuchOption | None:
    """An option of a group written after its subcommand (`jobgate sim generate --trace T` for `jobgate sim
    --trace T ...`), or one of a subcommand written before it (`jobgate job --json list`): say where it goes, and
    name its environment variable, instead of click's "No such option ... Did you mean ...?". None when no
    command near it knows the option. (--gateway, --token and --trigger go on either side: gateway/cli/client.py
    ClientGroup.)"""
    if e.ctx is None:
        return None
    ctx = e.ctx.parent
    while ctx is not None:
        if (param := _option(ctx.command, e.option_name)) is not None:
            rest = e.ctx.command_path[len(ctx.command_path):].strip()
            return _goes(e, param, f"before the subcommand: `{ctx.command_path} {_written(e, param)} {rest} ...`")
        ctx = ctx.parent
    # The other way round: an option of the group's commands, written before the subcommand.
    group = e.ctx.command
    for sub in group.commands.values() if isinstance(group, click.Group) else ():
        if (param := _option(sub, e.option_name)) is not None:
            return _goes(e, param, f"after the subcommand here: `{e.ctx.command_path} SUBCOMMAND {_written(e, param)}"
                                   " ...`")
    return None


def _written(e: click.NoSuchOption, param: click.Option) -> str:
    return str(e.option_name) if param.is_flag else f"{e.option_name} VALUE"


def _option(command: click.Command, name: str | None) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and name in p.opts), None)


def _goes(e: click.NoSuchOption, param: click.Option, where: str) -> click.NoSuchOption:
    env = f", or set {param.envvar}" if isinstance(param.envvar, str) else ""
    return click.NoSuchOption(e.option_name, f"{e.option_name} goes {where}{env}", ctx=e.ctx)


class _Cli(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as e:
            better = _misplaced_option(e)
            if better is None:
                raise
            raise better from e


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option("0.1.0", prog_name="jobgate")
def cli() -> None:
    """jobgate: the one door for changing training jobs on a shared GPU pool.

    Every stop, preemption, reprioritisation or delete is decided by policy, recorded in a signed
    ledger, and only then carried out. Start with `jobgate up --demo`, then `jobgate job --help`.
    """


cli.add_command(up)
cli.add_command(node_group)
cli.add_command(demo_token)
cli.add_command(job_group)
cli.add_command(queue_cmd)
cli.add_command(stats_group)
cli.add_command(quota_group)
cli.add_command(sim_group)
cli.add_command(ledger_group)
cli.add_command(approvals_group)
cli.add_command(break_glass_group)
cli.add_command(approve)
cli.add_command(reject)
cli.add_command(token_group)
cli.add_command(service_account_group)
cli.add_command(emergency_group)
cli.add_command(policy_group)
cli.add_command(role_group)
cli.add_command(nodes_cmd)
cli.add_command(forensics_group)
cli.add_command(notifications_cmd)
cli.add_command(audit_group)
policy_group.add_command(policy_show)
for _cmd in STATS_COMMANDS:
    stats_group.add_command(_cmd)


def main() -> None:
    cli(prog_name="jobgate")
