"""Signals between the replicas of one business database: PostgreSQL LISTEN/NOTIFY (issue 28).

What one replica changes in the database and another keeps a fast copy of in memory (a token in its auth cache,
its policy engine, the version counters that wake its agents' long polls) is announced on one channel. A signal
is sent with `publish` inside the transaction that makes the change, so PostgreSQL delivers it when, and only
if, that transaction commits. Each process listens on a dedicated connection in one thread, which reconnects when
the connection drops; after every (re)connect it calls the `on_connect` hooks, since what was announced while it
was away is lost: those hooks fall back to what the database holds (forget every cached token, wake every long
poll). A signal is a hint to look sooner, never the only way to learn a fact: each fast copy also has a bound of
its own (the auth cache's TTL, the policy check before every decision, the long poll's timeout).

On SQLite there is one gateway process per database (the ledger's claim on the data dir), so there is nothing to
tell: `publish` does nothing and no thread starts.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

log = logging.getLogger("jobgate.signals")

CHANNEL = "jobgate_replicas"
MAX_PAYLOAD = 7000  # bytes; PostgreSQL refuses a NOTIFY payload of 8,000 or more
POLL_S = 0.5  # how long the listener waits for a signal before it looks whether it was closed
RECONNECT_S = (0.2, 5.0)  # first and longest wait between attempts to reconnect

Handler = Callable[[Any], None]


class Signals:
    """One listener per gateway process; `publish` from any thread inside a business transaction."""

    def __init__(self, pg_url: str | None, replica: str | None = None) -> None:
        """`pg_url`: the business database as libpq takes it, or None (one process) for no signals at all.
        `replica` names this process in its own signals, which it skips."""
        self.url = pg_url
        self.replica = replica or secrets.token_hex(6)
        self._handlers: dict[str, Handler] = {}
        self._on_connect: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0  # signals from other replicas handled (for /metrics and tests)
        self.connects = 0  # times the listener (re)connected

    @property
    def enabled(self) -> bool:
        return self.url is not None

    @property
    def application_name(self) -> str:
        """How the listening connection shows in pg_stat_activity."""
        return f"jobgate-signals {self.replica}"[:63]  # PostgreSQL keeps 63 bytes of it

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def on(self, kind: str, handler: Handler) -> None:
        """Call `handler(value)` in the listener thread for each signal of `kind` another replica sends."""
        self._handlers[kind] = handler

    def on_connect(self, hook: Callable[[], None]) -> None:
        """Call `hook()` after every (re)connect: whatever was signalled while disconnected was missed."""
        self._on_connect.append(hook)

    def publish(self, session: Session, kind: str, value: Any) -> None:
        """Signal the other replicas once `session`'s transaction commits (never if it rolls back)."""
        if self.url is None:
            return
        payload = json.dumps({"r": self.replica, "k": kind, "v": value}, separators=(",", ":"))
        if len(payload.encode()) > MAX_PAYLOAD:
            # Too big for one NOTIFY (a wake-up of thousands of nodes): say "everything", which each handler
            # takes as "look at all of it".
            payload = json.dumps({"r": self.replica, "k": kind, "v": None})
        session.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": payload})

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    # -- the listener --------------------------------------------------------------------------

    def start(self) -> None:
        if self.url is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="replica-signals", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening. The thread is not joined: it ends within POLL_S, closing its connection."""
        self._stop.set()

    def _run(self) -> None:
        import psycopg

        backoff = RECONNECT_S[0]
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url or "", autocommit=True, connect_timeout=5,
                                     application_name=self.application_name) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connects += 1
                    self._connected.set()
                    backoff = RECONNECT_S[0]
                    self._connect_hooks()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=POLL_S):
                            self._dispatch(note.payload)
            except Exception as e:  # a dropped connection or a restarting server: listen again shortly
                if self._stop.is_set():
                    break
                log.warning("replica signals: listener disconnected (%s); reconnecting in %.1f s", e, backoff)
            self._connected.clear()
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2, RECONNECT_S[1])
        self._connected.clear()

    def _connect_hooks(self) -> None:
        for hook in self._on_connect:
            try:
                hook()
            except Exception:
                log.exception("replica signals: on-connect hook")

    def _dispatch(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            if note.get("r") == self.replica:
                return  # this process acted on its own change already, in the transaction's after-commit
            handler = self._handlers.get(note.get("k"))
        except (ValueError, AttributeError):
            log.warning("replica signals: unreadable payload %r", payload[:200])
            return
        if handler is None:
            return
        self.received += 1
        try:
            handler(note.get("v"))
        except Exception:  # one bad handler must not stop the signals the others need
            log.exception("replica signals: handler for %s", note.get("k"))
