"""Wakes long-polling node agents when commands are queued for them (in-process, per gateway replica)."""

from __future__ import annotations

import threading
from collections import defaultdict


class CommandBus:
    """A version counter per node; pollers wait until the counter moves or their time runs out."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._versions: dict[str, int] = defaultdict(int)

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

    def wait(self, node: str, seen: int, timeout: float) -> bool:
        """Block until the node's version differs from `seen`; True if it moved."""
        with self._cond:
            return self._cond.wait_for(lambda: self._versions[node] != seen, timeout=timeout)
