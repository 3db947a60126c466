"""`jobgate up` on PostgreSQL stores says where they are, and the verify command it prints works on them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from ledger.admin import init_db

pytestmark = pytest.mark.integration


@pytest.fixture
def role_ledger_url(fresh_pg_database: Callable[[str], str], pg_server_url: str) -> Iterator[str]:
    """A ledger database set up by init-db; the URL (with a password) the gateway's append-only role uses."""
    import psycopg

    owner = fresh_pg_database("jobgate_ledger")
    role = f"jobgate_gw_{os.getpid()}"
    url = init_db(owner, role=role, password="banner-secret").gateway_url
    assert url is not None
    yield url
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        conn.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_banner_on_postgresql_names_the_stores_and_its_verify_command_works(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], role_ledger_url: str
) -> None:
    """It named jobgate.db and ledger.db in the data dir, and printed `jobgate ledger verify --data-dir DIR`,
    which answered "no ledger database at DIR/ledger.db"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    biz = fresh_pg_database("jobgate_biz")
    env = {**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": biz, "JOBGATE_LEDGER_URL": role_ledger_url,
           "JOBGATE_RATE_LIMIT_STORAGE": "memory://"}
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with out.open("w") as sink, err.open("w") as err_sink:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--demo", "--port", str(port),
                                 "--data-dir", str(tmp_path / "var")], stdout=sink, stderr=err_sink, env=env)
    try:
        deadline = time.monotonic() + 90
        while "ledger verify" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    banner = [line for line in out.read_text().splitlines() if not line.startswith("{")]  # not the JSON log lines
    text = "\n".join(banner)
    assert "jobgate.db" not in text and "ledger.db" not in text, text
    assert "banner-secret" not in text and role_ledger_url.replace("banner-secret", "***") in text, text
    # A replica that may have others beside it: limits counted in its memory would be N budgets, not one.
    assert "rate limits are counted in this process's memory" in err.read_text()
    verify = next(line.strip() for line in banner if "ledger verify" in line)
    jobgate = os.path.join(os.path.dirname(sys.executable), "jobgate")
    r = subprocess.run(verify.replace("jobgate ", jobgate + " ", 1), shell=True, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.startswith("OK: "), verify + "\n" + r.stdout + r.stderr


@pytest.fixture
def bare_role(pg_server_url: str) -> Iterator[str]:
    """A login role that nobody ran init-db for."""
    import psycopg

    role = f"jobgate_bare_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_up_on_a_ledger_database_without_init_db_says_to_run_it_in_one_line(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], bare_role: str
) -> None:
    """It printed the failed CREATE TABLE statement and a caret under its error, and no word of init-db."""
    ledger = urlsplit(fresh_pg_database("jobgate_ledger"))
    role_url = urlunsplit(ledger._replace(netloc=f"{bare_role}@{ledger.hostname}:{ledger.port}"))
    env = {**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": fresh_pg_database("jobgate_biz"),
           "JOBGATE_LEDGER_URL": role_url}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--port", str(port), "--data-dir",
                        str(tmp_path / "var")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "no ledger tables" in r.stderr and "jobgate ledger init-db --url" in r.stderr, r.stderr
