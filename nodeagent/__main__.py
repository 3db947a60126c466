"""`jobgate-agent`: command-line entry of the node agent; the only place that decides exit codes."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click
import nacl.signing

from nodeagent.agent import Agent, AgentConfig
from nodeagent.errors import AgentError, ConfigError
from nodeagent.transport import HttpGateway

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonLines(logging.Formatter):
    """One JSON object per line on stderr, so log shippers need no parsing rules."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def load_verify_key(path: Path) -> nacl.signing.VerifyKey:
    """Raises ConfigError unless the file holds a base64-encoded 32-byte Ed25519 public key."""
    try:
        raw = base64.b64decode(path.read_text().strip(), validate=True)
        return nacl.signing.VerifyKey(raw)
    except (OSError, binascii.Error, ValueError, TypeError) as e:
        raise ConfigError(f"command key {path}: not a base64 Ed25519 public key ({e})") from e


def load_token(path: Path) -> str:
    """Raises ConfigError if the token file is unreadable or empty."""
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"token file {path}: {e}") from e
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token


@click.command()
@click.option("--node", required=True, help="This node's name, as the gateway addresses it.")
@click.option("--gpus", type=click.IntRange(min=0), required=True, help="Number of GPUs on this node.")
@click.option("--gateway", "gateway_url", required=True, help="Gateway base URL.")
@click.option("--token-file", type=click.Path(path_type=Path), required=True, help="Node bearer token.")
@click.option(
    "--command-key", type=click.Path(path_type=Path), required=True, help="Gateway public command key."
)
@click.option("--work-dir", type=click.Path(path_type=Path), required=True, help="Jobs and agent state.")
@click.option("--poll-wait", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Seconds one long poll for commands may wait.")
@click.option("--heartbeat-interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between heartbeats.")
def cli(
    node: str,
    gpus: int,
    gateway_url: str,
    token_file: Path,
    command_key: Path,
    work_dir: Path,
    poll_wait: float,
    heartbeat_interval: float,
) -> None:
    """Run jobs on this node as the gateway's signed commands say. Serves no network endpoint."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # httpx logs every request at INFO; a long-polling agent would drown its own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        key = load_verify_key(command_key)
        token = load_token(token_file)
        config = AgentConfig(
            node=node,
            gpus=gpus,
            work_dir=work_dir.resolve(),
            poll_wait=poll_wait,
            heartbeat_interval=heartbeat_interval,
        )
        gateway = HttpGateway(gateway_url, node, token)
        agent = Agent(config, gateway, key)
    except AgentError as e:
        logging.getLogger("nodeagent").error("cannot start", extra={"fields": {"error": e.diagnostics()}})
        raise SystemExit(2) from e

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        agent.shutdown.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    agent.run()
    logging.getLogger("nodeagent").info(
        "agent exited", extra={"fields": {"uptime_s": round(time.monotonic() - started, 1)}}
    )


def main() -> None:
    cli(prog_name="jobgate-agent")


if __name__ == "__main__":
    main()
