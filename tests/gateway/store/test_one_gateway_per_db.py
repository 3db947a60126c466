"""One gateway process per PostgreSQL business database: its rows cite ledger seqs, and a ledger has one writer,
so a second process on the same database (with a ledger of its own) is refused at start, not left to fork the
audit trail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.errors import DatabaseInUse
from gateway.settings import Settings

pytestmark = pytest.mark.integration


def test_a_second_gateway_on_the_business_database_is_refused_until_the_first_stops(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    biz = fresh_pg_database("jobgate_biz")
    first = Settings(data_dir=tmp_path / "a", database_url=biz, ledger_url=fresh_pg_database("jobgate_ledger"))
    # Started without JOBGATE_LEDGER_URL: a SQLite ledger of its own in its data dir.
    second = Settings(data_dir=tmp_path / "b", database_url=biz)
    prepare_demo(first)
    tokens = json.loads((first.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(first, run_scheduler=False)) as client:
        assert Api(client, tokens, first).post("/v1/jobs", "alice", json=job_spec()).status_code == 201
        refused = pytest.raises(DatabaseInUse, match="another gateway process runs on this business database")
        with refused, TestClient(create_app(second, run_scheduler=False)):
            pass
        assert not (second.data_dir / "ledger.db").exists()  # refused before it began a ledger of its own
    with TestClient(create_app(first, run_scheduler=False)) as client:  # the claim ended with the first
        assert Api(client, tokens, first).post("/v1/jobs", "alice", json=job_spec()).status_code == 201


def test_jobgate_up_beside_a_gateway_on_the_same_database_says_why_in_one_line(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    biz = fresh_pg_database("jobgate_biz")
    first = Settings(data_dir=tmp_path / "a", database_url=biz, ledger_url=fresh_pg_database("jobgate_ledger"))
    prepare_demo(first)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with TestClient(create_app(first, run_scheduler=False)):
        r = subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                            "--data-dir", str(tmp_path / "b")], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": biz})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("Error: cannot start: another gateway process runs on this business database")
    assert "API docs" not in r.stdout
