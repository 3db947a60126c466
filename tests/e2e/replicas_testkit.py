"""Replicas of one gateway as real processes: `jobgate up --port P --data-dir D` on one PostgreSQL business
database and one PostgreSQL ledger, the demo's node agents beside them. Used by tests/e2e/test_replicas.py and
bench/replicas.py --failover."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from e2e_testkit import free_port, kill_workloads, wait_for

JOBGATE = [sys.executable, "-m", "gateway.cli"]


@dataclass
class Replica:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    token: str | None = None  # a valid one: /readyz then names the replicas and why a check failed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def readiness(self) -> tuple[int, dict[str, Any]] | None:
        """(status, body) of /readyz; None while it does not answer."""
        if self.proc.poll() is not None:
            return None
        try:
            r = httpx.get(self.url + "/readyz", timeout=2,
                          headers={"Authorization": f"Bearer {self.token}"} if self.token else None)
        except httpx.HTTPError:
            return None
        return r.status_code, r.json()

    def leads(self) -> bool:
        got = self.readiness()
        return got is not None and (got[1].get("replicas") or {}).get("role") == "leader"


@dataclass
class Replicas:
    data_dir: Path
    database_url: str
    ledger_url: str
    replicas: list[Replica] = field(default_factory=list)
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": self.database_url,
                "JOBGATE_LEDGER_URL": self.ledger_url}

    def start(self, *, demo: bool, wait_ready: bool = True) -> Replica:
        port = free_port()
        log = self.data_dir.parent / f"replica-{port}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([*JOBGATE, "up", *(["--demo"] if demo else []), "--port", str(port),
                                     "--data-dir", str(self.data_dir)], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env)
        replica = Replica(port, proc, log, self.tokens.get("alice"))
        self.replicas.append(replica)
        if wait_ready:
            self.wait_ready(replica)
        return replica

    def wait_ready(self, replica: Replica, timeout: float = 120) -> None:
        def ready() -> bool:
            if replica.proc.poll() is not None:
                raise AssertionError(f"replica on {replica.port} exited early:\n{replica.output()}")
            got = replica.readiness()
            return got is not None and got[0] == 200

        wait_for(ready, timeout, f"replica {replica.port} to be ready", interval=0.1)
        if not self.tokens and (self.data_dir / "demo-tokens.json").exists():
            self.tokens = json.loads((self.data_dir / "demo-tokens.json").read_text())
        for started in self.replicas:
            started.token = started.token or self.tokens.get("alice")

    def start_agents(self, url: str) -> None:
        """The demo's two node agents, on `url` (a replica that is to survive the test)."""
        from gateway.cli.up import _start_agents, demo_isolation

        self.agents += _start_agents(self.data_dir, url, isolate=demo_isolation(self.data_dir) is None)

    def client(self, replica: Replica, who: str) -> httpx.Client:
        return httpx.Client(base_url=replica.url, headers={"Authorization": f"Bearer {self.tokens[who]}"},
                            timeout=30)

    def wait_nodes_alive(self, replica: Replica, timeout: float = 60) -> None:
        with self.client(replica, "alice") as c:
            wait_for(lambda: all(n["state"] == "alive" for n in c.get("/v1/nodes").json()["nodes"]), timeout,
                     "the demo's node agents to report in")

    def kill9(self, replica: Replica) -> float:
        """kill -9; returns when it was sent (time.time(), the clock the replicas' timestamps use)."""
        at = time.time()
        replica.proc.send_signal(signal.SIGKILL)
        replica.proc.wait()
        return at

    def stop(self) -> None:
        for p in self.agents:
            p.terminate()
        for r in self.replicas:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGINT)
        for p in [*self.agents, *(r.proc for r in self.replicas)]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        kill_workloads(self.data_dir)


def seed_demo_without_agents(data_dir: Path, database_url: str, ledger_url: str) -> None:
    """What `jobgate up --demo` seeds, without starting its agents (a test starts them on the replica it wants)."""
    from gateway.demo import prepare_demo
    from gateway.native.command_key import load_or_create_command_key
    from gateway.settings import Settings

    settings = Settings(data_dir=data_dir, database_url=database_url, ledger_url=ledger_url)
    data_dir.mkdir(parents=True, exist_ok=True)
    load_or_create_command_key(settings.keys_dir)
    prepare_demo(settings)


def when(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def failover(replicas: Replicas, leader: Replica, survivor: Replica, timeout: float = 30) -> dict[str, float]:
    """kill -9 the leader; wait until the survivor leads and has run its first scheduler cycle. Seconds from the
    kill to the survivor's election and to its first cycle (the replicas' own timestamps)."""
    old_epoch = (survivor.readiness() or (0, {}))[1]["replicas"]["leader"]["epoch"]
    killed_at = replicas.kill9(leader)

    def cycled() -> dict[str, Any] | None:
        got = survivor.readiness()
        status = (got[1].get("replicas") or {}) if got else {}
        if status.get("role") == "leader" and status.get("epoch", 0) > old_epoch and status.get("first_cycle_at"):
            return status
        return None

    status = wait_for(cycled, timeout, "the survivor to lead and run a cycle", interval=0.02)
    return {"elected_s": when(status["leader"]["elected_at"]) - killed_at,
            "first_cycle_s": when(status["first_cycle_at"]) - killed_at, "epoch": status["epoch"]}
