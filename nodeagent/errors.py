"""Exceptions of the node agent: one root, fields rather than strings."""

from __future__ import annotations

from dataclasses import dataclass


class AgentError(Exception):
    """Root of every error the node agent raises on purpose."""

    def diagnostics(self) -> str:
        return str(self)


@dataclass
class InvalidCommand(AgentError):
    """A verified command whose parameters the agent cannot act on (bad job id, argv, GPUs, signal)."""

    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass
class ConfigError(AgentError):
    """The agent was started with an unusable key, token or work directory."""

    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass
class GatewayError(AgentError):
    """The gateway could not be reached or answered with something other than success."""

    operation: str
    detail: str
    status: int | None = None

    def __str__(self) -> str:
        code = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.operation} failed{code}: {self.detail}"
