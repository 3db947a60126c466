"""Slurm's JWT (auth/jwt, HS256), minted with the cluster's key so that no `scontrol token` is needed.

The starter refuses `scontrol token` to everyone but SlurmUser (AuthAltParameters=disable_token_creation),
so jobgate signs its own: header {"alg": "HS256", "typ": "JWT"}, claims `sun` (the Slurm user name),
`iat` and `exp` (RFC 7519), signature HMAC-SHA256 over "header.payload" with the key's raw bytes.
Whoever holds the key can sign for any user: it is read here, never logged or kept in a record.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

from gateway.execution.slurm.errors import SlurmConfigError


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint_token(key: bytes, user: str, *, now: int, lifetime_s: int) -> str:
    """A token for `user`, valid from `now` (epoch s) for `lifetime_s`. Raises SlurmConfigError."""
    if len(key) < 16:
        raise SlurmConfigError("jwt", "the HS256 key is shorter than 16 bytes")
    if lifetime_s < 1:
        raise SlurmConfigError("jwt", f"token lifetime {lifetime_s} s is not positive")
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = _b64(json.dumps({"exp": now + lifetime_s, "iat": now, "sun": user}, separators=(",", ":")).encode())
    signing_input = f"{header}.{claims}".encode("ascii")
    signature = _b64(hmac.new(key, signing_input, hashlib.sha256).digest())
    return f"{header}.{claims}.{signature}"


def read_key(path: Path) -> bytes:
    """The key's bytes. Raises SlurmConfigError when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise SlurmConfigError("jwt", f"cannot read the JWT key {path}: {e.strerror}") from e
