"""Red team: what on-call and the auditor type into the CLI in a hurry gets one line back, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gateway.cli.main import cli

NOBODY = "http://127.0.0.1:9"  # nothing is sent: these requests cannot even be built


@pytest.mark.parametrize("args", [
    ["emergency-stop", "create", "--scope", "job=j-1", "--concern", "safety", "--reason", "runaway", "--grace", "nan"],
    ["job", "submit", "--name", "t", "--project", "vision", "--runtime-limit", "inf", "--", "true"],
])
def test_a_value_no_request_can_carry_is_one_line(args: list[str]) -> None:
    """NaN or infinity cannot go into JSON: httpx raised ValueError, which escaped as a traceback. (A control
    character in an id, pasted from a log, is percent-quoted now and gets the route's 404: test_cli_paths_redteam.)"""
    group, *rest = args
    result = CliRunner().invoke(cli, [group, "--gateway", NOBODY, "--token", "jg_x", *rest])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: cannot send this request: "), line
