"""The gateway's Ed25519 command key: signs every node command (H1). Generated once, kept mode 0600."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import nacl.signing

COMMAND_KEY_FILE = "command.key"
COMMAND_PUB_FILE = "command.pub"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_or_create_command_key(keys_dir: Path) -> nacl.signing.SigningKey:
    """Load the command signing key, creating it (and its public half for agents) on first start."""
    keys_dir.mkdir(parents=True, exist_ok=True)
    path = keys_dir / COMMAND_KEY_FILE
    if not path.exists():
        key = nacl.signing.SigningKey.generate()
        _write_private(path, base64.b64encode(bytes(key)).decode() + "\n")
    key = nacl.signing.SigningKey(base64.b64decode(path.read_text().strip()))
    pub = keys_dir / COMMAND_PUB_FILE
    pub_text = base64.b64encode(bytes(key.verify_key)).decode() + "\n"
    if not pub.exists() or pub.read_text() != pub_text:
        pub.write_text(pub_text)
    return key
