"""Typed parameters of verified commands (see `protocol.Command`); parsing raises InvalidCommand.

A signature proves who sent a command, not that its parameters make sense on this node, so every field
is checked here before anything is spawned or signalled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent import procgroup
from nodeagent.errors import InvalidCommand

DEFAULT_GRACE_SECONDS = 30.0
DEFAULT_STOP_SIGNAL = "SIGTERM"


def _grace(value: Any, default: float | None) -> float | None:
    if value is None:
        return default
    try:
        grace = float(value)
    except (TypeError, ValueError) as e:
        raise InvalidCommand("invalid", f"grace_seconds {value!r} is not a number") from e
    if not math.isfinite(grace) or grace < 0:
        raise InvalidCommand("invalid", f"grace_seconds must be finite and ≥ 0, got {value!r}")
    return grace


def _signal(value: Any, default: str | None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidCommand("invalid", f"stop_signal {value!r} is not a signal name")
    return procgroup.parse_signal(value).name


def _str_list(params: Mapping[str, Any], key: str) -> list[str]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidCommand("invalid", f"{key} must be a list of strings")
    return value


@dataclass(frozen=True)
class StartParams:
    argv: tuple[str, ...]
    gpus: tuple[int, ...]
    env: dict[str, str]
    grace_seconds: float
    stop_signal: str
    # The submitting person, whose Unix account the job runs as where the node maps people to accounts.
    run_as: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any], *, node_gpus: int) -> StartParams:
        """Raises InvalidCommand for an empty argv, GPUs outside 0..node_gpus-1 or repeated, bad env or run_as."""
        argv = _str_list(params, "argv")
        if not argv:
            raise InvalidCommand("invalid", "argv is empty")
        raw_gpus = params.get("gpus") or []
        if not isinstance(raw_gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in raw_gpus
        ):
            raise InvalidCommand("invalid", "gpus must be a list of integers")
        if len(set(raw_gpus)) != len(raw_gpus) or any(not 0 <= g < node_gpus for g in raw_gpus):
            raise InvalidCommand("invalid", f"gpus {raw_gpus} are not distinct GPUs of 0..{node_gpus - 1}")
        env = params.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) for k, v in env.items()
        ):
            raise InvalidCommand("invalid", "env must map names to strings")
        grace = _grace(params.get("grace_seconds"), DEFAULT_GRACE_SECONDS)
        sig = _signal(params.get("stop_signal"), DEFAULT_STOP_SIGNAL)
        assert grace is not None and sig is not None
        run_as = params.get("run_as")
        if run_as is not None and not isinstance(run_as, str):
            raise InvalidCommand("invalid", "run_as must be a person's id")
        return cls(tuple(argv), tuple(raw_gpus), {k: str(v) for k, v in env.items()}, grace, sig, run_as)


@dataclass(frozen=True)
class StopParams:
    """Absent grace or signal means: use what the start command asked for."""

    grace_seconds: float | None
    stop_signal: str | None
    reason: str

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> StopParams:
        """Raises InvalidCommand for a negative or non-numeric grace window or an unknown signal."""
        return cls(
            _grace(params.get("grace_seconds"), None),
            _signal(params.get("stop_signal"), None),
            str(params.get("reason") or ""),
        )


@dataclass(frozen=True)
class ReconcileParams:
    """expected: jobs the gateway believes run here; stop: jobs to stop; pending: nonces of the commands the
    gateway still had in flight for this node when it reconciled (the only older starts still to be obeyed)."""

    expected: frozenset[str]
    stop: tuple[str, ...]
    pending: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> ReconcileParams:
        """Raises InvalidCommand unless `expected`, `stop` and `pending` are lists of strings."""
        return cls(frozenset(_str_list(params, "expected")), tuple(dict.fromkeys(_str_list(params, "stop"))),
                   frozenset(_str_list(params, "pending")))


@dataclass(frozen=True)
class DeleteParams:
    what: str
    reason: str

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> DeleteParams:
        """Raises InvalidCommand unless `what` is "checkpoints" or "all"."""
        what = params.get("what", "checkpoints")
        if what not in ("checkpoints", "all"):
            raise InvalidCommand("invalid", f"what must be 'checkpoints' or 'all', got {what!r}")
        return cls(str(what), str(params.get("reason") or ""))
