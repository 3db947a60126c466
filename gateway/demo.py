"""The demo organisation `jobgate up --demo` seeds: two projects, the cast, two node agents' identities."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from gateway.context import utcnow
from gateway.identity.tokens import issue_token
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Meta, Node, Principal, Project, RoleBinding
from gateway.store.schema import create_schema
from nodeagent.layout import private_state_dir

DEMO_NODES = ("demo-node-1", "demo-node-2")
DEMO_GPUS_PER_NODE = 8

# (id, kind, display name, responsible, [(role, project)])
CastMember = tuple[str, str, str, str | None, list[tuple[str, str]]]
CAST: tuple[CastMember, ...] = (
    ("alice", "person", "Alice (researcher, vision)", None, [("researcher", "vision")]),
    ("bob", "person", "Bob (researcher, vision)", None, [("researcher", "vision")]),
    ("carol", "person", "Carol (queue admin, vision)", None, [("queue_admin", "vision"), ("researcher", "vision")]),
    ("dave", "person", "Dave (on-call)", None, [("oncall", "*")]),
    ("erin", "person", "Erin (platform admin)", None, [("platform_admin", "*")]),
    # A7: a quota change needs a second platform admin; with erin alone no quota change could be approved.
    ("frank", "person", "Frank (platform admin)", None, [("platform_admin", "*")]),
    ("sam", "person", "Sam (security reviewer)", None, [("security_reviewer", "*")]),
    ("audrey", "person", "Audrey (auditor)", None, [("auditor", "*")]),
    ("mallory", "person", "Mallory (researcher, speech)", None, [("researcher", "speech")]),
    ("ci-bot", "service", "CI pipeline of project vision", "alice", [("service", "vision")]),
)


def write_secret_json(path: Path, data: dict[str, str]) -> None:
    """Write a file only its owner can read (tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(path, 0o600)


def write_secret_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


_SEED_LOCK = 7305621  # transaction advisory lock (PostgreSQL): one replica seeds the demo
# Session advisory lock (PostgreSQL): the replica holding it runs the demo's node agents, the first to start; one
# that seeded is not enough, since replicas restarted on a seeded database each found the seeding done.
AGENTS_LOCK = 7305622


def prepare_demo(settings: Settings) -> bool:
    """Create the business schema in the settings' database and seed the demo cast there and in its data
    dir (tokens in demo-tokens.json). Returns True if it seeded now, False if the cast was already there."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url())
    try:
        create_schema(db.engine)
        with db.transaction() as session:
            if not db.is_sqlite:  # replicas started at once with --demo: one seeds, the others find it seeded
                session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SEED_LOCK})
            return seed_demo(session, settings.data_dir)
    finally:
        db.close()


def seed_demo(session: Session, data_dir: Path) -> bool:
    """Seed once; on an existing data dir keep everything, only adding cast members it lacks (one a later
    version added, whom a README flow needs). Returns True if it seeded now."""
    now = utcnow()
    if session.get(Meta, "demo_seeded") is not None:
        missing = [member for member in CAST if session.get(Principal, member[0]) is None]
        if missing:
            path = data_dir / "demo-tokens.json"
            try:
                tokens = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                tokens = {}
            tokens = tokens if isinstance(tokens, dict) else {}
            tokens.update(_seed_cast(session, missing, now))
            write_secret_json(path, tokens)
        return False
    session.add_all([
        Project(id="vision", organisation="acme", description="Computer vision research"),
        Project(id="speech", organisation="acme", description="Speech research (another tenant)"),
    ])
    tokens = _seed_cast(session, CAST, now)
    for node in DEMO_NODES:
        session.add(Principal(id=node, kind="node", display_name=f"agent of {node}", created_at=now))
        session.add(Node(id=node, gpus=DEMO_GPUS_PER_NODE, state="registered", last_heartbeat=None, running=[]))
        session.flush()
        secret = issue_token(session, node, purpose="node agent", now=now, lifetime=timedelta(days=365),
                             actions=["agent"]).secret
        write_secret_text(private_state_dir(data_dir / "agents" / node) / "token", secret)
    session.add(Meta(key="demo_seeded", value=now.isoformat()))
    write_secret_json(data_dir / "demo-tokens.json", tokens)
    return True


def _seed_cast(session: Session, members: Sequence[CastMember], now: datetime) -> dict[str, str]:
    """Add these cast members with their role bindings; returns a 30-day demo token for each."""
    tokens: dict[str, str] = {}
    for pid, kind, name, responsible, roles in members:
        session.add(Principal(id=pid, kind=kind, display_name=name, responsible=responsible, created_at=now))
        session.flush()
        for role, project in roles:
            session.add(RoleBinding(principal_id=pid, role=role, project=project, created_at=now))
        projects = ["vision"] if kind == "service" else None
        tokens[pid] = issue_token(session, pid, purpose="demo", now=now, lifetime=timedelta(days=30),
                                  projects=projects).secret
    return tokens
