"""`jobgate ledger init-db` on real PostgreSQL: the gateway role can append and read, and move the head row
(ledger_head) on, nothing else."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from ledger_bundle_kit import ORIGIN, run

from ledger.admin import init_db
from ledger.errors import StoreError
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.verify import verify_store

pytestmark = pytest.mark.integration


@pytest.fixture
def role(pg_url: str) -> Iterator[str]:
    """A unique role name; the role is dropped after the test (roles are cluster-wide)."""
    import psycopg

    name = f"jobgate_ledger_gw_{secrets.token_hex(4)}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(f'DROP OWNED BY "{name}"')
    base = os.environ["JOBGATE_TEST_PG_URL"]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


@pytest.fixture
def gateway_url(pg_url: str, role: str) -> str:
    res = init_db(pg_url, role=role, password="s3cret pass")
    assert res.gateway_url is not None and res.role == role
    assert urlparse(res.gateway_url).username == role
    return res.gateway_url


def test_gateway_role_appends_reads_and_verifies(gateway_url: str) -> None:
    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(gateway_url, signer=signer) as led:
        for i in range(5):
            led.append("decision", {"i": i}, blobs={"s": b"snap"} if i == 2 else None)
        assert led.entry(3).value["body"] == {"i": 3}
    with Ledger.open(gateway_url, signer=signer) as led:  # reopen: no DDL needed
        led.append("decision", {"i": 5})
    v = verify_store(gateway_url, signer.verifier())
    assert v.ok and v.size == 6, v.message


def test_an_upgrade_to_the_head_row_asks_for_init_db_then_computes_the_head(pg_url: str, gateway_url: str) -> None:
    """A ledger set up before ledger_head existed: the append-only role may not create it, and says what to run;
    once init-db ran again, the first process to open it computes the head from the entries."""
    import psycopg

    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(gateway_url, signer=signer) as led:
        for i in range(7):
            led.append("decision", {"i": i})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE ledger_head")  # the schema as it was
    with pytest.raises(StoreError) as e:
        Ledger.open(gateway_url, signer=signer)
    assert "no ledger_head table" in str(e.value) and "jobgate ledger init-db" in str(e.value)
    assert "\n" not in str(e.value)
    init_db(pg_url, role=urlparse(gateway_url).username, password="s3cret pass")
    with Ledger.open(gateway_url, signer=signer) as led:
        assert led.append("decision", {"i": 7}).seq == 7
    v = verify_store(gateway_url, signer.verifier())
    assert v.ok and v.size == 8, v.message


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entries SET hash = 'x' WHERE seq = 0",
        "DELETE FROM ledger_entries WHERE seq = 0",
        "TRUNCATE ledger_entries",
        "UPDATE ledger_checkpoints SET note = 'x'",
        "DELETE FROM ledger_checkpoints",
        "TRUNCATE ledger_checkpoints",
        "UPDATE ledger_blobs SET data = 'x'",
        "DELETE FROM ledger_blobs",
        "TRUNCATE ledger_blobs",
        "DELETE FROM ledger_head",
        "TRUNCATE ledger_head",
        "ALTER TABLE ledger_head DISABLE TRIGGER ALL",
        "ALTER TABLE ledger_entries DISABLE TRIGGER ALL",
        "DROP TRIGGER ledger_entries_append_only ON ledger_entries",
        "DROP TABLE ledger_entries",
        "CREATE TABLE ledger_shadow (x int)",
    ],
)
def test_gateway_role_cannot_change_history(gateway_url: str, statement: str) -> None:
    import psycopg

    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(gateway_url, signer=signer) as led:
        led.append("decision", {"i": 0}, blobs={"s": b"snap"})
    with psycopg.connect(gateway_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)
        assert conn.execute("SELECT count(*) FROM ledger_entries").fetchone() == (1,)


@pytest.mark.parametrize(
    ("table", "column"),
    [("ledger_entries", "data"), ("ledger_checkpoints", "note"), ("ledger_blobs", "data"), ("ledger_head", None)],
)
def test_triggers_refuse_even_the_owner(pg_url: str, gateway_url: str, table: str, column: str | None) -> None:
    import psycopg

    with Ledger.open(gateway_url, signer=NoteSigner.generate(ORIGIN)) as led:
        led.append("decision", {"i": 0}, blobs={"s": b"snap"})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # The head is updated by every batch; it is never removed.
        changes = [f"UPDATE {table} SET {column} = {column}"] if column else []
        for stmt in (*changes, f"DELETE FROM {table}", f"TRUNCATE {table}"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(stmt)


def test_gateway_role_moves_the_head_on_and_no_further(gateway_url: str) -> None:
    """UPDATE of ledger_head is the one change the role may make: the rights say so, not only the triggers."""
    import psycopg

    with Ledger.open(gateway_url, signer=NoteSigner.generate(ORIGIN)) as led:
        led.append("decision", {"i": 0})
    with psycopg.connect(gateway_url, autocommit=True) as conn:
        rights = conn.execute(
            "SELECT table_name, string_agg(privilege_type, ',' ORDER BY privilege_type)"
            " FROM information_schema.table_privileges WHERE grantee = current_user GROUP BY 1 ORDER BY 1").fetchall()
    assert rights == [("ledger_blobs", "INSERT,SELECT"), ("ledger_checkpoints", "INSERT,SELECT"),
                      ("ledger_entries", "INSERT,SELECT"), ("ledger_head", "INSERT,SELECT,UPDATE")]


def test_init_db_cli(pg_url: str, role: str) -> None:
    code, out, err = run("init-db", "--url", pg_url, "--gateway-role", role, "--gateway-password", "pw", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["role"] == role
    assert res["tables"] == ["ledger_entries", "ledger_checkpoints", "ledger_blobs", "ledger_head"]
    # Idempotent: a second run updates the role and leaves the tables.
    code, out, err = run("init-db", "--url", pg_url, "--gateway-role", role, "--gateway-password", "pw2")
    assert code == 0 and f"JOBGATE_LEDGER_URL=postgresql://{role}:pw2@" in out, err


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "sqlite:///tmp/x.db"],
        ["--url", "postgresql://nobody@127.0.0.1:1/none"],
        ["--url", "postgresql://x@127.0.0.1/x", "--gateway-password", "pw"],
        ["--url", "postgresql://x@127.0.0.1/x", "--gateway-role", "bad;name"],
    ],
    ids=["sqlite", "unreachable", "password-without-role", "bad-role"],
)
def test_init_db_bad_input(args: list[str]) -> None:
    code, _, err = run("init-db", *args)
    assert code == 2 and err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "statements",
    [
        ["GRANT ALL ON ledger_entries TO CURRENT_USER", "ALTER TABLE ledger_entries DISABLE TRIGGER ALL",
         "DELETE FROM ledger_entries"],
        ["DROP FUNCTION ledger_refuse_change() CASCADE"],  # and with it every append-only trigger
    ],
    ids=["own-the-table", "own-the-trigger-function"],
)
def test_a_role_that_wrote_the_ledger_first_owns_nothing_after_init_db(
    pg_url: str, role: str, statements: list[str]
) -> None:
    """The gateway was started on the role's URL before init-db, so the role created (and owned) the ledger."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
    role_url = urlparse(pg_url)._replace(netloc=f"{role}@{urlparse(pg_url).hostname}:{urlparse(pg_url).port}").geturl()
    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(role_url, signer=signer) as led:
        led.append("decision", {"i": 0})
    gateway_url = init_db(pg_url, role=role).gateway_url
    assert gateway_url is not None
    with psycopg.connect(gateway_url, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        for stmt in statements:
            conn.execute(stmt)
    v = verify_store(gateway_url, signer.verifier())
    assert v.ok and v.size == 1, v.message


def test_init_db_refuses_a_role_that_can_set_role_to_another(pg_url: str, role: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE pg_write_all_data')
    code, _, err = run("init-db", "--url", pg_url, "--gateway-role", role)
    assert code == 2 and err.startswith("Error: ") and err.count("\n") == 1, err
    assert "member of pg_write_all_data" in err and f"REVOKE pg_write_all_data FROM {role}" in err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'REVOKE pg_write_all_data FROM "{role}"')
    code, _, err = run("init-db", "--url", pg_url, "--gateway-role", role)
    assert code == 0, err


@pytest.fixture
def managed_admin_url(pg_url: str) -> Iterator[str]:
    """The ledger database's owner as on a managed PostgreSQL: CREATEROLE, not a superuser."""
    import psycopg

    admin = f"jobgate_ledger_admin_{secrets.token_hex(4)}"
    db = urlparse(pg_url).path.lstrip("/")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{admin}" LOGIN CREATEROLE')
        conn.execute(f'ALTER DATABASE "{db}" OWNER TO "{admin}"')
    parts = urlparse(pg_url)
    yield parts._replace(netloc=f"{admin}@{parts.hostname}:{parts.port}").geturl()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'REASSIGN OWNED BY "{admin}" TO CURRENT_USER')
        conn.execute(f'DROP OWNED BY "{admin}"')
        conn.execute(f'DROP ROLE "{admin}"')


def test_init_db_runs_again_as_a_managed_postgresql_admin(managed_admin_url: str, role: str) -> None:
    """ALTER ROLE ... NOSUPERUSER needs a superuser: a second run (a new password) failed where there is none."""
    for password in ("pw", "pw2"):
        code, out, err = run("init-db", "--url", managed_admin_url, "--gateway-role", role,
                             "--gateway-password", password)
        assert code == 0 and f"JOBGATE_LEDGER_URL=postgresql://{role}:{password}@" in out, err
    gateway_url = out.strip().splitlines()[-1].split("=", 1)[1]
    with Ledger.open(gateway_url, signer=NoteSigner.generate(ORIGIN)) as led:
        led.append("decision", {"i": 0})
