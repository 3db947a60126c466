"""`jobgate ledger ...`: offline verification, export bundles, proofs, key rotation, PostgreSQL set-up.

Exit codes: 0 intact / done, 1 verification failed (one `FAIL: seq N problem: ...` line),
2 bad input (one `Error: ...` line on stderr, never a traceback), 3 not verified: signed by a key not in
the history given (one `NOT VERIFIED: untrusted_key: ...` line; no finding of tampering either way).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import click

from ledger.admin import init_db, rotate_key
from ledger.bundle import anchor_note, export_bundle, open_bundle
from ledger.errors import KeyFormatError, LedgerError
from ledger.keys import HISTORY_FILE, VERIFIER_FILE, NoteVerifier
from ledger.proofs import consistency, inclusion, tree_from_store
from ledger.store import open_store
from ledger.verify import Verdict, verify_store, verify_with_history


def _error(msg: str) -> NoReturn:
    click.echo(f"Error: {msg.splitlines()[0] if msg else 'failed'}", err=True)
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


def progress_bar(label: str) -> Callable[[int, int], None] | None:
    """A progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return None

    def draw(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        click.echo(f"\r{label} [{bar:<30}] {frac:4.0%} {done}/{total}", err=True, nl=False)

    return draw


def end_progress_bar(p: Callable[[int, int], None] | None) -> None:
    if p is not None:
        click.echo("", err=True)


_data_dir = click.option("--data-dir", type=click.Path(path_type=Path), help="jobgate data directory.")
_db = click.option("--db", help="Ledger store URL (sqlite:///abs/path.db or postgresql://...).")
_as_json = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.group("ledger")
def ledger_group() -> None:
    """Verify the audit ledger offline, export bundles, produce Merkle proofs, rotate keys."""


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        _error(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}")


MAX_VKEY_BYTES = 4096  # a vkey is about 100; a larger file (a bundle, a ledger) is not read whole to say so
MAX_HISTORY_BYTES = 1 << 16  # a key history: one vkey a line, hundreds of rotations


def _verifier(path: Path, given: bool) -> NoteVerifier:
    """The verifier key in PATH (`--public-key`, or the data directory's when `given` is false); a file that is
    not one is named with the option it came from, and why. Exits 2."""
    what = f"--public-key {path}" if given else f"the data directory's verifier key {path}"
    return _verifiers(path, what, MAX_VKEY_BYTES, one=True)[0]


def _verifiers(path: Path, what: str, limit: int, *, one: bool = False) -> list[NoteVerifier]:
    """The verifier keys in PATH, one a line (a vkey, or unless `one` a key history such as ledger.vkeys), in file
    order, all of one name; a file that holds none is named as `what`, and why. Exits 2."""
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        _error(f"cannot read {what}: {e.strerror or e}")
    if len(raw) > limit:
        _error(f"{what} is not a verifier key: a verifier key is one short line, this file is over {limit} bytes")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        _error(f"{what} is not a verifier key: it is not text")
    if text.startswith("PRIVATE+KEY+"):
        _error(f"{what} is not a verifier key: it is a private signing key; give its public half, the"
               f" {VERIFIER_FILE} beside it (the signing key stays with the gateway)")
    if one and len(text.splitlines()) > 1:
        _error(f"{what} is not a verifier key: a verifier key is one line, this file holds {len(text.splitlines())}")
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            keys.append(NoteVerifier.from_vkey(line))
        except KeyFormatError as e:
            where = f" (line {number})" if len(text.splitlines()) > 1 else ""
            _error(f"{what} is not a verifier key{where}: {e.diagnostics()}")
    if not keys:
        _error(f"{what} is not a verifier key: it is empty")
    if len({k.name for k in keys}) > 1:
        _error(f"{what} holds keys of several ledgers ({', '.join(sorted({k.name for k in keys}))}); a key history"
               " holds the keys of one")
    return keys


def _trusted_keys(path: Path, given: bool) -> list[NoteVerifier]:
    """The keys to verify with, oldest first: those in PATH (a vkey or a key history), with the key history
    that `rotate-key` keeps beside a data directory's ledger.vkey (HISTORY_FILE), if there is one. Exits 2."""
    what = f"--public-key {path}" if given else f"the data directory's verifier key {path}"
    keys = _verifiers(path, what, MAX_HISTORY_BYTES)
    beside = path.parent / HISTORY_FILE
    if path.name != HISTORY_FILE and beside.is_file():
        history = _verifiers(beside, f"the key history {beside} beside {path.name}", MAX_HISTORY_BYTES)
        if {k.name for k in history} == {k.name for k in keys}:
            keys = history + [k for k in keys if k.vkey not in {h.vkey for h in history}]
    return keys


def _print_verdict(verdict: Verdict, as_json: bool) -> NoReturn:
    # Signed by none of the keys given is no finding about the ledger, and must not read like tampering.
    untrusted = verdict.problem == "untrusted_key"
    if as_json:
        click.echo(json.dumps(verdict.to_json(), sort_keys=True))
    else:
        click.echo(("OK: " if verdict.ok else "NOT VERIFIED: " if untrusted else "FAIL: ") + verdict.message)
    sys.exit(0 if verdict.ok else 3 if untrusted else 1)


@ledger_group.command("verify")
@_data_dir
@_db
@click.option("--bundle", type=click.Path(path_type=Path), help="An export bundle (from `jobgate ledger export`).")
@click.option("--public-key", type=click.Path(path_type=Path),
              help="The auditor's verifier key file (vkey), or a key history (one vkey a line, e.g."
                   f" <data-dir>/keys/{HISTORY_FILE}); a {HISTORY_FILE} beside the vkey given is read too.")
@click.option(
    "--trusted-checkpoint",
    type=click.Path(path_type=Path),
    help="A signed checkpoint saved earlier (e.g. from GET /v1/ledger/checkpoint); the ledger must extend it.",
)
@_as_json
@click.option("--deep", is_flag=True, help="Parse and re-canonicalise every entry (slower).")
def verify_cmd(
    data_dir: Path | None,
    db: str | None,
    bundle: Path | None,
    public_key: Path | None,
    trusted_checkpoint: Path | None,
    as_json: bool,
    deep: bool,
) -> None:
    """Re-hash every entry; check the chain, the tree, every checkpoint signature, blobs and key history.

    Exit 0 with one summary line if intact; 1 with the first bad seq and the problem (modified,
    missing, reordered, inserted, truncated, bad_signature, unknown_key, blob_mismatch, malformed);
    2 for unusable input; 3 if no checkpoint is signed by a key given (untrusted_key: not verified,
    which is no finding of tampering). After `rotate-key` a bundle made before verifies with the key
    history, which the data directory keeps beside ledger.vkey.
    """
    sources = sum(x is not None for x in (data_dir, db, bundle))
    if sources != 1:
        _error("give exactly one of --bundle, --data-dir or --db")
    given = public_key is not None
    if public_key is None:
        if data_dir is None:
            _error("--public-key is required with --bundle or --db")
        _url(data_dir, None)  # no such directory, or no ledger in it, is said as such (not as a missing key)
        public_key = data_dir / "keys" / VERIFIER_FILE
    keys = _trusted_keys(public_key, given)
    trusted = _read_text(trusted_checkpoint, "trusted checkpoint") if trusted_checkpoint is not None else None
    progress = progress_bar("verifying")
    try:
        if bundle is not None:
            verdict = _verify_bundle(bundle, keys, progress, deep, trusted)
        else:
            verdict = verify_store(_url(data_dir, db), keys, progress=progress, deep=deep, trusted=trusted)
    except LedgerError as e:
        end_progress_bar(progress)
        _error(e.diagnostics())
    except OSError as e:  # the bundle went away or became unreadable while it was being read
        end_progress_bar(progress)
        _error(f"cannot read {e.filename or bundle or 'the ledger store'}: {e.strerror or e}")
    end_progress_bar(progress)
    _print_verdict(verdict, as_json)


def _verify_bundle(
    path: Path, keys: list[NoteVerifier], progress: Callable[[int, int], None] | None, deep: bool, trusted: str | None
) -> Verdict:
    header, material, f = open_bundle(path)
    try:
        if header.origin != keys[-1].name:
            _error(f"bundle is from ledger {header.origin!r}, but the public key is for {keys[-1].name!r}")
        return verify_with_history(material, keys, anchor_note=anchor_note(path), progress=progress, deep=deep,
                                   trusted=trusted)
    finally:
        f.close()


@ledger_group.command("export")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Bundle file to write.")
@click.option("--from-seq", type=int, default=0, show_default=True, help="First entry.")
@click.option("--to-seq", type=int, default=None, help="Last entry (default: the last signed one).")
@_data_dir
@_db
@click.option("--public-key", type=click.Path(path_type=Path), help="Key to list in the bundle (default: data dir's).")
@_as_json
def export_cmd(
    out: Path,
    from_seq: int,
    to_seq: int | None,
    data_dir: Path | None,
    db: str | None,
    public_key: Path | None,
    as_json: bool,
) -> None:
    """Write one self-contained bundle: entries, blobs, checkpoints, key history (and proofs for a range).

    The format is documented in ledger/bundle.py (JSON-lines with a header and a trailer).
    Verify it anywhere with `jobgate ledger verify --bundle FILE --public-key KEY`, KEY being the
    <data-dir>/keys/ledger.vkey the auditor obtained from the operators beforehand.
    """
    url = _url(data_dir, db)
    keys = [_verifier(public_key, given=True).vkey] if public_key is not None else []
    if public_key is None and data_dir is not None and (data_dir / "keys" / VERIFIER_FILE).is_file():
        keys = [_verifier(data_dir / "keys" / VERIFIER_FILE, given=False).vkey]
    progress = progress_bar("exporting")
    try:
        store = open_store(url, create=False)
        try:
            summary = export_bundle(
                store,
                out,
                from_seq=from_seq,
                to_seq=to_seq,
                keys=keys,
                exported_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                progress=progress,
            )
        finally:
            store.close()
    except LedgerError as e:
        end_progress_bar(progress)
        _error(e.diagnostics())
    end_progress_bar(progress)
    if as_json:
        click.echo(json.dumps(summary.to_json(), sort_keys=True))
    else:
        click.echo(
            f"Wrote {summary.path}: entries {summary.from_seq}..{summary.to_seq} of {summary.tree_size},"
            f" {summary.checkpoints} checkpoints, {summary.blobs} blobs, {summary.keys} key{'s' * (summary.keys != 1)}"
        )


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


@ledger_group.command("rotate-key")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="jobgate data directory.")
@click.option("--db", help="Ledger store URL if not the data dir's SQLite file (e.g. postgresql://...).")
@_as_json
def rotate_key_cmd(data_dir: Path, db: str | None, as_json: bool) -> None:
    """Replace the ledger signing key (run with the gateway stopped).

    The new key is announced in a ledger entry signed under the old key; verifiers follow the key
    history, and keys/ledger.vkeys lists every public key. Safe to re-run after a crash.
    """
    url = db if db is not None else _url(data_dir, None)
    try:
        res = rotate_key(data_dir / "keys", url)
    except LedgerError as e:
        _error(e.diagnostics())
    if as_json:
        click.echo(json.dumps(res.__dict__, sort_keys=True))
    else:
        where = f"announced at seq {res.seq}" if res.seq >= 0 else "announcement already in the ledger"
        click.echo(f"Rotated ledger key to {res.vkey} ({where}); auditors may keep their old key, and verify"
                   f" bundles made before with the key history, {data_dir / 'keys' / HISTORY_FILE}.")


