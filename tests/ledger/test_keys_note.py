"""C2SP signed-note keys, signatures and tlog-checkpoints.

Reference key pair and note: golang.org/x/mod/sumdb/note note_test.go (the PeterNeumann example);
Ed25519 is deterministic, so our signature must match it byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest

from ledger.errors import BadSignature, KeyFormatError, KeyMismatch, MalformedNote, UnknownKey
from ledger.keys import NoteSigner, NoteVerifier, load_or_create_signer
from ledger.note import Checkpoint, open_checkpoint, open_note, parse_checkpoint, sign_checkpoint, sign_note

GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (
    GO_TEXT
    + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_reference_keys_parse_and_match() -> None:
    s = NoteSigner.from_skey(GO_SKEY)
    assert s.vkey == GO_VKEY
    assert s.skey == GO_SKEY
    v = NoteVerifier.from_vkey(GO_VKEY)
    assert v.name == "PeterNeumann" and v.key_id.hex() == "c74f20a3"


def test_key_id_is_computed_as_spec() -> None:
    v = NoteVerifier.from_vkey(GO_VKEY)
    want = hashlib.sha256(b"PeterNeumann\n\x01" + v.public_key).digest()[:4]
    assert v.key_id == want


def test_reference_note_signs_byte_for_byte_and_opens() -> None:
    assert sign_note(GO_TEXT, NoteSigner.from_skey(GO_SKEY)) == GO_NOTE
    assert open_note(GO_NOTE, NoteVerifier.from_vkey(GO_VKEY)) == GO_TEXT


def test_tampered_note_is_bad_signature() -> None:
    with pytest.raises(BadSignature):
        open_note(GO_NOTE.replace("cryptography", "cryptographY"), NoteVerifier.from_vkey(GO_VKEY))


def test_note_signed_by_another_key_is_unknown_key() -> None:
    other = NoteSigner.generate("PeterNeumann")
    with pytest.raises(UnknownKey):
        open_note(sign_note(GO_TEXT, other), NoteVerifier.from_vkey(GO_VKEY))


@pytest.mark.parametrize(
    "vkey",
    [
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong id
        "PeterNeumann+c74f20a3+AhpC2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong type byte
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10",  # short
        "PeterNeumann+c74f20a3",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "not a key at all",
        "",
    ],
)
def test_malformed_vkeys_raise_key_format_error(vkey: str) -> None:
    with pytest.raises(KeyFormatError):
        NoteVerifier.from_vkey(vkey)


@pytest.mark.parametrize(
    "note",
    [
        GO_TEXT,
        GO_TEXT + "\n",
        GO_TEXT + "\n- PeterNeumann abc\n",
        GO_TEXT + "\n— PeterNeumann !!!\n",
        "x\x01\n\n— a b\n",
    ],
    ids=["no-sigs", "empty-sigs", "ascii-dash", "bad-base64", "control-char"],
)
def test_malformed_notes(note: str) -> None:
    with pytest.raises(MalformedNote):
        open_note(note, NoteVerifier.from_vkey(GO_VKEY))


def test_checkpoint_round_trip() -> None:
    s = NoteSigner.generate("jobgate.local/ledger")
    cp = Checkpoint("jobgate.local/ledger", 42, bytes(range(32)))
    note = sign_checkpoint(cp, s)
    head, _, sig_line = note.partition("\n\n")
    assert head == "jobgate.local/ledger\n42\n" + base64.b64encode(bytes(range(32))).decode()
    assert sig_line.startswith("— jobgate.local/ledger ")
    assert base64.b64decode(sig_line.split(" ")[2])[:4] == s.key_id
    assert open_checkpoint(note, s.verifier()) == cp
    with pytest.raises(MalformedNote):
        parse_checkpoint("origin\n042\nAAAA\n")


def test_load_or_create_signer_writes_0600_and_reuses(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    s1 = load_or_create_signer(keys, "jobgate.local/ledger")
    mode = stat.S_IMODE(os.stat(keys / "ledger.key").st_mode)
    assert mode == 0o600
    assert (keys / "ledger.key").read_text().startswith("PRIVATE+KEY+jobgate.local/ledger+")
    assert (keys / "ledger.vkey").read_text().strip() == s1.vkey
    s2 = load_or_create_signer(keys, "jobgate.local/ledger")
    assert s2.vkey == s1.vkey and s2.sign(b"x") == s1.sign(b"x")
    assert "PRIVATE" not in repr(s2)
    with pytest.raises(KeyMismatch):
        load_or_create_signer(keys, "other.example/log")
    (keys / "ledger.key").write_text("garbage\n")
    with pytest.raises(KeyFormatError):
        load_or_create_signer(keys, "jobgate.local/ledger")
