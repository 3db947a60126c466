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
from job_host import JOB_PYTHON, searchable_by_jobs

from nodeagent import cgroups, protocol
from nodeagent.layout import private_state_dir
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
    """argv running `code` in the node's own interpreter (a job under a uid of its own can run that one)."""
    return [JOB_PYTHON, "-c", code]


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
    issued_in: float = 0.0,
    **params: Any,
) -> dict[str, str]:
    """A command signed with `key`, issued `issued_in` seconds from now (a clock ahead), valid `ttl` seconds."""
    now = time.time() + issued_in
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

    def __init__(self, key: nacl.signing.SigningKey | None = None) -> None:
        # With the command key it answers a new agent instance's first heartbeat with a reconcile, as the real
        # gateway does: an agent obeys no start before it.
        self.key = key
        self.instances: set[str] = set()
        # Nonces pushed that no report has answered yet: what the real gateway lists as in flight.
        self.inflight: dict[str, str] = {}
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
                    gateway._reconcile_new(_node, body)
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
                        for r in body["reports"]:
                            gateway.inflight.pop(str(r.get("nonce")), None)
                    self._reply(200, {"ok": True})
                else:
                    self._reply(404, {})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _reconcile_new(self, node: str, beat: dict[str, Any]) -> None:
        instance = str(beat.get("instance", ""))
        if self.key is None or instance in self.instances:
            return
        self.instances.add(instance)
        with self._cond:
            pending = sorted(n for n, to in self.inflight.items() if to == node)
        running = [str(r["job_id"]) for r in beat.get("running", [])]
        self.push(command(self.key, "reconcile", "", node=node, expected=running, stop=[], pending=pending), node)

    def push(self, envelope: Any, node: str = "node-a") -> None:
        with self._cond:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.inflight[nonce_of(envelope)] = node
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
        searchable_by_jobs(tmp_path)
        (private_state_dir(self.work_dir) / "token").write_text(TOKEN + "\n")
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
                    "--command-key",
                    str(self.key_file),
                    "--poll-wait",
                    "1",
                    "--heartbeat-interval",
                    "0.2",
                    # Not root (a developer's laptop): jobs can only run as the test's own user.
                    *([] if os.geteuid() == 0 else ["--unsafe-jobs-share-agent-uid"]),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                # As a deployment should: a command line is readable by every process on the node.
                env={**os.environ, "JOBGATE_AGENT_WORK_DIR": str(self.work_dir)},
                cwd=Path(__file__).resolve().parents[2],
            )

    def wait_reconciled(self, timeout: float = 10.0) -> None:
        """Until the agent obeyed the reconcile its gateway sends a new instance (it obeys no start before)."""
        wait_until(lambda: '"kind": "reconcile"' in self.stderr(), timeout, "the agent to be reconciled")

    @staticmethod
    def expected_isolation() -> str:
        """What a root agent on this host gives its jobs: cgroup v2 where the host has it."""
        return "uid+cgroup" if cgroups.cgroup2_mount() is not None else "uid"

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
        path = self.work_dir / "state" / "processes.json"
        if path.exists():
            for record in json.loads(path.read_text()).values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(record["pgid"]), signal.SIGKILL)
