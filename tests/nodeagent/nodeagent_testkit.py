"""Helpers for node-agent tests: job scripts, an event log, signed commands, a fake gateway."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import nacl.signing

from nodeagent import protocol
from nodeagent.runner import RunnerEvent

TOKEN = "node-token-for-tests"


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def py(code: str) -> list[str]:
    """argv running `code` in this interpreter."""
    return [sys.executable, "-c", code]


class EventLog:
    """A Runner sink that remembers events and lets tests wait for them."""

    def __init__(self) -> None:
        self.events: list[RunnerEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: RunnerEvent) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, job_id: str, kind: str | None = None) -> list[RunnerEvent]:
        with self._lock:
            return [e for e in self.events if e.job_id == job_id and (kind is None or e.event == kind)]

    def wait(self, job_id: str, kind: str, timeout: float = 10.0) -> RunnerEvent:
        found = wait_until(lambda: self.of(job_id, kind), timeout, f"{kind} event of {job_id}")
        return found[0]  # type: ignore[no-any-return]


def wait_for_log(job_dir: Path, text: str, timeout: float = 10.0) -> None:
    """Jobs print a marker once their signal handlers are installed; stop only after that."""
    log = job_dir / "output.log"
    wait_until(lambda: log.exists() and text in log.read_text(), timeout, f"{text!r} in {log}")


# -- signed commands --------------------------------------------------------------------------------


def command(
    key: nacl.signing.SigningKey,
    kind: str,
    job_id: str,
    *,
    node: str = "node-a",
    ttl: float = 60.0,
    nonce: str | None = None,
    **params: Any,
) -> dict[str, str]:
    now = time.time()
    cmd = protocol.Command(
        kind=kind,
        node=node,
        job_id=job_id,
        nonce=nonce or protocol.new_nonce(),
        issued_at=now,
        expires_at=now + ttl,
        params=params,
    )
    return protocol.sign_command(cmd, key)


def nonce_of(envelope: dict[str, str]) -> str:
    return str(json.loads(envelope["payload"])["nonce"])


# -- fake gateway ---------------------------------------------------------------------------------


class FakeGateway:
    """The three agent endpoints, in a thread on 127.0.0.1, recording what the agent sends."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.pending: dict[str, list[Any]] = {}
        self.refuse_reports = False
        self.refuse_job: str | None = None  # a batch with a report about this job gets 422, like bad input
        self.refused_batches = 0
        self.unauthorized = 0
        self._cond = threading.Condition()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[str, str] | None:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    gateway.unauthorized += 1
                    self._reply(401, {"detail": "bad token"})
                    return None
                parts = urlparse(self.path).path.strip("/").split("/")
                if len(parts) != 4 or parts[:2] != ["v1", "agents"]:
                    self._reply(404, {"detail": "no such route"})
                    return None
                return parts[2], parts[3]

            def do_GET(self) -> None:
                route = self._route()
                if route is None:
                    return
                node, what = route
                if what != "commands":
                    self._reply(404, {})
                    return
                wait = float(parse_qs(urlparse(self.path).query).get("wait", ["0"])[0])
                with gateway._cond:
                    gateway._cond.wait_for(lambda: gateway.pending.get(node), timeout=wait)
                    commands = gateway.pending.pop(node, [])
                try:
                    self._reply(200, {"commands": commands})
                except OSError:
                    # The agent went away mid-poll (e.g. restarted): keep its commands for the next poll.
                    with gateway._cond:
                        gateway.pending[node] = commands + gateway.pending.get(node, [])

            def do_POST(self) -> None:
                route = self._route()
                if route is None:
                    return
                _node, what = route
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if what == "heartbeat":
                    with gateway._cond:
                        gateway.heartbeats.append(body)
                    self._reply(200, {"ok": True})
                elif what == "reports":
                    if gateway.refuse_reports:
                        self._reply(503, {"detail": "down for the test"})
                        return
                    if any(r["job_id"] == gateway.refuse_job for r in body["reports"]):
                        gateway.refused_batches += 1
                        self._reply(422, {"detail": f"reports about {gateway.refuse_job} are refused"})
                        return
                    with gateway._cond:
                        gateway.reports.extend(body["reports"])
                    self._reply(200, {"ok": True})
                else:
                    self._reply(404, {})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def push(self, envelope: Any, node: str = "node-a") -> None:
        with self._cond:
            self.pending.setdefault(node, []).append(envelope)
            self._cond.notify_all()

    def find(self, job_id: str, event: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r for r in self.reports if r["job_id"] == job_id and r["event"] == event]

    def wait_report(self, job_id: str, event: str, timeout: float = 15.0) -> dict[str, Any]:
        found = wait_until(lambda: self.find(job_id, event), timeout, f"{event} report for {job_id}")
        return found[0]  # type: ignore[no-any-return]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class AgentProcess:
    """`python -m nodeagent` as a real subprocess against the fake gateway."""

    def __init__(self, tmp_path: Path, gateway_url: str, key: nacl.signing.SigningKey) -> None:
        self.work_dir = tmp_path / "agent"
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.key_file = tmp_path / "command.key"
        self.key_file.write_text(base64.b64encode(bytes(key.verify_key)).decode() + "\n")
        self.gateway_url = gateway_url
        self.stderr_path = tmp_path / "agent-stderr.log"
        self.proc: Any = None

    def start(self) -> None:
        import subprocess

        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "nodeagent",
                    "--node",
                    "node-a",
                    "--gpus",
                    "8",
                    "--gateway",
                    self.gateway_url,
                    "--token-file",
                    str(self.token_file),
                    "--command-key",
                    str(self.key_file),
                    "--work-dir",
                    str(self.work_dir),
                    "--poll-wait",
                    "1",
                    "--heartbeat-interval",
                    "0.2",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=Path(__file__).resolve().parents[2],
            )

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM the agent and return its exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = int(self.proc.wait(timeout))
        self.proc = None
        return code

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def kill_leftover_jobs(self) -> None:
        path = self.work_dir / "processes.json"
        if path.exists():
            for record in json.loads(path.read_text()).values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(record["pgid"]), signal.SIGKILL)
