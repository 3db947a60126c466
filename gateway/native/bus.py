"""Wakes long-polling node agents when commands are queued for them.

The counters live in each process; a command queued through another replica of the same PostgreSQL database
reaches them as a signal (gateway/store/signals.py, sent by `wake_after_commit` in gateway/native/commands.py),
and a listener that was disconnected wakes every poll once it is back (it may have missed some). The long poll's
own timeout bounds a wake-up lost anyway: the agent asks again and finds its commands in the database."""

from __future__ import annotations

import threading
from collections import defaultdict

from gateway.store.signals import Signals


class CommandBus:
    """A version counter per node; pollers wait until the counter moves or their time runs out."""

    def __init__(self, signals: Signals | None = None) -> None:
        self.signals = signals  # tells the other replicas' buses (PostgreSQL); None: this process only
        self._cond = threading.Condition()
        self._versions: dict[str, int] = defaultdict(int)
        self._closed = False

    def version(self, node: str) -> int:
        with self._cond:
            return self._versions[node]

    def notify(self, nodes: set[str] | list[str]) -> None:
        if not nodes:
            return
        with self._cond:
            for node in nodes:
                self._versions[node] += 1
            self._cond.notify_all()

    def notify_all(self) -> None:
        """Wake every long poll (a signal may have been missed): each looks in the database again."""
        with self._cond:
            for node in self._versions:
                self._versions[node] += 1
            self._cond.notify_all()

    def wait(self, node: str, seen: int, timeout: float) -> bool:
        """Block until the node's version differs from `seen` (True) or the bus closes or time runs out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or self._versions[node] != seen, timeout=timeout)

    def close(self) -> None:
        """Release every long poll at once, so the server can shut down without waiting them out."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
