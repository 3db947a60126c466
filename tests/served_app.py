"""An ASGI app (its lifespan already running in a test fixture) served on a real socket by uvicorn, in a thread:
for tests that drive it with a real browser or a real CLI subprocess."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Yields the app's base URL (http://127.0.0.1:PORT) once uvicorn listens; stops it afterwards."""
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
