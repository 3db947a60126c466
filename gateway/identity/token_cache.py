"""A short-lived, in-process memory of which principal a token hash belongs to (F1).

Authenticating costs a joined SELECT on every request, more than the rest of a no-op call. The facts it
reads (token scope, expiry, revocation, the principal's kind and responsible person) change only when a
token is revoked, so they are kept for `ttl_s` seconds per token hash:
- a revocation through this gateway forgets the token once its transaction commits (immediate here), and
  a request that read the token's row before that commit cannot put it back afterwards (`generation`);
- a revocation made through another replica reaches this one as a signal (gateway/store/signals.py, PostgreSQL
  LISTEN/NOTIFY) that forgets the token as soon as it arrives; were the signal lost, or the listener
  disconnected (it forgets every token when it reconnects), or the principal disabled straight in the database,
  it is seen within `ttl_s` (like the Kubernetes webhook token cache, but seconds rather than minutes);
- expiry is checked against the cached expiry on every call, so it is exact.
`ttl_s = 0` turns the cache off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

MAX_ENTRIES = 10_000  # tokens in use at once; beyond it the cache starts over rather than grow


@dataclass(frozen=True)
class TokenFacts:
    """What authentication needs from the token row and its principal."""

    token_id: str
    projects: tuple[str, ...]
    actions: tuple[str, ...]
    expires_at: datetime
    revoked_at: datetime | None
    principal_id: str
    kind: str
    responsible: str | None
    disabled: bool


class TokenCache:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, TokenFacts]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # how many times a token was forgotten

    def generation(self) -> int:
        """Read before loading a token's facts, and hand to `put`."""
        return self._generation

    def get(self, token_hash: str) -> TokenFacts | None:
        if self.ttl_s <= 0:
            return None
        hit = self._entries.get(token_hash)
        if hit is None or self._clock() - hit[0] >= self.ttl_s:
            return None
        return hit[1]

    def put(self, token_hash: str, facts: TokenFacts, generation: int) -> None:
        """Keep facts loaded since `generation()` returned `generation`, unless a token was forgotten meanwhile:
        then they may predate a revocation that committed after they were read (PostgreSQL lets a request
        read the row while the revocation is in flight), and putting them back would undo the forgetting."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            if generation != self._generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[token_hash] = (self._clock(), facts)

    def forget(self, token_hash: str) -> None:
        with self._lock:
            self._generation += 1
            self._entries.pop(token_hash, None)

    def clear(self) -> None:
        """Forget every token: revocations may have been announced while this process could not hear them."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
