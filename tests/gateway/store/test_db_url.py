"""The business database takes the PostgreSQL URL spellings the ledger (and libpq) take."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from gateway_testkit import job_spec, start_api

from gateway.cli.main import cli
from gateway.settings import Settings

pytestmark = pytest.mark.integration


def test_a_postgres_scheme_url_serves_as_business_database_as_it_does_as_ledger(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    biz, led = (fresh_pg_database(p).replace("postgresql://", "postgres://", 1)
                for p in ("jobgate_biz", "jobgate_ledger"))
    assert biz.startswith("postgres://")
    for api in start_api(Settings(data_dir=tmp_path, database_url=biz, ledger_url=led)):
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
        assert api.gateway.db.engine.dialect.name == "postgresql"


def test_policy_explain_reads_the_bindings_of_a_postgres_scheme_url(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    """It raised a traceback (NoSuchModuleError) where a gateway was running on that very URL."""
    biz = fresh_pg_database("jobgate_biz").replace("postgresql://", "postgres://", 1)
    for _ in start_api(Settings(data_dir=tmp_path, database_url=biz, ledger_url=fresh_pg_database("jobgate_ledger"))):
        pass  # the demo's role bindings are now in the business database
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"action": "job.stop", "actor": "carol", "reason": "hung",
                                   "targets": [{"creator": "alice", "project": "vision"}]}))
    result = CliRunner().invoke(cli, ["policy", "explain", "--input", str(request), "--database-url", biz])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert f"current bindings of {biz}" in result.output, result.output
