"""The demo seeding of `jobgate up --demo`: a data dir seeded by an earlier version gets the cast members it lacks;
with replicas, the first to start runs the demo's node agents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gateway_testkit import start_api
from sqlalchemy import delete

from gateway.demo import AGENTS_LOCK, prepare_demo
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Principal, RoleBinding, Token


def test_a_demo_seeded_before_a_cast_member_was_added_gets_them_and_keeps_the_rest(tmp_path: Path) -> None:
    """frank (the second platform admin A7 needs) came later: `make run` on an older var/ kept its data and had no
    frank, so the README's quota flow failed there with 'no demo token for frank'."""
    settings = Settings(data_dir=tmp_path / "var")
    assert prepare_demo(settings) is True
    tokens_file = settings.data_dir / "demo-tokens.json"
    db = Database(settings.resolved_database_url())
    with db.transaction() as s:  # the data dir as a version without frank left it
        for table, column in ((Token, Token.principal_id), (RoleBinding, RoleBinding.principal_id),
                              (Principal, Principal.id)):
            s.execute(delete(table).where(column == "frank"))
    db.close()
    older = {k: v for k, v in json.loads(tokens_file.read_text()).items() if k != "frank"}
    tokens_file.write_text(json.dumps(older))

    assert prepare_demo(settings) is False  # kept: not seeded again
    tokens = json.loads(tokens_file.read_text())
    assert {k: tokens[k] for k in older} == older and set(tokens) == {*older, "frank"}
    assert tokens_file.stat().st_mode & 0o777 == 0o600
    for api in start_api(settings):
        r = api.get("/v1/roles", "erin")
        assert {"principal": "frank", "role": "platform_admin", "project": "*"}.items() <= next(
            b for b in r.json()["bindings"] if b["principal"] == "frank").items(), r.text
        assert api.get("/v1/quotas", "frank").status_code == 200
        assert api.get("/v1/jobs", "alice").status_code == 200  # the tokens it had still work


def test_the_first_replica_to_start_runs_the_demo_agents_seeded_or_not(
        fresh_pg_database: Callable[[str], str]) -> None:
    """`jobgate up --demo` starts the agents where it holds the demo's agents lock, not where it seeded: replicas
    restarted together on a seeded database each found the seeding done, and none started the demo's agents. The
    lock goes with its holder's session (a replica stopped, or killed with kill -9), for the next one to start."""
    url = fresh_pg_database("jobgate_demo_agents")
    first, second, third = Database(url), Database(url), Database(url)
    try:
        assert first.hold(AGENTS_LOCK) and not second.hold(AGENTS_LOCK)
        first.close()
        assert third.hold(AGENTS_LOCK) and not second.hold(AGENTS_LOCK)
    finally:
        for db in (first, second, third):
            db.close()
    assert Database("sqlite:///:memory:").hold(AGENTS_LOCK)  # one process per data dir: always this one
