"""Red-team cases for the verifier: an attacker who controls the database and the signing host, but
not the auditor's saved public key or trusted checkpoint, must not get a changed history accepted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ledger_bundle_kit import ORIGIN, Bundle, export, make_data_dir, run, verify

from ledger.entry import encode, prepare
from ledger.keys import NoteSigner, NoteVerifier, load_or_create_signer
from ledger.merkle import MerkleTree, leaf_hash
from ledger.note import Checkpoint, sign_checkpoint
from ledger.rotation import ROTATION_KIND, rotation_body
from ledger.service import Ledger
from ledger.store import SqliteStore


def _append_rotation_row(db: Path, old: NoteSigner, new: NoteVerifier) -> int:
    """Write a rotation entry old -> new straight into the store, its checkpoint signed by old only
    (what someone without new's private key can do); returns the rotation's seq."""
    store = SqliteStore(db)
    try:
        rows = store.get_entries(0, store.count())
        tree = MerkleTree()
        for _, _, raw in rows:
            tree.append(leaf_hash(raw))
        seq = len(rows)
        body = rotation_body(old.verifier(), new)
        raw = encode(prepare(ROTATION_KIND, body, None), seq, "2025-01-02T03:04:06.000000Z", rows[-1][1])
        tree.append(leaf_hash(raw))
        note = sign_checkpoint(Checkpoint(ORIGIN, seq + 1, tree.root()), old)
        store.write_batch([(seq, hashlib.sha256(raw).hexdigest(), raw)], {}, (seq + 1, note))
    finally:
        store.close()
    return seq


def test_a_ledger_of_a_foreign_key_rotating_to_the_auditors_key_is_unknown_key(tmp_path: Path) -> None:
    # The auditor's key never signed anything here: the attacker built the whole ledger under a key
    # of their own and ended it with an entry "rotating" to the auditor's public key.
    auditor = NoteSigner.generate(ORIGIN)
    key = tmp_path / "auditor.vkey"
    key.write_text(auditor.vkey + "\n")
    d = tmp_path / "forged"
    rogue = make_data_dir(d, 5)
    seq = _append_rotation_row(d / "ledger.db", rogue, auditor.verifier())

    code, out, _ = run("verify", "--db", f"sqlite:///{d}/ledger.db", "--public-key", str(key), "--json")
    v = json.loads(out)
    assert code == 1 and (v["first_bad_seq"], v["problem"]) == (seq, "unknown_key"), v
    assert "not cosigned by the key it announces" in v["message"]

    code, out, _ = verify(export(d, tmp_path / "forged.bundle"), key)
    assert code == 1 and out.startswith(f"FAIL: seq {seq} unknown_key: key rotation is not cosigned"), out


def test_a_history_resigned_under_a_key_rotated_in_before_the_trusted_checkpoint_is_modified(
    tmp_path: Path,
) -> None:
    # The insider holds the signing key K the auditor trusts. They rebuild the ledger without one
    # decision and slip in a rotation K -> X at its start, so every later size belongs to X.
    k = load_or_create_signer(tmp_path / "a" / "keys", ORIGIN)
    notes = []
    with Ledger.open(f"sqlite:///{tmp_path}/a/ledger.db", signer=k) as led:
        for i in range(20):
            led.append("decision", {"i": i})
            notes.append(led.latest_checkpoint())
    trusted = tmp_path / "trusted.note"
    trusted.write_text(notes[11])  # the auditor saved the checkpoint at size 12, signed by K
    x = NoteSigner.generate(ORIGIN)
    (tmp_path / "b").mkdir()
    with Ledger.open(f"sqlite:///{tmp_path}/b/ledger.db", signer=k) as led:
        led.append("decision", {"i": 0})
        led.rotate_key(x)
    with Ledger.open(f"sqlite:///{tmp_path}/b/ledger.db", signer=x) as led:
        for i in range(1, 20):
            if i != 5:
                led.append("decision", {"i": i})
    key = tmp_path / "a" / "keys" / "ledger.vkey"
    db = f"sqlite:///{tmp_path}/b/ledger.db"

    code, out, err = run("verify", "--db", db, "--public-key", str(key), "--trusted-checkpoint", str(trusted), "--json")
    v = json.loads(out)
    assert code == 1 and v["problem"] == "modified" and "history rewritten" in v["message"], out + err

    bundle = export(tmp_path / "b", tmp_path / "b.bundle")
    code, out, err = verify(bundle, key, "--trusted-checkpoint", str(trusted))
    assert code == 1 and out.startswith("FAIL: modified: history rewritten"), out + err


@pytest.mark.parametrize(
    ("lo", "hi", "want"), [(10, 25, "FAIL: seq 10 inserted"), (0, 25, "FAIL: modified")], ids=["middle", "prefix"]
)
def test_a_partial_bundle_claiming_an_empty_signed_tree_fails_without_a_traceback(
    tmp_path: Path, lo: int, hi: int, want: str
) -> None:
    d = tmp_path / "var"
    make_data_dir(d, 40)
    b = Bundle.read(export(d, tmp_path / "p.bundle", "--from-seq", str(lo), "--to-seq", str(hi)))
    b.header["tree_size"] = 0  # the header is not signed: nothing stops an editor from zeroing it
    code, out, err = verify(b.write(tmp_path / "zero.bundle"), d / "keys" / "ledger.vkey")
    assert code == 1 and out.startswith(want), out + err


def test_a_key_history_entry_with_a_lone_surrogate_is_a_one_line_error(tmp_path: Path) -> None:
    d = tmp_path / "var"
    make_data_dir(d, 12)
    b = Bundle.read(export(d, tmp_path / "full.bundle"))
    b.trailer["key_history"] = [{"seq": 1, "entry": "\ud800", "inclusion": []}]  # JSON "\ud800": valid JSON
    code, out, err = verify(b.write(tmp_path / "surrogate.bundle"), d / "keys" / "ledger.vkey")
    assert code == 2 and out == "" and err == "Error: bundle is corrupt: a key_history entry is not UTF-8 text\n", err
