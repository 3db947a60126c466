"""Operator tasks on a ledger: signing-key rotation, and PostgreSQL set-up with an append-only role.

init-db runs before the gateway first starts (and again after an upgrade that adds a table: ledger_head).
Rotation on SQLite runs with the gateway stopped (one process writes it); on PostgreSQL it may run beside
the gateways appending to the ledger, and each of them refuses to append (KeyMismatch) from the rotation's
batch on, until it is restarted with the new key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from ledger.errors import KeyFormatError, StoreError
from ledger.keys import (
    NEXT_SIGNER_FILE,
    SIGNER_FILE,
    NoteSigner,
    install_rotated,
    load_signer,
    write_signer,
)
from ledger.rotation import ROTATION_MARK, rotation_in
from ledger.service import Ledger
from ledger.store import _PG_SCHEMA, _SCHEMA_LOCK, open_store

LEDGER_TABLES = ("ledger_entries", "ledger_checkpoints", "ledger_blobs", "ledger_head")
APPEND_ONLY_TABLES = LEDGER_TABLES[:3]  # the gateway role may INSERT and SELECT; on ledger_head UPDATE too


@dataclass(frozen=True)
class RotationResult:
    seq: int
    previous: str
    vkey: str
    resumed: bool


def _last_rotation_vkey(url: str) -> str | None:
    store = open_store(url, create=False)
    try:
        last = None
        for seq, _h, raw in store.iter_entries(0):
            if ROTATION_MARK in raw:
                rot = rotation_in(seq, raw)
                if rot is not None:
                    last = rot.new.vkey
        return last
    finally:
        store.close()


def rotate_key(
    keys_dir: Path, url: str, *, clock: Callable[[], datetime] | None = None, new: NoteSigner | None = None
) -> RotationResult:
    """Rotate the ledger signing key in keys_dir for the ledger at url. Crash-safe and resumable:

    1. the new key is written to ledger.key.next (fsynced) — or reused if a rotation was cut short;
    2. the ledger appends the announcement, signed under the old key and cosigned by the new one;
    3. ledger.key.next replaces ledger.key; ledger.vkey and ledger.vkeys (the history) are updated.

    Raises KeyFormatError, StoreError, LedgerCorrupted, LedgerUnavailable (all LedgerErrors).
    """
    keys_dir = Path(keys_dir)
    old = load_signer(keys_dir / SIGNER_FILE)
    pending = keys_dir / NEXT_SIGNER_FILE
    resumed = pending.exists()
    if resumed:
        nxt = load_signer(pending)
    else:
        nxt = new or NoteSigner.generate(old.name)
        if nxt.name != old.name:
            raise KeyFormatError(f"the new key must be named {old.name!r}")
        write_signer(pending, nxt)
    announced = _last_rotation_vkey(url)
    if announced == nxt.vkey:
        # Step 2 already happened before a crash; only the key files are left to switch.
        install_rotated(keys_dir, old, nxt)
        return RotationResult(-1, old.vkey, nxt.vkey, True)
    with Ledger.open(url, signer=old, clock=clock) as led:
        res = led.rotate_key(nxt)
    install_rotated(keys_dir, old, nxt)
    return RotationResult(res.seq, old.vkey, nxt.vkey, resumed)


# -- PostgreSQL ---------------------------------------------------------------------------------

LEDGER_FUNCTION = "ledger_refuse_change()"


def _confine_role(conn: Any, role: str) -> None:
    """Make the gateway role's rights on the ledger exactly INSERT and SELECT (and UPDATE of ledger_head), whatever
    it held before.

    1. A ledger first written through the role's own URL (the gateway started before init-db) has tables and
       trigger function owned by the role, and an owner grants itself DELETE, disables triggers, drops the
       function and with it every trigger: they are handed to the admin.
    2. A role that is a member of another role can SET ROLE to it (NOINHERIT does not stop that), and so holds
       that role's rights (pg_write_all_data, a DBA group): refused, for the operator to revoke, not revoked
       here behind their back.

    Raises psycopg.Error, or StoreError for a membership.
    """
    from psycopg import sql

    owned = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner"
        " WHERE r.rolname = %s AND c.oid = ANY (%s::regclass[])", (role, list(LEDGER_TABLES))).fetchall()
    for (table,) in owned:
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO CURRENT_USER").format(sql.Identifier(table)))
    fn = conn.execute("SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner"
                      " WHERE p.oid = %s::regprocedure", (LEDGER_FUNCTION,)).fetchone()
    if fn is not None and fn[0] == role:
        conn.execute(f"ALTER FUNCTION {LEDGER_FUNCTION} OWNER TO CURRENT_USER")
    held = [r for (r,) in conn.execute(
        "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
        " JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s ORDER BY 1", (role,)).fetchall()]
    if held:
        raise StoreError(f"role {role!r} is a member of {', '.join(held)} and could act as them (SET ROLE), so it"
                         f" would not be append-only; revoke that membership (REVOKE {held[0]} FROM {role}) first")


@dataclass(frozen=True)
class InitResult:
    database: str
    tables: tuple[str, ...]
    role: str | None
    gateway_url: str | None  # the URL the gateway should use (JOBGATE_LEDGER_URL), password included


def init_db(admin_url: str, *, role: str | None = None, password: str | None = None) -> InitResult:
    """Create the ledger tables and append-only triggers; optionally a role that may INSERT and SELECT, and
    UPDATE the head row (ledger_head) that every batch moves on, nothing else.

    The tables belong to the admin (the URL's user), so the gateway's role can neither alter nor
    drop them, nor disable the triggers. Idempotent: run again after an upgrade, it adds what is missing.
    Raises StoreError.
    """
    import psycopg
    from psycopg import sql

    if urlsplit(admin_url).scheme not in ("postgresql", "postgres"):
        raise StoreError("init-db needs a postgresql:// URL (SQLite ledgers are created on first start)")
    if role is not None and not role.replace("_", "").isalnum():
        raise StoreError(f"role name {role!r} must be letters, digits and underscores")
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(_PG_SCHEMA)
                tables = sql.SQL(", ").join(sql.Identifier(t) for t in LEDGER_TABLES)
                conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(tables))
                if role is not None:
                    found = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                    verb = "ALTER" if found else "CREATE"
                    # ALTER ROLE naming NOSUPERUSER at all needs a superuser, which the admin of a managed
                    # PostgreSQL is not: said only where it changes something, so that running init-db again
                    # (a new password) works there too.
                    nosuper = "NOSUPERUSER " if found is None or found[0] else ""
                    stmt = sql.SQL(verb + " ROLE {} LOGIN " + nosuper + "NOCREATEDB NOCREATEROLE NOINHERIT").format(
                        sql.Identifier(role)
                    )
                    if password is not None:
                        stmt = stmt + sql.SQL(" PASSWORD {}").format(sql.Literal(password))
                    conn.execute(stmt)
                    _confine_role(conn, role)
                    db = conn.execute("SELECT current_database()").fetchone()
                    assert db is not None
                    r = sql.Identifier(role)
                    conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, r))
                    appended = sql.SQL(", ").join(sql.Identifier(t) for t in APPEND_ONLY_TABLES)
                    conn.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(appended, r))
                    # Every batch moves the head on; its DELETE and TRUNCATE are refused by trigger even so.
                    conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON ledger_head TO {}").format(r))
                    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(db[0]), r))
                    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(r))
                    conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(r))
            name = conn.execute("SELECT current_database()").fetchone()
    except psycopg.Error as e:
        first = str(e).strip().splitlines()
        raise StoreError(f"init-db failed: {first[0] if first else type(e).__name__}") from e
    gateway_url = None
    if role is not None:
        parts = urlsplit(admin_url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        cred = quote(role, safe="") + (":" + quote(password, safe="") if password is not None else "")
        netloc = f"{cred}@{host}" + (f":{parts.port}" if parts.port else "")
        gateway_url = urlunsplit(parts._replace(netloc=netloc))
    return InitResult(name[0] if name else "", LEDGER_TABLES, role, gateway_url)
