"""Queue signed commands for node agents; they are delivered by the agents' long poll."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.transaction import after_commit
from gateway.native.bus import CommandBus
from gateway.native.deps import Native
from gateway.store.models import NodeCommand
from nodeagent.protocol import Command, new_nonce, sign_command


def enqueue(gw: Native, session: Session, node: str, job_id: str, kind: str, params: dict[str, Any]) -> str:
    """Sign a command for one node and queue it in this transaction; returns its nonce."""
    now = gw.clock()
    expires = now + timedelta(seconds=gw.settings.command_ttl_s)
    command = Command(
        kind=kind,
        node=node,
        job_id=job_id,
        nonce=new_nonce(),
        issued_at=now.timestamp(),
        expires_at=expires.timestamp(),
        params=params,
    )
    session.add(
        NodeCommand(
            nonce=command.nonce,
            node=node,
            job_id=job_id,
            kind=kind,
            envelope=sign_command(command, gw.command_key),
            created_at=now,
            expires_at=expires,
        )
    )
    wake_after_commit(gw.bus, session, node)
    return command.nonce


_WAKE = "notify_nodes"  # session.info key: the nodes whose agents are woken once this transaction commits


def wake_after_commit(bus: CommandBus, session: Session, node: str) -> None:
    """Wake the node's agent once `session`'s transaction has committed: its long poll returns and fetches what
    the transaction queued for it (never if it rolls back). Once per node and transaction. The agent may be
    polling another replica: that one is signalled by the same commit (gateway/store/signals.py)."""
    nodes: set[str] | None = session.info.get(_WAKE)
    if nodes is None:
        nodes = session.info[_WAKE] = set()
        after_commit(session, partial(bus.notify, nodes))
    if node not in nodes and bus.signals is not None:
        bus.signals.publish(session, "wake", [node])
    nodes.add(node)


def nodes_with_files(session: Session, job_id: str, placement: list[Any]) -> list[str]:
    """Nodes that may hold the job's files (checkpoints, logs): its placement and every node a start command of
    it went to. A requeue or a resume empties the placement, but the earlier run's files stay on its node."""
    started = session.scalars(select(NodeCommand.node).where(NodeCommand.job_id == job_id,
                                                             NodeCommand.kind == "start")).all()
    return sorted({str(p["node"]) for p in placement} | set(started))
