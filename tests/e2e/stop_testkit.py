"""A real gateway (uvicorn on a free port, in this process) with N real node-agent subprocesses.

Used by the stop tests and by bench/stop.py. The gateway runs in-process so a test can read its state
(`cluster.gateway`) and tune module constants; the agents are separate processes that can be SIGKILLed
and restarted like on a real node.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from job_host import searchable_by_jobs

from gateway.app import create_app
from gateway.demo import seed_demo, write_secret_text
from gateway.identity.tokens import issue_token
from gateway.native.command_key import load_or_create_command_key
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Node, Principal
from gateway.store.schema import create_schema
from nodeagent.layout import private_state_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Cluster:
    url: str
    data_dir: Path
    settings: Settings
    tokens: dict[str, str]
    nodes: list[str]
    gpus: int
    server: uvicorn.Server
    thread: threading.Thread
    app: Any
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def client(self, who: str) -> httpx.Client:
        c = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}, timeout=60)
        self.clients.append(c)
        return c

    def work_dir(self, node: str) -> Path:
        return self.data_dir / "agents" / node

    def start_agent(self, node: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A real agent process; as root (CI) each of its jobs runs under a uid and in a cgroup of its own."""
        work = self.work_dir(node)
        log = open(private_state_dir(work) / "agent.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "--node", node, "--gpus", str(self.gpus), "--gateway", self.url,
             "--command-key", str(self.data_dir / "keys" / "command.pub"), "--poll-wait", "10",
             "--heartbeat-interval", "0.5", *([] if os.geteuid() == 0 else ["--unsafe-jobs-share-agent-uid"]),
             *extra],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "JOBGATE_AGENT_WORK_DIR": str(work), **(env or {})},
        )
        log.close()
        self.agents[node] = proc
        return proc

    def kill_agent(self, node: str) -> None:
        """SIGKILL the agent only: its jobs (own sessions) keep running, as after an agent crash."""
        proc = self.agents.pop(node)
        proc.kill()
        proc.wait()

    def nodes_state(self) -> dict[str, str]:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens['dave']}"}) as c:
            return {n["id"]: n["state"] for n in c.get("/v1/nodes").json()["nodes"]}

    def job(self, job_id: str, who: str = "dave") -> dict[str, Any]:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}) as c:
            r = c.get(f"/v1/jobs/{job_id}")
            assert r.status_code == 200, r.text
            return dict(r.json())

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 30) -> dict[str, Any]:
        return dict(wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                             f"job {job_id} to reach {states}"))

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for proc in self.agents.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.agents.clear()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        kill_leftover_jobs(self.data_dir)


def kill_leftover_jobs(data_dir: Path) -> None:
    """Jobs outlive their agents by design; a test must not leave them behind."""
    for records in data_dir.glob("agents/*/state/processes.json"):
        try:
            data = json.loads(records.read_text())
        except (OSError, ValueError):
            continue
        for rec in data.values() if isinstance(data, dict) else data:
            with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, TypeError, ValueError):
                os.killpg(int(rec["pgid"]), signal.SIGKILL)
            with contextlib.suppress(OSError, KeyError, TypeError):
                if rec.get("cgroup"):
                    Path(rec["cgroup"], "cgroup.kill").write_text("1")


def start_cluster(data_dir: Path, nodes: int, gpus: int = 16, *, prefix: str = "sn",
                  settings_overrides: dict[str, Any] | None = None, start_agents: bool = True,
                  agent_args: tuple[str, ...] = ()) -> Cluster:
    data_dir.mkdir(parents=True, exist_ok=True)
    searchable_by_jobs(data_dir)  # its agents run each job under a uid of its own (as root, in CI)
    port = free_port()
    values: dict[str, Any] = {"node_heartbeat_timeout_s": 3.0, "scheduler_interval_s": 0.2,
                              **(settings_overrides or {})}
    settings = Settings(data_dir=data_dir, port=port, **values)
    load_or_create_command_key(settings.keys_dir)
    db = Database(settings.resolved_database_url())
    create_schema(db.engine)
    names = [f"{prefix}-{i + 1}" for i in range(nodes)]
    with db.transaction() as session:
        seed_demo(session, data_dir)
        from gateway.context import utcnow

        now = utcnow()
        for node in names:
            session.add(Principal(id=node, kind="node", display_name=f"agent of {node}", created_at=now))
            session.add(Node(id=node, gpus=gpus, state="registered", last_heartbeat=None, running=[]))
            session.flush()
            secret = issue_token(session, node, purpose="node agent", now=now, lifetime=timedelta(days=1),
                                 actions=["agent"]).secret
            write_secret_text(private_state_dir(data_dir / "agents" / node) / "token", secret)
        # Only this cluster's agents: the demo nodes would count as lost capacity.
        for demo in ("demo-node-1", "demo-node-2"):
            row = session.get(Node, demo)
            if row is not None:
                row.gpus = 0
    db.close()
    tokens = json.loads((data_dir / "demo-tokens.json").read_text())
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, name="gateway-under-test", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: server.started, 30, "the gateway to start")
    cluster = Cluster(url, data_dir, settings, tokens, names, gpus, server, thread, app)
    if start_agents:
        for node in names:
            cluster.start_agent(node, *agent_args)
        wait_for(lambda: all(cluster.nodes_state().get(n) == "alive" for n in names), 30, "agents to report in")
    return cluster


def submit(client: httpx.Client, name: str, command: list[str], **extra: Any) -> str:
    spec = {"name": name, "project": "vision", "gpus_per_node": 1, "nodes": 1, "command": command, **extra}
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])
