"""Signing-key rotation: announced under the old key, followed by verifiers, unannounced keys refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ledger_bundle_kit import ORIGIN, Bundle, export, make_data_dir, run, verify

from ledger.admin import rotate_key
from ledger.errors import InvalidEntry, KeyMismatch, LedgerUnavailable
from ledger.keys import NEXT_SIGNER_FILE, NoteSigner, load_or_create_signer, write_signer
from ledger.merkle import MerkleTree, leaf_hash
from ledger.note import Checkpoint, sign_checkpoint
from ledger.rotation import ROTATION_KIND
from ledger.service import Ledger
from ledger.store import PostgresStore, SqliteStore, open_store
from ledger.verify import verify_store


def _append(data_dir: Path, n: int, tag: str) -> None:
    signer = load_or_create_signer(data_dir / "keys", ORIGIN)
    with Ledger.open(f"sqlite:///{data_dir}/ledger.db", signer=signer) as led:
        for i in range(n):
            led.append("decision", {"i": i, "tag": tag})


@pytest.fixture
def rotated(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A ledger: 20 entries under K0, rotation, 10 under K1, rotation, 5 under K2."""
    d = tmp_path / "var"
    make_data_dir(d, 20)
    k0 = tmp_path / "k0.vkey"
    k0.write_text((d / "keys/ledger.vkey").read_text())
    code, out, err = run("rotate-key", "--data-dir", str(d))
    assert code == 0 and "announced at seq 20" in out, err
    _append(d, 10, "k1")
    assert run("rotate-key", "--data-dir", str(d), "--json")[0] == 0
    _append(d, 5, "k2")
    return d, k0, d / "keys" / "ledger.vkey"


def test_rotation_entry_is_signed_by_old_and_new_key(rotated: tuple[Path, Path, Path]) -> None:
    d, k0, k2 = rotated
    store = open_store(f"sqlite:///{d}/ledger.db", create=False)
    try:
        ((_, _, raw),) = store.get_entries(20, 1)
        value = json.loads(raw)
        notes = dict(store.checkpoints())
    finally:
        store.close()
    assert value["kind"] == ROTATION_KIND and value["body"]["previous"] == k0.read_text().strip()
    assert notes[21].count("\n— ") == 2, "the rotation checkpoint carries the old and the new signature"
    assert notes[22].count("\n— ") == 1
    history = (d / "keys/ledger.vkeys").read_text().split()
    assert len(history) == 3 and history[0] == k0.read_text().strip() and history[-1] == k2.read_text().strip()


def test_verifier_follows_the_key_history_from_any_key(rotated: tuple[Path, Path, Path], tmp_path: Path) -> None:
    d, k0, k2 = rotated
    for key in (k0, k2):
        code, out, _ = run("verify", "--data-dir", str(d), "--public-key", str(key), "--json")
        v = json.loads(out)
        assert code == 0 and v["keys"] == 3 and v["size"] == 37, v["message"]
        bundle = export(d, tmp_path / "all.bundle")
        assert verify(bundle, key)[0] == 0
        assert Bundle.read(bundle).header["keys"] == (d / "keys/ledger.vkeys").read_text().split()
    # A range after both rotations: the announcements travel as key history with inclusion proofs.
    part = export(d, tmp_path / "late.bundle", "--from-seq", "33", "--to-seq", "36")
    b = Bundle.read(part)
    assert [h["seq"] for h in b.trailer["key_history"]] == [20, 31]  # type: ignore[index, union-attr]
    for key in (k0, k2):
        code, out, err = verify(part, key)
        assert code == 0, out + err


