"""An OPA server for tests: OPA's own evaluator (v1.20.2, Go) behind the part of OPA's REST API the gateway uses.

The evaluator is OPA itself, compiled as a shared library (opa-golib-python-bindings, `make venv` installs it):
every module is compiled and every query evaluated by github.com/open-policy-agent/opa/v1/rego, so a decision
this server gives is OPA's. Only the HTTP front is Python, and it follows OPA's server (v1/server/server.go):

- PUT /v1/policies/{id} (text body): the module is parsed and compiled with every other one, and refused as a
  whole on any error: 400 {"code": "invalid_parameter", "message": ..., "errors": [{code, message, location}]};
  the same bytes again answer 200 without a compile, as OPA does.
- GET /v1/policies → {"result": [{"id", "raw"}]};  DELETE /v1/policies/{id} → 200 {}, 404 if unknown, 400 if the
  rest no longer compiles.
- PUT /v1/data/{path} (JSON body) → 204. Missing parents are made; a parent that is not an object is a write
  conflict (404 "resource_conflict"); data that conflicts with a rule's path is refused (400), all as OPA does.
  Only a write under a package's first name can conflict with a rule, so only such a write is compiled at once;
  any other is compiled with the next query or policy write (OPA's compile is tens of milliseconds, and the
  gateway writes each data.json key apart).
- POST /v1/data/{path} with {"input": ...} → {"result": value}, or {} when undefined; an evaluation error →
  500 {"code": "internal_error", "errors": [...]}.  GET /v1/data/{path} evaluates the same way without input.
- GET /health → 200 {}.

One difference, made explicit: the library always evaluates with strict builtin errors (a builtin called with
the wrong type, e.g. trim_space(null), fails the query instead of being undefined), which an OPA server does only
when asked with `?strict-builtin-errors=true`. The gateway asks for it, and this server refuses a query that does
not (400), rather than answer it in a mode it cannot evaluate.

Run it as a real server: `python tests/gateway/decisions/policy/opa_server.py --port 8181` (prints `listening on URL`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

COMPILE_MESSAGE = "error(s) occurred while compiling module(s)"
EVAL_MESSAGE = "error(s) occurred while evaluating query"
# "file:row: rego_code: message" or "file:row: eval_code: message", as the library reports OPA's errors.
_LOCATED = re.compile(r"(?P<file>[^\s:]+):(?P<row>\d+): (?P<code>(?:rego|eval)_\w+): (?P<message>[^\n]*)")
_PACKAGE_ROOT = re.compile(r"^package\s+(\w+)", re.MULTILINE)


class Refused(Exception):
    """An answer OPA would give instead of a result: status and ErrorV1 body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message"))
        self.status = status
        self.body = body


def error_body(code: str, message: str, detail: str = "") -> dict[str, Any]:
    """OPA's ErrorV1, with each located error the library reported in `errors`."""
    body: dict[str, Any] = {"code": code, "message": message}
    located = [{"code": m["code"], "message": m["message"],
                "location": {"file": m["file"], "row": int(m["row"])}} for m in _LOCATED.finditer(detail)]
    if located:
        body["errors"] = located
    elif detail:
        body["errors"] = [{"code": code, "message": detail}]
    return body


def library() -> Any:
    """opa_bindings, imported by the server process only: the tests that start it import this module to
    collect, and skip (tests/conftest.py opa_golib) where the library is missing."""
    import opa_bindings

    return opa_bindings


def compiled(modules: dict[str, str], data: dict[str, Any]) -> Any:
    """A library engine holding these modules and data, compiled. Raises Refused (400) with OPA's errors."""
    lib = library()
    engine = lib.OpaEngine()
    engine.print_handler = lambda message, location: None
    try:
        for policy_id, source in sorted(modules.items()):
            engine.add_policy(policy_id, source)
        if data:
            engine.add_data(data)
        engine.eval_query("x := 1")  # compiles every module against the data, as OPA does on every write
    except lib.OpaError as e:
        engine.close()
        raise Refused(400, error_body("invalid_parameter", COMPILE_MESSAGE, e.message)) from e
    return engine


def document_query(path: list[str]) -> str:
    """The query for data.<path>, each segment quoted (a path segment need not be a Rego identifier)."""
    return "x = data" + "".join(f"[{json.dumps(p)}]" for p in path)


