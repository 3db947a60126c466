"""CLI tests' helpers: a canned HTTP server (a real socket) to format the CLI's answers against, the CLI run in
process against it, and the fixture's app behind a real uvicorn socket with the CLI run against that."""

from __future__ import annotations

import json
import re
import shlex
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from gateway_testkit import Api

from gateway.cli.main import cli

TOKEN = "jg_" + "x" * 43


class Canned(ThreadingHTTPServer):
    trigger: str | None = None  # the X-Jobgate-Trigger of the last request
    # (method, path) -> (status, body) or (status, body, headers)
    answers: dict[tuple[str, str], tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], dict[str, str]]]
    authorization: str | None = None  # the header of the last request


class CannedHandler(BaseHTTPRequestHandler):
    server: Canned

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.server.authorization = self.headers.get("authorization")
        self.server.trigger = self.headers.get("x-jobgate-trigger")
        status, body, *headers = self.server.answers.get((self.command, self.path), (404, {"detail": "not canned"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers[0] if headers else {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/problem+json" if status >= 400 else "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *_: object) -> None:
        pass


def run(server: Canned | None, *args: str, token: str | None = TOKEN) -> tuple[int, str]:
    env = {"JOBGATE_URL": f"http://127.0.0.1:{server.server_address[1]}" if server else "http://127.0.0.1:9",
           "JOBGATE_TOKEN": token or ""}
    result = CliRunner().invoke(cli, list(args), env=env, prog_name="jobgate")
    return result.exit_code, result.output


def jobgate(url: str, api: Api, who: str, group: str, *args: str) -> tuple[int, str]:
    """Exit code and output of `jobgate GROUP ARGS` as WHO (the gateway's own log lines may be in the output)."""
    result = CliRunner().invoke(cli, [group, *args], env={"JOBGATE_URL": url, "JOBGATE_TOKEN": api.tokens[who]})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


def readme_curls() -> list[list[str]]:
    """The curl commands of the README's sh blocks, continuation lines joined, as argv (comments dropped)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```", readme, flags=re.S | re.M)
    commands = [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines()]
    return [shlex.split(c, comments=True) for c in commands if c.startswith("curl ")]
