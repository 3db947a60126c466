"""The agent's only link to the gateway: three outbound HTTP calls (H1: the agent serves nothing).

`GatewayPort` is the seam; `HttpGateway` is the real implementation. All httpx errors are mapped to
GatewayError here, in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from nodeagent.errors import GatewayError


class GatewayPort(Protocol):
    def heartbeat(self, body: dict[str, Any]) -> None: ...

    def fetch_commands(self, wait: float) -> list[Any]: ...

    def post_reports(self, reports: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


@contextmanager
def _mapped(operation: str) -> Iterator[None]:
    try:
        yield
    except httpx.HTTPStatusError as e:
        raise GatewayError(operation, e.response.text[:200], e.response.status_code) from e
    except (httpx.HTTPError, ValueError) as e:
        raise GatewayError(operation, f"{type(e).__name__}: {e}") from e


class HttpGateway:
    """`/v1/agents/{node}/…` with the node's bearer token. Raises GatewayError on any failure."""

    def __init__(self, base_url: str, node: str, token: str, *, timeout: float = 10.0) -> None:
        self._prefix = f"/v1/agents/{quote(node, safe='')}"
        self._timeout = timeout
        headers = {"Authorization": f"Bearer {token}"}
        # One client per caller thread: the long poll must not hold up heartbeats or reports.
        self._poll = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self._push = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self._beat = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def heartbeat(self, body: dict[str, Any]) -> None:
        with _mapped("heartbeat"):
            self._beat.post(f"{self._prefix}/heartbeat", json=body).raise_for_status()

    def fetch_commands(self, wait: float) -> list[Any]:
        """Envelopes as sent; their shape is verify_command's business, so nothing is filtered here."""
        with _mapped("fetch commands"):
            response = self._poll.get(
                f"{self._prefix}/commands",
                params={"wait": wait},
                timeout=httpx.Timeout(self._timeout, read=wait + self._timeout),
            )
            response.raise_for_status()
            body = response.json()
        commands = body.get("commands") if isinstance(body, dict) else None
        if not isinstance(commands, list):
            raise GatewayError("fetch commands", "response lacks a 'commands' list")
        return commands

    def post_reports(self, reports: list[dict[str, Any]]) -> None:
        with _mapped("post reports"):
            self._push.post(f"{self._prefix}/reports", json={"reports": reports}).raise_for_status()

    def close(self) -> None:
        for client in (self._poll, self._push, self._beat):
            client.close()
