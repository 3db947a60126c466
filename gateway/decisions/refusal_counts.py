"""Identical refusals counted into one ledger entry per window, so that a script retrying a refused call in a
loop costs one entry a minute rather than one a call.

The first refusal of a kind (same caller and token, same request, same answer) is an entry at once and opens a
window; identical ones within it are only counted, and answered with that entry's seq. When the window has
closed, one more entry says how many there were, from when to when (`flush`: on the next refusal, in the
housekeeping loop, at shutdown). Counts live in this process's memory: a crash loses the count of the last
window, never the first refusal, which is always an entry; a count that cannot be written is logged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

MAX_OPEN = 2_000  # windows open at once (each keeps its entry body); past that the oldest close early, counts written


@dataclass
class Window:
    key: str
    seq: int  # the entry of the first refusal, which the repeats are counted against
    body: dict[str, Any]  # that entry's body, restated in the count entry
    opened: datetime
    last: datetime
    repeats: int = 0


class RefusalCounts:
    """Thread-safe map from a refusal's key to its open window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Window] = {}  # insertion order is opening order

    def counted(self, key: str, now: datetime, window_s: float) -> int | None:
        """Count a refusal into the open window of its key: the seq of the entry it is counted against, or None
        when there is none (no window, or it has closed): the refusal is to be written."""
        if window_s <= 0:
            return None
        with self._lock:
            w = self._open.get(key)
            if w is None or now >= w.opened + timedelta(seconds=window_s):
                return None
            w.repeats += 1
            w.last = now
            return w.seq

    def open(self, key: str, seq: int, body: dict[str, Any], now: datetime, window_s: float) -> None:
        """Open the window of a refusal just written as `seq` (its key's closed window was taken already)."""
        if window_s > 0:
            with self._lock:
                self._open.pop(key, None)
                self._open[key] = Window(key, seq, body, now, now)

    def forget(self, key: str, seq: int) -> None:
        """The entry `seq` was not written: no repeat may be counted against it."""
        with self._lock:
            w = self._open.get(key)
            if w is not None and w.seq == seq:
                del self._open[key]

    def take_closed(self, now: datetime, window_s: float, *, everything: bool = False,
                    room_for: int = 0) -> list[Window]:
        """Remove the windows that have closed (all of them with `everything`, at shutdown), and the oldest
        beyond what leaves `room_for` more under MAX_OPEN; return those with repeats, to be written."""
        ends = now - timedelta(seconds=max(window_s, 0))
        closed: list[Window] = []
        with self._lock:
            # Opening order is closing order (one window length for all): the closed ones are at the front.
            while self._open and (everything or next(iter(self._open.values())).opened <= ends):
                closed.append(self._open.pop(next(iter(self._open))))
            while self._open and len(self._open) + room_for > MAX_OPEN:
                closed.append(self._open.pop(next(iter(self._open))))
        return [w for w in closed if w.repeats]
