"""The CLI sends an Idempotency-Key with each mutating request and retries once, with the same key, when the
connection fails (gateway/cli/client.py): through a proxy that forwards the first request to a real gateway and then
drops the connection before the answer, `jobgate job submit` reports the job, and the gateway holds it once."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

import pytest
from cli_testkit import jobgate
from gateway_testkit import Api
from sqlalchemy import func, select

from gateway.store.models import Job

pytestmark = pytest.mark.integration


def _read_message(conn: socket.socket) -> bytes:
    """One HTTP/1.1 message with a Content-Length body (what httpx and uvicorn send here)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(length.group(1)) if length else 0
    while len(body) < want:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class DroppingProxy:
    """Forwards each request to `upstream` and relays the answer, except the first POST's: that one is forwarded,
    answered by the gateway, and then the client's connection is closed without it (a replica killed, a load
    balancer's reset)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, socket.create_connection(self.upstream) as up:
            while request := _read_message(conn):
                self.requests.append(request)
                up.sendall(request)
                answer = _read_message(up)
                if request.startswith(b"POST") and not self.dropped:
                    self.dropped += 1
                    return  # the gateway answered; the client never hears it
                conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy(url: str) -> Iterator[DroppingProxy]:
    host, port = url.removeprefix("http://").split(":")
    p = DroppingProxy((host, int(port)))
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize("settings", ["sqlite"], indirect=True)
def test_a_submission_whose_answer_was_lost_is_retried_and_done_once(api: Api, proxy: DroppingProxy) -> None:
    code, out = jobgate(f"http://127.0.0.1:{proxy.port}", api, "alice", "job", "submit", "--name", "retried",
                        "--project", "vision", "--", "true")
    assert code == 0, out
    assert proxy.dropped == 1
    posts = [r for r in proxy.requests if r.startswith(b"POST")]
    keys = {re.search(rb"(?im)^idempotency-key:\s*(.+?)\r?$", r).group(1) for r in posts}  # type: ignore[union-attr]
    assert len(posts) == 2 and len(keys) == 1, posts  # the retry carried the first attempt's key
    with api.gateway.db.transaction(immediate=False) as s:
        ids = s.scalars(select(Job.id).where(Job.name == "retried")).all()
        assert s.scalar(select(func.count()).select_from(Job).where(Job.name == "retried")) == 1
    assert ids[0] in out
