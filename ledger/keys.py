"""Ed25519 note keys per C2SP signed-note (golang.org/x/mod/sumdb/note key encodings).

- key id  = SHA-256(name || 0x0A || 0x01 || 32-byte public key)[:4]
- vkey    = <name>+<8 hex key id>+<base64(0x01 || public key)>
- skey    = PRIVATE+KEY+<name>+<8 hex key id>+<base64(0x01 || 32-byte seed)>
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from pathlib import Path

import nacl.exceptions
import nacl.signing

from ledger.errors import KeyFormatError, KeyMismatch

ALG_ED25519 = 0x01
SIGNER_FILE = "ledger.key"
VERIFIER_FILE = "ledger.vkey"
NEXT_SIGNER_FILE = "ledger.key.next"  # a rotation in progress
HISTORY_FILE = "ledger.vkeys"  # every verifier key the ledger has used, oldest first

# Key names must be non-empty, without Unicode spaces or "+" (C2SP signed-note §Format).
_BAD_NAME = re.compile(r"[\s+]")


def _check_name(name: str) -> None:
    if not name or _BAD_NAME.search(name) or any(ord(c) < 0x20 for c in name):
        raise KeyFormatError(f"invalid key name {name!r}: must be non-empty, no spaces, no '+'")


def key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte C2SP key id of an Ed25519 key."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public_key).digest()[:4]


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise KeyFormatError(f"{what}: bad base64") from e


class NoteVerifier:
    """Verifies Ed25519 note signatures of one named key."""

    def __init__(self, name: str, public_key: bytes) -> None:
        _check_name(name)
        if len(public_key) != 32:
            raise KeyFormatError("Ed25519 public key must be 32 bytes")
        try:
            self._key = nacl.signing.VerifyKey(public_key)
        except (nacl.exceptions.CryptoError, ValueError, TypeError) as e:
            raise KeyFormatError("invalid Ed25519 public key") from e
        self.name = name
        self.public_key = public_key
        self.key_id = key_id(name, public_key)

    @classmethod
    def from_vkey(cls, vkey: str) -> NoteVerifier:
        """Parse <name>+<hex id>+<base64(0x01||pub)>; raises KeyFormatError."""
        # The base64 part may itself contain "+", so split at most twice.
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3:
            raise KeyFormatError("verifier key must be <name>+<hex key id>+<base64 key>")
        name, hex_id, b64 = parts
        if not re.fullmatch(r"[0-9a-f]{8}", hex_id):
            raise KeyFormatError("verifier key id must be 8 lowercase hex digits")
        raw = _b64decode(b64, "verifier key")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise KeyFormatError("verifier key is not an Ed25519 (type 0x01) key")
        v = cls(name, raw[1:])
        if v.key_id.hex() != hex_id:
            raise KeyFormatError("verifier key id does not match its name and public key")
        return v

    @property
    def vkey(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{b64}"

    def verify(self, msg: bytes, sig: bytes) -> bool:
        """True iff sig is this key's 64-byte Ed25519 signature of msg."""
        if len(sig) != 64:
            return False
        try:
            self._key.verify(msg, sig)
        except nacl.exceptions.BadSignatureError:
            return False
        return True


class NoteSigner:
    """Signs note text with a named Ed25519 key."""

    def __init__(self, name: str, seed: bytes) -> None:
        _check_name(name)
        if len(seed) != 32:
            raise KeyFormatError("Ed25519 seed must be 32 bytes")
        self._key = nacl.signing.SigningKey(seed)
        self._seed = seed
        self.name = name
        self.public_key = bytes(self._key.verify_key)
        self.key_id = key_id(name, self.public_key)

    @classmethod
    def generate(cls, name: str) -> NoteSigner:
        return cls(name, os.urandom(32))

    @classmethod
    def from_skey(cls, skey: str) -> NoteSigner:
        """Parse PRIVATE+KEY+<name>+<hex id>+<base64(0x01||seed)>; raises KeyFormatError."""
        # The base64 part may itself contain "+", so split at most four times.
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[0] != "PRIVATE" or parts[1] != "KEY":
            raise KeyFormatError("signer key must be PRIVATE+KEY+<name>+<hex key id>+<base64 key>")
        name, hex_id, b64 = parts[2], parts[3], parts[4]
        if not re.fullmatch(r"[0-9a-f]{8}", hex_id):
            raise KeyFormatError("signer key id must be 8 lowercase hex digits")
        raw = _b64decode(b64, "signer key")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise KeyFormatError("signer key is not an Ed25519 (type 0x01) key")
        s = cls(name, raw[1:])
        if s.key_id.hex() != hex_id:
            raise KeyFormatError("signer key id does not match its name and public key")
        return s

    @property
    def skey(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self._seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.key_id.hex()}+{b64}"

    @property
    def vkey(self) -> str:
        return self.verifier().vkey

    def sign(self, msg: bytes) -> bytes:
        """The 64-byte Ed25519 signature of msg."""
        return bytes(self._key.sign(msg).signature)

    def verifier(self) -> NoteVerifier:
        return NoteVerifier(self.name, self.public_key)

    def __repr__(self) -> str:
        # Never print the seed.
        return f"NoteSigner({self.name!r}, key_id={self.key_id.hex()})"