class OpaState:
    """Modules and data as stored, and the engine compiled from them (replaced whole on every write)."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._engine: Any = compiled({}, {})
        self._stale = False  # data written since the engine was compiled (never data that could conflict)

    def _roots(self) -> set[str]:
        """The first name of every module's package: data there may collide with a rule, nowhere else."""
        return {m.group(1) for source in self.modules.values() if (m := _PACKAGE_ROOT.search(source))}

    def put_policy(self, policy_id: str, source: str) -> None:
        with self._lock:
            if self.modules.get(policy_id) == source:
                return
            modules = {**self.modules, policy_id: source}
            self._engine = compiled(modules, self.data)
            self.modules, self._stale = modules, False

    def delete_policy(self, policy_id: str) -> None:
        with self._lock:
            if policy_id not in self.modules:
                raise Refused(404, {"code": "resource_not_found", "message": f"storage_not_found_error: policy id "
                                    f"{policy_id!r}"})
            modules = {k: v for k, v in self.modules.items() if k != policy_id}
            try:
                engine = compiled(modules, self.data)
            except Refused as e:
                raise Refused(400, {**e.body, "code": "invalid_operation"}) from e
            self._engine, self.modules, self._stale = engine, modules, False

    def put_data(self, path: list[str], value: Any) -> None:
        with self._lock:
            if not path:
                if not isinstance(value, dict):
                    raise Refused(400, {"code": "invalid_parameter", "message": "the root document is an object"})
                data = copy.deepcopy(value)
            else:
                data = copy.deepcopy(self.data)
                node: Any = data
                for depth, key in enumerate(path[:-1]):
                    if key not in node:
                        node[key] = {}
                    node = node[key]
                    if not isinstance(node, dict):  # OPA's storage.MakeDir: a parent must be an object
                        where = "/" + "/".join(path[:depth + 1])
                        raise Refused(404, {"code": "resource_conflict",
                                            "message": f"storage_write_conflict_error: {where}"})
                node[path[-1]] = value
            if (set(data) if not path else {path[0]}) & self._roots():
                self._engine = compiled(self.modules, data)  # data beside a rule of the same path is refused
                self._stale = False
            else:
                self._stale = True
            self.data = data

    def query(self, path: list[str], doc: Any) -> tuple[bool, Any]:
        """(defined, value) of data.<path> for input doc. Raises Refused (500) on an evaluation error."""
        with self._lock:
            if self._stale:  # cannot fail on the data: only writes that could conflict were left uncompiled
                self._engine, self._stale = compiled(self.modules, self.data), False
            engine = self._engine  # a write replaces it whole; this query keeps the one it started with
        try:
            rows = engine.eval_query(document_query(path), doc)
        except library().OpaError as e:
            raise Refused(500, error_body("internal_error", EVAL_MESSAGE, e.message)) from e
        if not rows:
            return False, None
        return True, rows[0]["x"]


def make_handler(state: OpaState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in two writes: without TCP_NODELAY the body waits for the client's delayed
        # ACK of the headers, 40 ms a request on Linux.
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: Any | None) -> None:
            raw = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _path(self, prefix: str) -> list[str] | None:
            path = urlsplit(self.path).path
            if path.rstrip("/") == prefix.rstrip("/"):
                return []
            if not path.startswith(prefix):
                return None
            return [unquote(p) for p in path[len(prefix):].split("/") if p]

        def _strict(self) -> None:
            values = parse_qs(urlsplit(self.path).query, keep_blank_values=True).get("strict-builtin-errors", [])
            if not any(v.lower() in ("true", "") for v in values):
                raise Refused(400, {"code": "invalid_parameter", "message": (
                    "this test server evaluates with strict builtin errors only (the OPA library it embeds always"
                    " does): ask with ?strict-builtin-errors=true")})

        def _json(self, raw: bytes) -> Any:
            try:
                return json.loads(raw)
            except ValueError as e:
                raise Refused(400, {"code": "invalid_parameter", "message": str(e)}) from e

        def _answer(self, fn: Any) -> None:
            try:
                fn()
            except Refused as e:
                self._send(e.status, e.body)

        def do_GET(self) -> None:
            self._answer(self._get)

        def _get(self) -> None:
            if urlsplit(self.path).path.rstrip("/") == "/health":
                self._send(200, {})
            elif self._path("/v1/policies/") == []:
                self._send(200, {"result": [{"id": k, "raw": v} for k, v in sorted(state.modules.items())]})
            elif (path := self._path("/v1/data/")) is not None:
                self._strict()
                defined, value = state.query(path, None)
                self._send(200, {"result": value} if defined else {})
            else:
                self._send(404, {"code": "resource_not_found", "message": self.path})

        def do_PUT(self) -> None:
            self._answer(self._put)

        def _put(self) -> None:
            if (path := self._path("/v1/policies/")) is not None and path:
                state.put_policy("/".join(path), self._body().decode("utf-8"))
                self._send(200, {})
            elif (path := self._path("/v1/data/")) is not None:
                state.put_data(path, self._json(self._body()))
                self._send(204, None)
            else:
                self._send(404, {"code": "resource_not_found", "message": self.path})

        def do_DELETE(self) -> None:
            self._answer(self._delete)

        def _delete(self) -> None:
            path = self._path("/v1/policies/")
            if not path:
                self._send(404, {"code": "resource_not_found", "message": self.path})
                return
            state.delete_policy("/".join(path))
            self._send(200, {})

        def do_POST(self) -> None:
            self._answer(self._post)

        def _post(self) -> None:
            path = self._path("/v1/data/")
            if path is None:
                self._send(404, {"code": "resource_not_found", "message": self.path})
                return
            self._strict()
            request = self._json(self._body() or b"{}")
            if not isinstance(request, dict):
                raise Refused(400, {"code": "invalid_parameter", "message": "the body is an object"})
            defined, value = state.query(path, request.get("input"))
            self._send(200, {"result": value} if defined else {})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="OPA's evaluator behind OPA's REST API (tests only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8181)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(OpaState()))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


class OpaServerProcess:
    """The server as a real subprocess (tests start it, read its URL, and stop it to test fail-closed).

    Raises RuntimeError if it does not say where it listens within `timeout_s`.
    """

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--port", "0"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = self.proc.stdout.readline()
        if not line.startswith("listening on ") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"the OPA test server did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    main()
