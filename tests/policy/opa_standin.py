"""A STAND-IN for an OPA server, for tests only: it is not OPA.

No OPA binary can be installed on this machine (no Debian package, no PyPI wheel, no downloads), so the
OPA engine path (gateway.policy.opa.OpaEngine via opa-python-client) is tested against this small HTTP
server, which speaks the part of OPA's documented REST API the gateway uses and evaluates with regopy:

- PUT /v1/policies/{id} (text body) → 200 {} or 400 {"code": "invalid_parameter", "errors": [...]}
- GET /v1/policies → {"result": [{"id", "raw"}]};  DELETE /v1/policies/{id} → 200 {}
- PUT /v1/data/{path} (JSON body) → 204;  GET /v1/data/{path} → {"result": ...}
- POST /v1/data/{path} with {"input": ...} → {"result": value}, or {} when the rule is undefined
- GET /health → 200 {}

Like OPA it compiles all modules on every policy PUT and refuses a module that does not compile.
Run it as a real server: `python tests/policy/opa_standin.py --port 8181` (prints `listening on URL`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from regopy import Bundle, Input, Interpreter, LogLevel, RegoError


class OpaStandIn:
    """The server's state: modules, data, and compiled bundles per queried path."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._compiled: dict[str, tuple[Interpreter, Bundle]] = {}

    def _build(self, modules: dict[str, str], entrypoints: list[str]) -> tuple[Interpreter, Bundle]:
        rego = Interpreter()
        rego.log_level = LogLevel.NONE
        for name, source in modules.items():
            rego.add_module(name, source)
        rego.add_data(self.data)
        return rego, rego.build(None, entrypoints)

    def put_policy(self, policy_id: str, source: str) -> str | None:
        """Store a module if the whole set still compiles; else return the compiler's message."""
        with self._lock:
            candidate = {**self.modules, policy_id: source}
            try:
                rego = Interpreter()
                rego.log_level = LogLevel.NONE
                for name, text in candidate.items():
                    rego.add_module(name, text)
                rego.query("x := 1")  # forces a compile of every module
            except RegoError as e:
                return str(e)
            self.modules = candidate
            self._compiled.clear()
            return None

    def delete_policy(self, policy_id: str) -> bool:
        with self._lock:
            found = self.modules.pop(policy_id, None) is not None
            self._compiled.clear()
            return found

    def put_data(self, path: list[str], value: Any) -> None:
        with self._lock:
            if not path:
                self.data = value if isinstance(value, dict) else {}
            else:
                node = self.data
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = value
            self._compiled.clear()

    def query(self, path: list[str], doc: Any) -> tuple[bool, Any]:
        """(defined, value) of data.<path> for input doc. Raises RegoError or ValueError."""
        entrypoint = "/".join(path)
        with self._lock:
            if entrypoint not in self._compiled:
                self._compiled[entrypoint] = self._build(self.modules, [entrypoint])
            rego, bundle = self._compiled[entrypoint]
            rego.set_input(Input(doc))
            output = rego.query_bundle_entrypoint(bundle, entrypoint)
            if not output.ok():
                raise ValueError(str(output))
            if not output.results or not output.results[0].expressions:
                return False, None
            return True, output.results[0].expressions[0]


def make_handler(state: OpaStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: Any | None) -> None:
            raw = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _path(self, prefix: str) -> list[str] | None:
            path = self.path.split("?", 1)[0]
            if path.rstrip("/") == prefix.rstrip("/"):
                return []
            if not path.startswith(prefix):
                return None
            return [p for p in path[len(prefix):].split("/") if p]

        def do_GET(self) -> None:
            if self.path.startswith("/health"):
                self._send(200, {})
            elif self._path("/v1/policies/") is not None:
                self._send(200, {"result": [{"id": k, "raw": v} for k, v in sorted(state.modules.items())]})
            elif (path := self._path("/v1/data/")) is not None:
                node: Any = state.data
                for key in path:
                    node = node.get(key) if isinstance(node, dict) else None
                self._send(200, {} if node is None else {"result": node})
            else:
                self._send(404, {"code": "resource_not_found", "message": self.path})

        def do_PUT(self) -> None:
            if (path := self._path("/v1/policies/")) is not None and path:
                error = state.put_policy("/".join(path), self._body().decode("utf-8"))
                if error is None:
                    self._send(200, {})
                else:
                    self._send(400, {"code": "invalid_parameter",
                                     "message": "error(s) occurred while compiling module(s)",
                                     "errors": [{"code": "rego_compile_error", "message": error}]})
            elif (path := self._path("/v1/data/")) is not None:
                try:
                    value = json.loads(self._body() or b"null")
                except ValueError as e:
                    self._send(400, {"code": "invalid_parameter", "message": str(e)})
                    return
                state.put_data(path, value)
                self._send(204, None)
            else:
                self._send(404, {"code": "resource_not_found", "message": self.path})

        def do_DELETE(self) -> None:
            path = self._path("/v1/policies/")
            if path and state.delete_policy("/".join(path)):
                self._send(200, {})
            else:
                self._send(404, {"code": "resource_not_found", "message": self.path})

        def do_POST(self) -> None:
            path = self._path("/v1/data/")
            if path is None:
                self._send(404, {"code": "resource_not_found", "message": self.path})
                return
            try:
                request = json.loads(self._body() or b"{}")
                defined, value = state.query(path, request.get("input"))
            except (ValueError, RegoError, AttributeError) as e:
                self._send(500, {"code": "internal_error", "message": str(e)})
                return
            self._send(200, {"result": value} if defined else {})

    return Handler


def serve(host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A started server (in a daemon thread); `server.server_address` tells the port."""
    server = ThreadingHTTPServer((host, port), make_handler(OpaStandIn()))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description="OPA REST API stand-in evaluating with regopy (tests only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8181)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(OpaStandIn()))
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()


class StandInProcess:
    """The stand-in as a real subprocess (tests start it, read its URL, and stop it to test fail-closed)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        import subprocess
        import time

        self.proc = subprocess.Popen([sys.executable, __file__, "--port", "0"], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on ") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"OPA stand-in did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