def load_or_create_signer(keys_dir: Path, name: str) -> NoteSigner:
    """Load keys_dir/ledger.key, or create it (mode 0600) with ledger.vkey and the key history ledger.vkeys beside
    it (the history from the start, so auditors can take the one file that verifies before and after a rotation).

    Raises KeyFormatError for an unreadable key file and KeyMismatch if it holds another name.
    """
    keys_dir = Path(keys_dir)
    key_path = keys_dir / SIGNER_FILE
    vkey_path = keys_dir / VERIFIER_FILE
    try:
        keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            signer = NoteSigner.from_skey(key_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            signer = NoteSigner.generate(name)
            # O_EXCL: two processes starting at once must not both write a key; the loser re-reads.
            try:
                fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                signer = NoteSigner.from_skey(key_path.read_text(encoding="utf-8"))
            else:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(signer.skey + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        if signer.name != name:
            raise KeyMismatch(f"{key_path} holds key {signer.name!r}, not {name!r}")
        if not vkey_path.exists() or vkey_path.read_text(encoding="utf-8").strip() != signer.vkey:
            tmp = vkey_path.with_suffix(".vkey.tmp")
            tmp.write_text(signer.vkey + "\n", encoding="utf-8")
            tmp.chmod(0o644)
            tmp.replace(vkey_path)
        hist_path = keys_dir / HISTORY_FILE
        if not hist_path.exists():
            tmp = keys_dir / (HISTORY_FILE + ".tmp")
            tmp.write_text(signer.vkey + "\n", encoding="utf-8")
            tmp.chmod(0o644)
            tmp.replace(hist_path)
    except OSError as e:
        raise KeyFormatError(f"cannot read or write ledger keys in {keys_dir}: {e.strerror}") from e
    return signer


def load_verifier(path: Path) -> NoteVerifier:
    """Read a vkey file; raises KeyFormatError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFormatError(f"cannot read public key {path}: {e}") from e
    return NoteVerifier.from_vkey(text)


def write_signer(path: Path, signer: NoteSigner) -> None:
    """Write a private key file (mode 0600, fsynced); raises KeyFormatError on I/O errors."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(signer.skey + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise KeyFormatError(f"cannot write key {path}: {e.strerror}") from e


def load_signer(path: Path) -> NoteSigner:
    """Read a private key file; raises KeyFormatError."""
    try:
        return NoteSigner.from_skey(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFormatError(f"cannot read signing key {path}: {e}") from e


def install_rotated(keys_dir: Path, old: NoteSigner, new: NoteSigner) -> None:
    """After the rotation entry is durable: make new the signer, publish its vkey, extend the history.

    The old private key is overwritten (by the atomic rename); its public key stays in the history.
    Raises KeyFormatError on I/O errors.
    """
    keys_dir = Path(keys_dir)
    hist = keys_dir / HISTORY_FILE
    try:
        known = hist.read_text(encoding="utf-8").split() if hist.exists() else []
        if not known:
            known = [old.vkey]
        if new.vkey not in known:
            known.append(new.vkey)
        for name, text, mode in (
            (HISTORY_FILE, "\n".join(known) + "\n", 0o644),
            (VERIFIER_FILE, new.vkey + "\n", 0o644),
        ):
            tmp = keys_dir / (name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.chmod(mode)
            tmp.replace(keys_dir / name)
        os.replace(keys_dir / NEXT_SIGNER_FILE, keys_dir / SIGNER_FILE)
        dfd = os.open(keys_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise KeyFormatError(f"cannot install the rotated key in {keys_dir}: {e.strerror}") from e