def test_the_readme_verify_works_for_bundles_made_before_and_after_a_rotation(tmp_path: Path) -> None:
    """After rotate-key, `verify --bundle B --public-key var/keys/ledger.vkey --trusted-checkpoint SAVED` said
    'FAIL: unknown_key' (exit 1, as for tampering) for every bundle made before: the data dir's vkey is the new key,
    which signed none of it. The key history beside it, or given itself, verifies both."""
    d = tmp_path / "var"
    make_data_dir(d, 20)
    store = open_store(f"sqlite:///{d}/ledger.db", create=False)
    saved = tmp_path / "saved-checkpoint.txt"
    saved.write_text(store.checkpoints()[-1][1])
    store.close()
    before = export(d, tmp_path / "before.bundle")
    assert run("rotate-key", "--data-dir", str(d))[0] == 0
    _append(d, 5, "k1")
    after = export(d, tmp_path / "after.bundle")
    new_key_alone = tmp_path / "auditor" / "ledger.vkey"  # the new vkey copied away from its history
    new_key_alone.parent.mkdir()
    new_key_alone.write_text((d / "keys/ledger.vkey").read_text())
    for bundle in (before, after):
        for key in (d / "keys/ledger.vkey", d / "keys/ledger.vkeys"):
            code, out, err = verify(bundle, key, "--trusted-checkpoint", str(saved))
            assert code == 0 and out.startswith("OK: "), (bundle.name, key.name, out + err)
    assert verify(after, new_key_alone)[0] == 0
    code, out, err = verify(before, new_key_alone)
    assert code == 3 and out.startswith("NOT VERIFIED: untrusted_key: signed by a key not in the history you gave"), out
    assert "Not a finding of tampering" in out and "keys/ledger.vkeys" in out and out.count("\n") == 1, out
    v = json.loads(verify(before, new_key_alone, "--json")[1])
    assert (v["ok"], v["problem"], v["first_bad_seq"]) == (False, "untrusted_key", None), v


def test_a_key_history_file_that_is_not_one_says_which_line(tmp_path: Path) -> None:
    d = tmp_path / "var"
    make_data_dir(d, 3)
    bad = tmp_path / "history.vkeys"
    bad.write_text((d / "keys/ledger.vkey").read_text() + "not-a-key\n")
    code, _, err = verify(export(d, tmp_path / "b.bundle"), bad)
    assert code == 2 and err.startswith(f"Error: --public-key {bad} is not a verifier key (line 2): "), err
    other = tmp_path / "other.vkeys"
    other.write_text((d / "keys/ledger.vkey").read_text() + NoteSigner.generate("elsewhere/ledger").vkey + "\n")
    code, _, err = verify(tmp_path / "b.bundle", other)
    assert code == 2 and "holds keys of several ledgers" in err, err


def test_forged_key_history_in_a_bundle_fails(rotated: tuple[Path, Path, Path], tmp_path: Path) -> None:
    d, k0, _ = rotated
    b = Bundle.read(export(d, tmp_path / "late.bundle", "--from-seq", "33"))
    evil = NoteSigner.generate(ORIGIN)
    item = b.trailer["key_history"][1]  # type: ignore[index]
    body = json.loads(item["entry"])
    body["body"]["vkey"] = evil.vkey
    from ledger.entry import canonical

    item["entry"] = canonical(body).decode()
    code, out, _ = verify(b.write(tmp_path / "forged.bundle"), k0, "--json")
    assert code == 1 and json.loads(out)["problem"] in ("modified", "unknown_key")


def test_checkpoint_signed_by_an_unannounced_key_is_unknown_key(tmp_path: Path) -> None:
    d = tmp_path / "var"
    make_data_dir(d, 10)
    # Someone with database access appends an entry and signs its checkpoint with their own key.
    store = SqliteStore(d / "ledger.db")
    rows = store.get_entries(0, 10)
    tree = MerkleTree()
    for _, _, raw in rows:
        tree.append(leaf_hash(raw))
    from ledger.entry import encode, prepare

    raw = encode(prepare("decision", {"forged": True}, None), 10, "2025-01-02T03:04:06.000000Z", rows[-1][1])
    tree.append(leaf_hash(raw))
    rogue = NoteSigner.generate(ORIGIN)
    store.write_batch(
        [(10, hashlib.sha256(raw).hexdigest(), raw)],
        {},
        (11, sign_checkpoint(Checkpoint(ORIGIN, 11, tree.root()), rogue)),
    )
    store.close()
    code, out, _ = run("verify", "--data-dir", str(d), "--json")
    v = json.loads(out)
    assert code == 1 and v["problem"] == "unknown_key" and "size 11" in v["message"]
    bundle = export(d, tmp_path / "b.bundle")
    code, out, _ = verify(bundle, d / "keys/ledger.vkey", "--json")
    assert code == 1 and json.loads(out)["problem"] == "unknown_key"
    # And the ledger refuses to sign on under a key that did not sign its latest checkpoint.
    with pytest.raises(KeyMismatch):
        Ledger.open(f"sqlite:///{d}/ledger.db", signer=NoteSigner.generate(ORIGIN))


