"""Wire format of the gateway → node-agent command channel (H1).

The gateway signs every command with its Ed25519 command key; an agent obeys a command only if the
signature verifies under the gateway's public command key, the command is addressed to this node, it has
not expired and its nonce has not been seen before. The signed bytes are the RFC 8785 canonical JSON of
the command, so both sides agree on them byte for byte.

This module is imported by the gateway (to sign) and by the agent (to verify); it depends on neither.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import nacl.exceptions
import nacl.signing
import rfc8785

CommandKind = Literal["start", "stop", "reconcile", "delete_artifacts"]
COMMAND_KINDS: tuple[str, ...] = ("start", "stop", "reconcile", "delete_artifacts")

# How far the agent's clock may be behind the gateway's: a command issued further in the agent's future is
# refused (clocks are kept by NTP; a larger gap is a fault to fix, not to tolerate).
MAX_CLOCK_SKEW_S = 30.0
# The longest a command may be valid: with the skew, what bounds how long a captured command could be replayed
# to an agent that lost its nonce store (the gateway's JOBGATE_COMMAND_TTL_S must stay below it).
MAX_COMMAND_TTL_S = 3600.0

# Events an agent reports back about a job's process group (and `deleted` for removed artifacts).
EVENT_KINDS: tuple[str, ...] = (
    "started", "stopping", "stopped", "exited", "rejected", "unknown", "deleted", "reconciled")


class CommandRejected(Exception):
    """A command the agent refuses to obey; `reason` is a stable, short code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Command:
    """One instruction for one node. `params` depend on `kind`.

    start: argv (list[str]), gpus (list[int]), grace_seconds (float), stop_signal (str), env (dict)
    stop:  grace_seconds (float), stop_signal (str), reason (str)
    reconcile: expected (list[str]), stop (list[str])
    delete_artifacts: what ("checkpoints" | "all"), reason (str) — only for a job not running here
    """

    kind: str
    node: str
    job_id: str
    nonce: str
    issued_at: float
    expires_at: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "job_id": self.job_id,
            "nonce": self.nonce,
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "params": dict(self.params),
        }


def new_nonce() -> str:
    return secrets.token_hex(16)


def sign_command(command: Command, key: nacl.signing.SigningKey) -> dict[str, str]:
    """Return the envelope `{"payload": <canonical JSON>, "signature": <base64>}` sent to the agent."""
    payload = rfc8785.dumps(command.to_json())
    signature = key.sign(payload).signature
    return {"payload": payload.decode(), "signature": base64.b64encode(signature).decode()}


def verify_command(
    envelope: Mapping[str, Any],
    key: nacl.signing.VerifyKey,
    *,
    node: str,
    now: float,
    seen_nonce: Any,
) -> Command:
    """Check signature, address, issue time and expiry, and nonce, in that order, and return the command.

    `seen_nonce(nonce) -> bool` reports whether the nonce was already accepted once (replay).
    Raises CommandRejected with reason forged | malformed | misaddressed | expired | future | lifetime |
    replayed.
    """
    try:
        payload = str(envelope["payload"]).encode()
        signature = base64.b64decode(str(envelope["signature"]), validate=True)
    except (KeyError, TypeError, binascii.Error) as e:
        raise CommandRejected("malformed", "envelope lacks payload or a base64 signature") from e
    try:
        key.verify(payload, signature)
    except (nacl.exceptions.BadSignatureError, ValueError) as e:
        raise CommandRejected("forged", "signature does not verify under the gateway command key") from e
    try:
        body = json.loads(payload)
        command = Command(
            kind=str(body["kind"]),
            node=str(body["node"]),
            job_id=str(body["job_id"]),
            nonce=str(body["nonce"]),
            issued_at=float(body["issued_at"]),
            expires_at=float(body["expires_at"]),
            params=dict(body.get("params") or {}),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CommandRejected("malformed", "signed payload is not a command") from e
    if command.kind not in COMMAND_KINDS:
        raise CommandRejected("malformed", f"unknown command kind {command.kind!r}")
    if command.node != node:
        raise CommandRejected("misaddressed", f"command for {command.node!r} delivered to {node!r}")
    if command.expires_at < now:
        raise CommandRejected("expired", f"expired {now - command.expires_at:.1f}s ago")
    if command.issued_at > now + MAX_CLOCK_SKEW_S:
        raise CommandRejected("future", f"issued {command.issued_at - now:.1f}s ahead of this node's clock (more"
                                        f" than the {MAX_CLOCK_SKEW_S:g}s skew allowed): check both clocks")
    if command.expires_at - command.issued_at > MAX_COMMAND_TTL_S:
        raise CommandRejected("lifetime", f"valid for {command.expires_at - command.issued_at:.0f}s, more than"
                                          f" the {MAX_COMMAND_TTL_S:g}s a command may be")
    if seen_nonce(command.nonce):
        raise CommandRejected("replayed", f"nonce {command.nonce} was already used")
    return command
