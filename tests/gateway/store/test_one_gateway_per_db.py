"""Who may share a PostgreSQL business database: its rows cite ledger seqs, so every gateway process on it must
append to one ledger. Replicas on one PostgreSQL ledger share it; a process whose ledger only it may write (SQLite),
or whose ledger is another than the one the rows cite, is refused at start, not left to fork the audit trail; and
so is one whose keys are not the ledger's or whose role cannot append to it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.errors import DatabaseInUse, LedgerMismatch
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


def test_replicas_on_one_postgresql_ledger_share_the_database_and_one_on_another_ledger_is_refused(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    biz, ledger = fresh_pg_database("jobgate_biz"), fresh_pg_database("jobgate_ledger")
    first = Settings(data_dir=tmp_path / "d", database_url=biz, ledger_url=ledger, port=1)
    second = Settings(data_dir=tmp_path / "d", database_url=biz, ledger_url=ledger, port=2)  # same keys, as replicas
    elsewhere = Settings(data_dir=tmp_path / "d", database_url=biz, ledger_url=fresh_pg_database("jobgate_ledger"))
    prepare_demo(first)
    tokens = json.loads((first.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(first, run_scheduler=False)) as a, \
            TestClient(create_app(second, run_scheduler=False)) as b:
        job = Api(a, tokens, first).post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        assert Api(b, tokens, second).get(f"/v1/jobs/{job}", "alice").status_code == 200
        assert a.get("/healthz").json()["role"] == "leader" and b.get("/healthz").json()["role"] == "follower"
        with pytest.raises(LedgerMismatch, match=r"cite the ledger whose entry 0 has hash .* this ledger's is empty"), \
                TestClient(create_app(elsewhere, run_scheduler=False)):
            pass


def test_jobgate_up_with_keys_not_the_ledgers_or_a_role_that_cannot_append_says_why_in_one_line(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], pg_server_url: str
) -> None:
    biz, ledger = fresh_pg_database("jobgate_biz"), fresh_pg_database("jobgate_ledger")
    first = Settings(data_dir=tmp_path / "a", database_url=biz, ledger_url=ledger)
    with TestClient(create_app(first, run_scheduler=False)):
        pass  # the ledger now has entries and a checkpoint signed by a/keys
    role = f"jobgate_reader_{os.getpid()}"
    with psycopg.connect(ledger, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON ledger_entries, ledger_checkpoints, ledger_blobs, ledger_head TO {role}")
    reader = ledger.replace("postgres@", f"{role}@", 1)
    assert reader != ledger
    try:
        for data_dir, ledger_url, why in (
                (tmp_path / "b", ledger, "the latest checkpoint is not signed by key"),  # keys of its own
                (tmp_path / "a", reader, "the ledger cannot be written: this role lacks INSERT on ledger_entries")):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            r = subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--port", str(port), "--data-dir",
                                str(data_dir)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": biz,
                                    "JOBGATE_LEDGER_URL": ledger_url})
            assert r.returncode == 1, r.stdout + r.stderr
            assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert r.stderr.startswith("Error: cannot start: ") and why in r.stderr, r.stderr
    finally:
        with psycopg.connect(ledger, autocommit=True) as owner:  # a role holding grants cannot be dropped
            owner.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        with psycopg.connect(pg_server_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")