def test_rotation_without_a_checkpoint_of_the_old_key_is_unknown_key(tmp_path: Path) -> None:
    d = tmp_path / "var"
    signer = make_data_dir(d, 5)
    new = NoteSigner.generate(ORIGIN)
    with Ledger.open(f"sqlite:///{d}/ledger.db", signer=signer) as led:
        led.rotate_key(new)
    # Drop the rotation checkpoint (signed by the old key): the new key was never endorsed.
    import sqlite3

    conn = sqlite3.connect(d / "ledger.db")
    conn.execute("DROP TRIGGER ledger_checkpoints_no_delete")
    conn.execute("DELETE FROM ledger_checkpoints WHERE size = 6")
    conn.commit()
    conn.close()
    code, out, _ = run("verify", "--data-dir", str(d), "--json")
    v = json.loads(out)
    assert code == 1 and (v["problem"], v["first_bad_seq"]) == ("unknown_key", 5), v


def test_interrupted_rotation_is_refused_then_resumed(tmp_path: Path) -> None:
    d = tmp_path / "var"
    old = make_data_dir(d, 5)
    new = NoteSigner.generate(ORIGIN)
    # Steps 1 and 2 of a rotation, then a crash before the key files were switched.
    write_signer(d / "keys" / NEXT_SIGNER_FILE, new)
    with Ledger.open(f"sqlite:///{d}/ledger.db", signer=old) as led:
        led.rotate_key(new)
    with pytest.raises(KeyMismatch, match="rotate-key"):
        Ledger.open(f"sqlite:///{d}/ledger.db", signer=old)
    code, out, err = run("rotate-key", "--data-dir", str(d))
    assert code == 0 and "already in the ledger" in out, err
    assert not (d / "keys" / NEXT_SIGNER_FILE).exists()
    assert (d / "keys/ledger.vkey").read_text().strip() == new.vkey
    _append(d, 3, "after")
    assert run("verify", "--data-dir", str(d))[0] == 0


def test_rotation_kind_cannot_be_appended_directly(tmp_path: Path) -> None:
    signer = load_or_create_signer(tmp_path / "keys", ORIGIN)
    with Ledger.open(f"sqlite:///{tmp_path}/l.db", signer=signer) as led, pytest.raises(InvalidEntry):
        led.append(ROTATION_KIND, {"previous": signer.vkey, "vkey": NoteSigner.generate(ORIGIN).vkey})


def test_rotate_key_bad_input(tmp_path: Path) -> None:
    code, _, err = run("rotate-key", "--data-dir", str(tmp_path / "missing"))
    assert code == 2 and err.startswith("Error: ") and err.count("\n") == 1
    d = tmp_path / "var"
    make_data_dir(d, 2)
    (d / "keys/ledger.key").write_text("garbage\n")
    code, _, err = run("rotate-key", "--data-dir", str(d))
    assert code == 2 and err.startswith("Error: ") and "Traceback" not in err


def test_rotate_key_api(tmp_path: Path) -> None:
    d = tmp_path / "var"
    make_data_dir(d, 3)
    res = rotate_key(d / "keys", f"sqlite:///{d}/ledger.db")
    assert res.seq == 3 and not res.resumed


@pytest.mark.integration
def test_a_rotation_on_postgresql_reaches_the_other_appenders_when_they_restart(pg_url: str, tmp_path: Path) -> None:
    """rotate-key runs beside the appenders; from its batch on the head announces the new key, and the processes
    still holding the old one refuse to append (one line) until they are restarted with the new key."""
    keys = tmp_path / "keys"
    k0 = load_or_create_signer(keys, ORIGIN)
    with Ledger.open(pg_url, signer=k0) as a, Ledger.open(pg_url, signer=k0) as b:
        a.append("decision", {"i": 0})
        b.append("decision", {"i": 1})
        res = rotate_key(keys, pg_url)
        assert res.seq == 2 and res.previous == k0.vkey
        for led in (a, b):
            with pytest.raises(LedgerUnavailable, match="head announces signing key") as e:
                led.append("decision", {"old key": True})
            assert "\n" not in str(e.value)
    with pytest.raises(KeyMismatch):
        Ledger.open(pg_url, signer=k0)
    k1 = load_or_create_signer(keys, ORIGIN)
    assert k1.vkey == res.vkey
    with Ledger.open(pg_url, signer=k1) as a, Ledger.open(pg_url, signer=k1) as b:
        assert [a.append("decision", {"i": 3}).seq, b.append("decision", {"i": 4}).seq] == [3, 4]
    store = PostgresStore(pg_url, create=False)
    try:
        head = store.head()
        assert head is not None and head.signer == k1.vkey and head.size == 5
    finally:
        store.close()
    v = verify_store(pg_url, k0.verifier())
    assert v.ok and v.size == 5, v.message
