"""`jobgate ledger ...`: offline verification and proofs for auditors.

Exit codes: 0 intact, 1 verification failed, 2 bad input (one `error: ...` line, never a traceback).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from ledger.errors import LedgerError
from ledger.keys import VERIFIER_FILE, load_verifier
from ledger.proofs import consistency, inclusion, tree_from_store
from ledger.store import open_store
from ledger.verify import verify_store


def _error(msg: str) -> NoReturn:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def _url(data_dir: Path | None, db: str | None) -> str:
    if (data_dir is None) == (db is None):
        _error("give exactly one of --data-dir or --db")
    if data_dir is not None:
        if not data_dir.is_dir():
            _error(f"data directory {data_dir} does not exist")
        db_file = data_dir.resolve() / "ledger.db"
        if not db_file.is_file():
            _error(f"no ledger database at {db_file}")
        return f"sqlite:///{db_file}"
    assert db is not None
    return db


_data_dir = click.option("--data-dir", type=click.Path(path_type=Path), help="jobgate data directory.")
_db = click.option("--db", help="Ledger store URL (sqlite:///abs/path.db or postgresql://...).")


@click.group("ledger")
def ledger_group() -> None:
    """Verify the audit ledger and produce Merkle proofs."""


@ledger_group.command("verify")
@_data_dir
@_db
@click.option("--public-key", type=click.Path(path_type=Path), help="Verifier key file (vkey).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--deep", is_flag=True, help="Parse and re-canonicalise every entry (slower).")
def verify_cmd(data_dir: Path | None, db: str | None, public_key: Path | None, as_json: bool, deep: bool) -> None:
    """Re-hash every entry, check the chain, the tree, every checkpoint and every blob."""
    url = _url(data_dir, db)
    if public_key is None:
        if data_dir is None:
            _error("--public-key is required with --db")
        public_key = data_dir / "keys" / VERIFIER_FILE
    progress = None
    if sys.stderr.isatty():

        def progress(done: int, total: int) -> None:
            click.echo(f"\rverifying {done}/{total}", err=True, nl=False)

    try:
        verifier = load_verifier(public_key)
        verdict = verify_store(url, verifier, progress=progress, deep=deep)
    except LedgerError as e:
        _error(e.diagnostics())
    if progress is not None:
        click.echo("", err=True)
    if as_json:
        click.echo(json.dumps(verdict.to_json(), sort_keys=True))
    else:
        click.echo(("OK: " if verdict.ok else "FAIL: ") + verdict.message)
    sys.exit(0 if verdict.ok else 1)


@ledger_group.command("prove")
@click.option("--seq", type=int, required=True, help="Entry to prove.")
@click.option("--size", type=int, default=None, help="Tree size (default: the whole ledger).")
@_data_dir
@_db
def prove_cmd(seq: int, size: int | None, data_dir: Path | None, db: str | None) -> None:
    """Print an RFC 9162 inclusion proof as JSON."""
    url = _url(data_dir, db)
    try:
        store = open_store(url, create=False)
        try:
            proof = inclusion(tree_from_store(store), seq, size)
        finally:
            store.close()
    except LedgerError as e:
        _error(e.diagnostics())
    click.echo(json.dumps(proof.to_json()))


@ledger_group.command("consistency")
@click.option("--old", type=int, required=True, help="Older tree size.")
@click.option("--new", type=int, default=None, help="Newer tree size (default: the whole ledger).")
@_data_dir
@_db
def consistency_cmd(old: int, new: int | None, data_dir: Path | None, db: str | None) -> None:
    """Print an RFC 9162 consistency proof as JSON."""
    url = _url(data_dir, db)
    try:
        store = open_store(url, create=False)
        try:
            proof = consistency(tree_from_store(store), old, new)
        finally:
            store.close()
    except LedgerError as e:
        _error(e.diagnostics())
    click.echo(json.dumps(proof.to_json()))