@ledger_group.command("init-db")
@click.option("--url", required=True, help="postgresql:// URL of the ledger database, as its owner.")
@click.option("--gateway-role", default=None, help="Create (or update) this login role with INSERT and SELECT only.")
@click.option("--gateway-password", default=None, help="Password of the gateway role.")
@_as_json
def init_db_cmd(url: str, gateway_role: str | None, gateway_password: str | None, as_json: bool) -> None:
    """Create the ledger tables on PostgreSQL, with triggers refusing UPDATE, DELETE and TRUNCATE.

    With --gateway-role, also an append-only login role for the gateway; run the gateway with the
    printed URL as JOBGATE_LEDGER_URL.
    """
    if gateway_password is not None and gateway_role is None:
        _error("--gateway-password needs --gateway-role")
    try:
        res = init_db(url, role=gateway_role, password=gateway_password)
    except LedgerError as e:
        _error(e.diagnostics())
    if as_json:
        click.echo(
            json.dumps(
                {
                    "database": res.database,
                    "tables": list(res.tables),
                    "role": res.role,
                    "gateway_url": res.gateway_url,
                },
                sort_keys=True,
            )
        )
    else:
        click.echo(f"Ledger tables ready in {res.database} (append-only triggers on {', '.join(res.tables)}).")
        if res.gateway_url:
            click.echo(f"JOBGATE_LEDGER_URL={res.gateway_url}")
