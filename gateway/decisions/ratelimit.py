"""Calls-per-minute limits per principal and per project (H2), shared across replicas through Redis.

Uses the `limits` library's moving window; storage is in-memory by default and Redis when
JOBGATE_RATE_LIMIT_STORAGE=redis://... is set, so the counts hold across gateway replicas.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItemPerMinute, storage, strategies
from limits.errors import StorageError

DEFAULT_PER_PRINCIPAL = 60
DEFAULT_PER_PROJECT = 300


WINDOW_S = 60  # the moving window every calls-per-minute limit counts over


@dataclass(frozen=True)
class RateBreach:
    limit: str  # calls_per_minute_per_principal | calls_per_minute_per_project
    key: str
    value: int
    observed: int
    retry_after_s: int = WINDOW_S  # until the oldest call in the window leaves it and frees a place

    def sentence(self) -> str:
        scope = "principal" if self.limit.endswith("principal") else "project"
        return (f"rate limit {self.limit}: {scope} {self.key} may make {self.value} mutating calls per minute;"
                f" this would be call {self.observed}")


@dataclass(frozen=True)
class CountsUnavailable:
    """The shared counts (Redis) cannot be read: the call is refused, as if over the limit (fail closed)."""

    error: str

    def sentence(self) -> str:
        return f"rate limit counts are unavailable ({self.error}); the call is refused until they are back"


class _PerMinute(RateLimitItemPerMinute):
    """A per-minute limit keyed without its amount. `limits` puts the amount in the key, so a changed limit
    started a window of its own and the calls of the last minute counted from zero under it: lowering a limit
    in an incident handed the runaway script it was meant to slow a fresh minute's budget at once."""

    def key_for(self, *identifiers: bytes | str | int | float) -> str:
        return "/".join([self.namespace, *(str(k) for k in identifiers), "per-minute"])


# Schemes of the Redis (and Valkey) storages, plain, sentinel and cluster: they take redis-py's socket options.
_REDIS_SCHEMES = frozenset(scheme for kind in (storage.RedisStorage, storage.RedisSentinelStorage,
                                                storage.RedisClusterStorage) for scheme in kind.STORAGE_SCHEME or ())


class RateLimiter:
    def __init__(self, uri: str, numbers: Mapping[str, Any], *, timeout_s: float = 1.0) -> None:
        """`timeout_s` bounds each exchange with a Redis storage (a socket option in the URI's query wins)."""
        options: dict[str, float] = {}
        if uri.split(":", 1)[0] in _REDIS_SCHEMES:
            # redis-py waits for ever by default: a Redis that stopped answering (a partition, a paused failover)
            # held every mutating call, with its job rows locked, instead of refusing it as counts unavailable,
            # until the API's threads were all taken and even reads hung.
            options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        # wrap_exceptions: every storage's failure (a Redis connection refused, a timeout) is one StorageError.
        self._limiter = strategies.MovingWindowRateLimiter(
            storage.storage_from_string(uri, wrap_exceptions=True, **options))
        self.configure(numbers)

    def configure(self, numbers: Mapping[str, Any]) -> None:
        """Take the limits of a (re)loaded policy set; the calls of the last minute count under the new numbers."""
        self.per_principal = int(numbers.get("calls_per_minute_per_principal", DEFAULT_PER_PRINCIPAL))
        self.per_project = int(numbers.get("calls_per_minute_per_project", DEFAULT_PER_PROJECT))

    def hit(self, principal: str, projects: Iterable[str]) -> RateBreach | CountsUnavailable | None:
        """Count one mutating call; return the first limit it breaks, or that the counts cannot be read (the call
        is then refused)."""
        checks = [("calls_per_minute_per_principal", "principal", principal, self.per_principal)]
        checks += [("calls_per_minute_per_project", "project", p, self.per_project) for p in sorted(set(projects))]
        for name, kind, key, value in checks:
            item = _PerMinute(value)
            try:
                allowed = self._limiter.hit(item, "jobgate", kind, key)
            except StorageError as e:
                return CountsUnavailable(f"{type(e.storage_error).__name__}: {e.storage_error}")
            if not allowed:
                return RateBreach(name, key, value, value + 1, self._retry_after(item, kind, key))
        return None

    def _retry_after(self, item: _PerMinute, kind: str, key: str) -> int:
        """Whole seconds until the window has room for one more call (HTTP Retry-After), at least 1; the whole
        window when the counts cannot be read a second time."""
        try:
            reset = self._limiter.get_window_stats(item, "jobgate", kind, key).reset_time
        except StorageError:
            return WINDOW_S
        return min(WINDOW_S, max(1, math.ceil(reset - time.time())))
