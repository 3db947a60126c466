"""CLI client commands fail with one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

JOBGATE = [sys.executable, "-m", "gateway.cli"]


@pytest.mark.parametrize(
    ("args", "contains"),
    [
        (["job", "--gateway", "http://127.0.0.1:9", "list"], "cannot reach the gateway"),
        (["job", "submit", "--name", "x", "--project", "vision", "--label", "nolabel", "--", "true"],
         "must look like key=value"),
        (["approve", "apr-1", "--gateway", "not a url"], "is not a gateway URL"),
        (["job", "--gateway", "http://[::1", "list"], "is not a gateway URL"),
        (["job", "--gateway", "localhost:8080", "list"], "like http://HOST:PORT"),
        (["job", "stop", "j-1"], "Missing option '--reason'"),
    ],
    ids=["unreachable", "bad-label", "bad-url", "unparsable-url", "no-scheme", "missing-reason"],
)
def test_client_errors_are_one_line(args: list[str], contains: str) -> None:
    env = {**os.environ, "JOBGATE_URL": "http://127.0.0.1:9", "JOBGATE_TOKEN": "jg_" + "x" * 43}
    r = subprocess.run([*JOBGATE, *args], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert contains in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("Error")]) == 1
