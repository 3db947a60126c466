"""Runs `jobgate up --demo` as a real subprocess on a free port in a temporary data dir."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_host import searchable_by_jobs

JOBGATE = [sys.executable, "-m", "gateway.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class System:
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str]
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, who: str) -> httpx.Client:
        c = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}, timeout=30)
        self.clients.append(c)
        return c

    def cli(self, who: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "JOBGATE_URL": self.url, "JOBGATE_TOKEN": self.tokens[who]}
        result = subprocess.run([*JOBGATE, *args], env=env, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"jobgate {' '.join(args)} failed: {result.stdout}{result.stderr}")
        return result

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        kill_workloads(self.data_dir)


def kill_workloads(data_dir: Path) -> None:
    """Kill what the test's jobs still run. Workloads outlive their node agent on purpose (an agent that
    restarts must not take training runs down with it), but a test's must not outlive the test. Each
    carries its checkpoint directory, under the data dir, in its environment."""
    marker = b"JOBGATE_CHECKPOINT_DIR=" + str(data_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue


@pytest.fixture
def demo_system(tmp_path: Path) -> Iterator[System]:
    port = free_port()
    data_dir = tmp_path / "var"
    searchable_by_jobs(tmp_path)  # the demo's agents run each job under a uid of its own (as root, in CI)
    log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*JOBGATE, "up", "--demo", "--port", str(port), "--data-dir", str(data_dir)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError("gateway exited early:\n" + (tmp_path / "gateway.log").read_text())
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    system = None
    try:
        wait_for(healthy, 60, "the gateway's /healthz")
        tokens = json.loads((data_dir / "demo-tokens.json").read_text())
        system = System(url, data_dir, proc, tokens)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens['alice']}"}) as c:
            wait_for(lambda: all(n["state"] == "alive" for n in c.get("/v1/nodes").json()["nodes"]), 30,
                     "both demo node agents to report in")
        yield system
    finally:
        if system:
            system.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
