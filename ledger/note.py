"""C2SP signed-note and C2SP tlog-checkpoint: signing, opening and parsing checkpoints.

Checkpoint text: "<origin>\\n<tree size>\\n<base64 root hash>\\n" (extension lines ignored).
Signed note: text, a blank line, then "— <key name> <base64(4-byte key id || signature)>\\n" lines.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from ledger.errors import BadSignature, MalformedNote, UnknownKey
from ledger.keys import NoteSigner, NoteVerifier
from ledger.merkle import HASH_SIZE

_SIG_PREFIX = "— "
_SIZE = re.compile(r"0|[1-9][0-9]{0,19}")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")  # any control character but LF
MAX_SIGNATURES = 100


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"


def sign_note(text: str, signer: NoteSigner) -> str:
    """Append one Ed25519 signature line to text (which must end in a newline)."""
    if not text.endswith("\n"):
        raise MalformedNote("note text must end with a newline")
    sig = signer.key_id + signer.sign(text.encode("utf-8"))
    return f"{text}\n{_SIG_PREFIX}{signer.name} {base64.b64encode(sig).decode()}\n"


def sign_checkpoint(cp: Checkpoint, signer: NoteSigner) -> str:
    return sign_note(cp.text(), signer)


def cosign(note: str, signer: NoteSigner) -> str:
    """Add signer's signature line to an already signed note (C2SP notes may carry several)."""
    split = note.rfind("\n\n")
    if split < 0 or not note.endswith("\n"):
        raise MalformedNote("cannot cosign: not a signed note")
    sig = signer.key_id + signer.sign(note[: split + 1].encode("utf-8"))
    return f"{note}{_SIG_PREFIX}{signer.name} {base64.b64encode(sig).decode()}\n"


def peek_checkpoint(note: str) -> Checkpoint:
    """Parse a signed checkpoint's text WITHOUT checking any signature (to choose the key)."""
    split = note.rfind("\n\n")
    if split < 0:
        raise MalformedNote("note has no blank line before its signatures")
    return parse_checkpoint(note[: split + 1])


def open_note(note: str, verifier: NoteVerifier) -> str:
    """Return the note text if verifier's key signed it.

    Raises MalformedNote, UnknownKey (no signature from this key) or BadSignature.
    """
    if _CONTROL.search(note):
        raise MalformedNote("note contains control characters")
    if not note.endswith("\n"):
        raise MalformedNote("note does not end with a newline")
    split = note.rfind("\n\n")
    if split < 0:
        raise MalformedNote("note has no blank line before its signatures")
    text, sigs = note[: split + 1], note[split + 2 :]
    lines = sigs.split("\n")[:-1]
    if not lines or len(lines) > MAX_SIGNATURES:
        raise MalformedNote("note has no signature lines" if not lines else "note has too many signatures")
    known = False
    for line in lines:
        if not line.startswith(_SIG_PREFIX):
            raise MalformedNote("signature line does not start with an em dash and a space")
        name, _, b64 = line[len(_SIG_PREFIX) :].partition(" ")
        if not name or not b64 or " " in b64:
            raise MalformedNote("malformed signature line")
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise MalformedNote("signature is not base64") from e
        if len(raw) < 5:
            raise MalformedNote("signature too short")
        # Signatures from other keys are ignored (C2SP signed-note §Signatures).
        if name != verifier.name or raw[:4] != verifier.key_id:
            continue
        known = True
        if not verifier.verify(text.encode("utf-8"), raw[4:]):
            raise BadSignature(f"signature by {name} does not verify")
    if not known:
        raise UnknownKey(f"note is not signed by {verifier.name}+{verifier.key_id.hex()}")
    return text


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse tlog-checkpoint note text (already opened); raises MalformedNote."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise MalformedNote("checkpoint needs origin, size and root lines")
    origin, size, root_b64 = lines[0], lines[1], lines[2]
    if not origin:
        raise MalformedNote("checkpoint origin is empty")
    if not _SIZE.fullmatch(size):
        raise MalformedNote("checkpoint tree size is not a decimal number")
    try:
        root = base64.b64decode(root_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MalformedNote("checkpoint root is not base64") from e
    if len(root) != HASH_SIZE:
        raise MalformedNote("checkpoint root is not 32 bytes")
    return Checkpoint(origin, int(size), root)


def open_checkpoint(note: str, verifier: NoteVerifier) -> Checkpoint:
    """Verify and parse a signed checkpoint; the origin must be the verifier's key name."""
    cp = parse_checkpoint(open_note(note, verifier))
    if cp.origin != verifier.name:
        raise UnknownKey(f"checkpoint origin {cp.origin!r} is not the key name {verifier.name!r}")
    return cp


def signature_key_ids(note: str) -> list[str]:
    """The 8-hex key ids a signed note's signature lines name, in order, WITHOUT checking a signature (to say
    which keys signed a note no key at hand opens). Lines that do not parse are left out."""
    split = note.rfind("\n\n")
    ids = []
    for line in note[split + 2 :].split("\n") if split >= 0 else []:
        _, _, b64 = line[len(_SIG_PREFIX) :].partition(" ")
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            continue
        if line.startswith(_SIG_PREFIX) and len(raw) >= 5:
            ids.append(raw[:4].hex())
    return ids
