"""Shared fixtures: fresh PostgreSQL databases (testcontainers when Docker answers, else JOBGATE_TEST_PG_URL)."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

REQUIRE_PG = os.environ.get("JOBGATE_REQUIRE_PG") == "1"
# CI sets this: there a missing OPA library fails the OPA tests instead of skipping them.
REQUIRE_OPA = os.environ.get("JOBGATE_REQUIRE_OPA") == "1"


def _docker_answers() -> bool:
    if not shutil.which("docker") or not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A PostgreSQL server URL whose databases the tests may create and drop."""
    url = os.environ.get("JOBGATE_TEST_PG_URL")
    if url:
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    if REQUIRE_PG:
        pytest.fail("JOBGATE_REQUIRE_PG=1 but neither JOBGATE_TEST_PG_URL nor a Docker engine is available")
    pytest.skip("no PostgreSQL: set JOBGATE_TEST_PG_URL or run a Docker engine")


@pytest.fixture(scope="session")
def opa_golib() -> None:
    """OPA's evaluator as a library (opa-golib-python-bindings; `make venv` installs it with its pin). Tests of
    the OPA engines ask for it: without it they skip, or fail where JOBGATE_REQUIRE_OPA=1."""
    try:
        import opa_bindings

        opa_bindings.OpaEngine().close()  # loads the shared library
    except (ImportError, OSError) as e:
        if REQUIRE_OPA:
            pytest.fail(f"JOBGATE_REQUIRE_OPA=1 but OPA's library does not load: {type(e).__name__}: {e}")
        pytest.skip(f"no OPA library (make venv installs opa-golib-python-bindings): {e}")


@pytest.fixture
def fresh_pg_database(pg_server_url: str) -> Iterator[Callable[[str], str]]:
    """Factory: create a new empty database and return its URL; all are dropped after the test."""
    import psycopg

    created: list[str] = []

    def make(prefix: str = "jobgate_test") -> str:
        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        parts = urlsplit(pg_server_url)
        return urlunsplit(parts._replace(path="/" + name))

    yield make
    for name in created:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def run_on_a_terminal() -> Callable[..., tuple[int, bytes, bytes]]:
    """Run `jobgate ARGS` with stderr on a pseudo-terminal, as a person at a shell would see it.

    Returns (exit code, stdout, what the terminal showed): progress bars draw only on a terminal."""
    import pty
    import subprocess
    import sys

    jobgate = os.path.join(os.path.dirname(sys.executable), "jobgate")

    def run(*args: str) -> tuple[int, bytes, bytes]:
        master, slave = pty.openpty()
        try:
            proc = subprocess.run([jobgate, *args], stdout=subprocess.PIPE, stderr=slave, timeout=120, check=False)
            os.close(slave)
            seen = b""
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the other end closed
                    break
                if not chunk:
                    break
                seen += chunk
        finally:
            os.close(master)
        return proc.returncode, proc.stdout, seen

    return run
