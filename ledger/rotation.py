"""Signing-key rotation: the announcement entry and the key schedule a verifier follows.

A rotation is an ordinary ledger entry of kind ``ledger.key_rotation`` with body
``{"previous": <old vkey>, "vkey": <new vkey>}``. The ledger commits it as the LAST entry of its
batch, so there is a checkpoint of size seq+1; that checkpoint is signed by the old key (and
cosigned by the new one). Every later checkpoint is signed by the new key. The key name (the
checkpoint origin) never changes; the 4-byte key id does.

Key schedule: checkpoint of size s is checked with K_i where i is the number of rotations at seqs r
with r + 1 < s. A checkpoint signed by any other key fails as ``unknown_key``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledger.errors import KeyFormatError, LedgerError
from ledger.keys import NoteVerifier

ROTATION_KIND = "ledger.key_rotation"
# A cheap pre-filter for scans: canonical bytes of every rotation entry contain this.
ROTATION_MARK = b'"kind":"ledger.key_rotation"'


class RotationError(LedgerError):
    """A key-rotation entry is malformed or does not continue the key history."""


@dataclass(frozen=True)
class Rotation:
    seq: int
    previous: NoteVerifier
    new: NoteVerifier


def rotation_body(old: NoteVerifier, new: NoteVerifier) -> dict[str, str]:
    """The body of the entry announcing new; raises RotationError if the names differ."""
    if old.name != new.name:
        raise RotationError(f"a new key must keep the name {old.name!r} (the checkpoint origin)")
    if old.key_id == new.key_id:
        raise RotationError("the new key is the current key")
    return {"previous": old.vkey, "vkey": new.vkey}


def parse_rotation(seq: int, value: Any) -> Rotation | None:
    """The Rotation an entry announces, None if it is not a rotation; raises RotationError."""
    if not isinstance(value, dict) or value.get("kind") != ROTATION_KIND:
        return None
    body = value.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("previous"), str) or not isinstance(body.get("vkey"), str):
        raise RotationError(f"seq {seq}: key rotation entry lacks previous/vkey")
    try:
        prev, new = NoteVerifier.from_vkey(body["previous"]), NoteVerifier.from_vkey(body["vkey"])
    except KeyFormatError as e:
        raise RotationError(f"seq {seq}: key rotation entry holds a bad key: {e.diagnostics()}") from e
    if prev.name != new.name or prev.key_id == new.key_id:
        raise RotationError(f"seq {seq}: key rotation must keep the key name and change the key")
    return Rotation(seq, prev, new)


def rotation_in(seq: int, raw: bytes) -> Rotation | None:
    """parse_rotation over stored bytes, with the cheap byte pre-filter; raises RotationError."""
    if ROTATION_MARK not in raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise RotationError(f"seq {seq}: entry is not JSON") from e
    return parse_rotation(seq, value)


@dataclass(frozen=True)
class KeySchedule:
    """Which key signs a checkpoint of a given size."""

    keys: tuple[NoteVerifier, ...]  # K_0 .. K_n
    bounds: tuple[int, ...]  # bounds[i] = r_i + 1: the last size K_i signs (alone); K_{i+1} signs above

    @classmethod
    def build(cls, anchor: NoteVerifier, rotations: Sequence[Rotation]) -> KeySchedule:
        """Raises RotationError if the rotations do not chain (each previous = the key before)."""
        if not rotations:
            return cls((anchor,), ())
        keys = [rotations[0].previous]
        bounds: list[int] = []
        last = -1
        for r in rotations:
            if r.seq <= last:
                raise RotationError(f"seq {r.seq}: key rotations are out of order")
            if r.previous.vkey != keys[-1].vkey:
                raise RotationError(f"seq {r.seq}: key rotation does not start from the current key")
            keys.append(r.new)
            bounds.append(r.seq + 1)
            last = r.seq
        return cls(tuple(keys), tuple(bounds))

    def key_for(self, size: int) -> NoteVerifier:
        i = 0
        while i < len(self.bounds) and size > self.bounds[i]:
            i += 1
        return self.keys[i]

    def holds(self, v: NoteVerifier) -> bool:
        return any(k.vkey == v.vkey for k in self.keys)

    @property
    def vkeys(self) -> list[str]:
        return [k.vkey for k in self.keys]
