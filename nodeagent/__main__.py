"""`jobgate-agent`: command-line entry of the node agent; the only place that decides exit codes."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import click
import nacl.signing

from nodeagent import isolation
from nodeagent.agent import Agent, AgentConfig
from nodeagent.errors import AgentError, ConfigError
from nodeagent.identity import DEFAULT_JOB_UIDS, Identities, load_accounts, parse_uid_range
from nodeagent.isolation import Isolation
from nodeagent.layout import private_state_dir
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


def check_gateway_url(url: str, *, plain_http_ok: bool) -> None:
    """Raises ConfigError for a URL that is not http(s), or plain http to a host other than this one: the node
    token is a bearer secret and would cross the network in clear."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"gateway URL {url!r} must be https://HOST[:PORT] (or http:// to this host)")
    if parts.scheme == "http" and not plain_http_ok and not _is_loopback(parts.hostname):
        raise ConfigError(f"gateway URL {url!r} is plain http to another host: the node token would cross the "
                          "network in clear. Use https://, or --insecure-plain-http on a network you trust")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_isolation(node: str, work_dir: Path, *, unsafe_shared_uid: bool, job_uids: str,
                     accounts: Path | None, cgroup_base: Path | None) -> Isolation | None:
    """The isolation this agent gives its jobs, or None (isolation: none) only when asked for by name.
    Raises ConfigError saying why none can be had and how to go on."""
    if unsafe_shared_uid:
        return None
    identities = Identities(parse_uid_range(job_uids), load_accounts(accounts) if accounts else None)
    try:
        return isolation.detect(node, work_dir / "jobs", identities, cgroup_base)
    except ConfigError as e:
        raise ConfigError(f"cannot isolate jobs: {e.detail}. To run jobs as the agent's own user anyway (a laptop"
                          " demo: any job could then read the node's token), pass --unsafe-jobs-share-agent-uid"
                          ) from e


@click.command()
@click.option("--node", required=True, help="This node's name, as the gateway addresses it.")
@click.option("--gpus", type=click.IntRange(min=0), required=True, help="Number of GPUs on this node.")
@click.option("--gateway", "gateway_url", required=True,
              help="Gateway base URL: https://, or http:// to this host (see --insecure-plain-http).")
@click.option(
    "--command-key", type=click.Path(path_type=Path), required=True, help="Gateway public command key."
)
@click.option("--work-dir", type=click.Path(path_type=Path), required=True, envvar="JOBGATE_AGENT_WORK_DIR",
              help="Jobs (jobs/) and the agent's private state (state/, 0700: the node token is state/token). "
                   "Prefer the environment variable JOBGATE_AGENT_WORK_DIR: every process can read a command line.")
@click.option("--job-uids", default=f"{DEFAULT_JOB_UIDS.start}-{DEFAULT_JOB_UIDS.stop - 1}", show_default=True,
              envvar="JOBGATE_AGENT_JOB_UIDS", help="Range of uids allocated to jobs, one per run (FIRST-LAST).")
@click.option("--accounts", type=click.Path(path_type=Path), envvar="JOBGATE_AGENT_ACCOUNTS",
              help="JSON object mapping person ids to Unix accounts: their jobs run as those accounts.")
@click.option("--cgroup-base", type=click.Path(path_type=Path), envvar="JOBGATE_AGENT_CGROUP_BASE",
              help="cgroup v2 directory under which the agent makes one cgroup per job [default: its own cgroup].")
@click.option("--unsafe-jobs-share-agent-uid", "unsafe_shared_uid", is_flag=True,
              envvar="JOBGATE_AGENT_UNSAFE_JOBS_SHARE_AGENT_UID",
              help="Run jobs as the agent's own user (isolation: none). Any job can then read the node's token and "
                   "act as the node. Only for a single-user laptop demo.")
@click.option("--insecure-plain-http", is_flag=True, envvar="JOBGATE_AGENT_INSECURE_PLAIN_HTTP",
              help="Allow a plain http:// gateway URL to another host (the node token then crosses in clear).")
@click.option("--poll-wait", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Seconds one long poll for commands may wait.")
@click.option("--heartbeat-interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between heartbeats.")
def cli(
    node: str,
    gpus: int,
    gateway_url: str,
    command_key: Path,
    work_dir: Path,
    job_uids: str,
    accounts: Path | None,
    cgroup_base: Path | None,
    unsafe_shared_uid: bool,
    insecure_plain_http: bool,
    poll_wait: float,
    heartbeat_interval: float,
) -> None:
    """Run jobs on this node as the gateway's signed commands say, each job under an identity and in a cgroup of
    its own. Serves no network endpoint."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # httpx logs every request at INFO; a long-polling agent would drown its own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    log = logging.getLogger("nodeagent")
    try:
        check_gateway_url(gateway_url, plain_http_ok=insecure_plain_http)
        key = load_verify_key(command_key)
        work_dir = work_dir.resolve()
        chosen = choose_isolation(node, work_dir, unsafe_shared_uid=unsafe_shared_uid, job_uids=job_uids,
                                  accounts=accounts, cgroup_base=cgroup_base)
        config = AgentConfig(
            node=node,
            gpus=gpus,
            work_dir=work_dir,
            poll_wait=poll_wait,
            heartbeat_interval=heartbeat_interval,
        )
        agent = Agent(config, HttpGateway(gateway_url, node, load_token(private_state_dir(work_dir) / "token")),
                      key, isolation=chosen)
    except AgentError as e:
        log.error("cannot start", extra={"fields": {"error": e.diagnostics()}})
        raise SystemExit(2) from e
    except OSError as e:
        log.error("cannot start", extra={"fields": {"error": f"work dir {work_dir}: {e.strerror or e}"}})
        raise SystemExit(2) from e
    if chosen is None:
        log.warning("isolation: none — jobs run as the agent's own user and could read its token and act as "
                    "this node (--unsafe-jobs-share-agent-uid)", extra={"fields": {"isolation": "none"}})
    else:
        log.info(f"isolation: {chosen.mode}", extra={"fields": {"isolation": chosen.mode}})

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        agent.shutdown.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    agent.run()
    log.info("agent exited", extra={"fields": {"uptime_s": round(time.monotonic() - started, 1)}})


def main() -> None:
    cli(prog_name="jobgate-agent")


if __name__ == "__main__":
    main()
