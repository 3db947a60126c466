"""A sweep of the whole command tree: `--help` helps, and bad input gets one line and a non-zero exit.

The cases are derived from each command's click params, so a new command or option is swept without
touching this file:

1. `--help` exits 0, shows the command's description, and every option has help text.
2. An unknown option, and under a group an unknown command: click's usage error (exit 2).
3. Each required argument or option left out: click's usage error naming it.
4. Each number, range or choice given `abc`, and each range a value below its minimum: click's usage error.
5. Each path pointing into a directory that does not exist: one line from the command itself.
6. Each database URL pointing at a port nobody listens on: one line.
7. Commands that talk to the gateway: a gateway nobody listens on; and, against a real gateway, tokens
   and a trigger that are garbage (unknown, non-ASCII, with a line break).

"One line" means: no exception escaped (the commands run in-process, so nothing else could print a
traceback), and stderr holds one `Error: ...` line; for click's usage errors, after its `Usage:`/`Try ...`
preamble. The real gateway is `jobgate up` on the demo organisation, in its own process (in this one its
log lines would land in the stderr the cases read), started once for the module when a case needs it.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner, Result

from gateway.cli.main import cli as jobgate_cli
from gateway.demo import prepare_demo
from gateway.settings import Settings
from nodeagent.__main__ import cli as agent_cli

ROOTS: dict[str, click.Command] = {"jobgate": jobgate_cli, "jobgate-agent": agent_cli}

# Commands whose body runs until it is stopped: only --help is checked, since a case that got past
# validation would block the run (and `up` would bind :8080 beside whatever runs there).
HELP_ONLY = {
    "jobgate up": "starts the gateway (and with --demo two node agents) until interrupted",
    "jobgate-agent": "the node agent long-polls the gateway until SIGTERM",
}

# Values that get an option past the command's own parsing, where "x" would be refused before the
# request this sweep wants to see sent.
GOOD_BY_NAME = {"scope": "job=j-1", "users": "alice=1"}
# What a command needs before it sends anything (exactly one of --job or --since).
EXTRA = {"jobgate forensics export": ["--since", "2020-01-01T00:00:00+00:00"]}

NO_SUCH_PATH = "{tmp}/no-such-dir/no-such-file"
DEAD_GATEWAY = "http://127.0.0.1:{dead_port}"
DEAD_DB = "postgresql://postgres@127.0.0.1:{dead_port}/nobody"
WELL_FORMED_TOKEN = "jg_" + "x" * 43
# label: (value, in the error line)
BAD_TOKENS = {"garbage": ("garbage", "401"), "non-ascii": ("jöbgäte-tökén", "token"),
              "line-break": ("jg_abc\r\nX-Evil: 1", "token")}
# Options naming a database by URL (the gateway's URL is swept separately).
DB_URL_PARAMS = {"db", "url", "ledger_url", "database_url"}
# The auditor may read the ledger, so export commands get as far as writing their file.
PATH_CASE_USER = "audrey"

# No case may reach a gateway someone runs on this machine through the environment.
ENV: dict[str, str | None] = {k: None for k in ("JOBGATE_URL", "JOBGATE_TOKEN", "JOBGATE_TRIGGER",
                                                "JOBGATE_POLICY_ENGINE", "JOBGATE_OPA_URL")}


# -- the command tree -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One command and the groups above it, root first, each with the name it is invoked by."""

    chain: tuple[tuple[str, click.Command], ...]

    @property
    def cmd(self) -> click.Command:
        return self.chain[-1][1]

    @property
    def root(self) -> str:
        return self.chain[0][0]

    @property
    def name(self) -> str:
        return " ".join(n for n, _ in self.chain)

    @property
    def id(self) -> str:
        return ".".join(n for n, _ in self.chain[1:]) or self.root

    @property
    def is_group(self) -> bool:
        return isinstance(self.cmd, click.Group)

    @property
    def talks_to_gateway(self) -> bool:
        """A command (not a group) with a --gateway option: every command that calls the gateway takes one, also in
        a group that takes it before the subcommand (whose offline commands, `policy check`, take none)."""
        return not self.is_group and any(p.name == "gateway" for p in self.cmd.params)


def walk(name: str, cmd: click.Command, above: tuple[tuple[str, click.Command], ...] = ()) -> Iterator[Node]:
    node = Node((*above, (name, cmd)))
    yield node
    if isinstance(cmd, click.Group):
        for sub_name in sorted(cmd.commands):
            yield from walk(sub_name, cmd.commands[sub_name], node.chain)


NODES = [node for root, cmd in ROOTS.items() for node in walk(root, cmd)]


# -- cases ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    node: Node
    label: str
    replace: dict[str, str] = field(default_factory=dict)  # param name -> value, a template (Scratch.fill)
    omit: str | None = None  # a required param left out
    tail: tuple[str, ...] = ()  # after the options
    live: bool = False  # against the real gateway; else a dead one, for commands that talk to the gateway
    expect: str = ""  # in the error line

    @property
    def id(self) -> str:
        return f"{self.node.id}:{self.label}"


def _opt(p: click.Parameter) -> str:
    return max(p.opts, key=len)


def _good(p: click.Parameter) -> str:
    """A value click accepts for P, so that the one param under test is what fails."""
    t = p.type
    if p.name in GOOD_BY_NAME:
        return GOOD_BY_NAME[p.name]
    if isinstance(t, click.Choice):
        return str(t.choices[0])
    if isinstance(t, click.IntRange | click.FloatRange):
        if t.min is None:
            return "1"
        return str(t.max if t.min_open and t.max is not None else t.min)  # an open minimum is not in the range
    if isinstance(t, click.types.IntParamType | click.types.FloatParamType):
        return "1"
    if isinstance(t, click.Path):
        return "{tmp}/out"
    return "swept-by-the-cli-test"  # long enough for any minimum length (a reason needs 10 characters)


def _typed(p: click.Parameter) -> bool:
    return not getattr(p, "is_flag", False) and isinstance(
        p.type, click.Choice | click.types.IntParamType | click.types.FloatParamType)


def cases_for(node: Node) -> Iterator[Case]:
    if node.name in HELP_ONLY:
        return
    yield Case(node, "unknown-option", tail=("--no-such-option",), expect="No such option")
    if isinstance(node.cmd, click.Group):
        yield Case(node, "unknown-command", tail=("no-such-command",), expect="No such command")
        if not node.cmd.invoke_without_command:
            return
    for p in node.cmd.params:
        if p.required:
            yield Case(node, f"missing-{p.name}", omit=p.name, expect="Missing")
        if _typed(p):
            yield Case(node, f"{p.name}-abc", replace={p.name: "abc"}, expect="Invalid value")
            low = getattr(p.type, "min", None)
            if low is not None:
                yield Case(node, f"{p.name}-below-range", replace={p.name: str(low - 1)}, expect="Invalid value")
        if isinstance(p.type, click.Path):
            yield Case(node, f"{p.name}-no-such-path", replace={p.name: NO_SUCH_PATH}, live=node.talks_to_gateway)
        if p.name in DB_URL_PARAMS:
            yield Case(node, f"{p.name}-nobody-listens", replace={p.name: DEAD_DB})
    if node.talks_to_gateway:
        yield Case(node, "gateway-nobody-listens", expect="cannot reach the gateway")
        for label, (token, expect) in BAD_TOKENS.items():
            yield Case(node, f"token-{label}", replace={"token": token}, live=True, expect=expect)
        yield Case(node, "trigger-non-ascii", replace={"trigger": "ci/nïghtly#42"}, live=True, expect="trigger")


CASES = [case for node in NODES for case in cases_for(node)]

# Defects found and not fixed yet, by id: each is xfail(strict=True) until the commit that fixes it.
KNOWN_DEFECTS: dict[str, str] = {}


def params(items: list[Node] | list[Case]) -> list[object]:
    """pytest params with ids; known defects xfail strictly, cases against the real gateway are integration."""
    out: list[object] = []
    for item in items:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[item.id])] if item.id in KNOWN_DEFECTS else []
        if isinstance(item, Case) and item.live:
            marks.append(pytest.mark.integration)
        out.append(pytest.param(item, id=item.id, marks=marks))
    return out


# -- running them ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    tmp: Path
    dead_port: int

    def fill(self, template: str) -> str:
        return template.format(tmp=self.tmp, dead_port=self.dead_port)


@dataclass(frozen=True)
class Gateway:
    url: str
    tokens: dict[str, str]


def argv(case: Case, scratch: Scratch, gateway: Gateway | None) -> list[str]:
    """Each level's name followed by its own options, required params filled; the leaf's arguments last,
    after `--` so that one like -1 is not read as an option."""
    where = ({"gateway": gateway.url, "token": gateway.tokens[PATH_CASE_USER]} if gateway is not None
             else {"gateway": DEAD_GATEWAY, "token": WELL_FORMED_TOKEN})
    replace = {**where, **case.replace} if case.node.talks_to_gateway else case.replace
    out: list[str] = []
    args: list[str] = []
    for depth, (name, cmd) in enumerate(case.node.chain):
        out += [name] if depth else []
        for p in cmd.params:
            if p.name is None or p.name == case.omit:
                continue
            value = replace[p.name] if p.name in replace else _good(p) if p.required else None
            if value is None:
                continue
            if isinstance(p, click.Argument):
                args.append(scratch.fill(value))
            else:
                out += [_opt(p), scratch.fill(value)]
    return [*out, *EXTRA.get(case.node.name, []), *case.tail, *(["--", *args] if args else [])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Scratch:
    return Scratch(tmp_path_factory.mktemp("cases"), _free_port())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("gateway")
    prepare_demo(Settings(data_dir=data_dir))
    tokens = json.loads((data_dir / "demo-tokens.json").read_text())
    url = f"http://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    log = data_dir / "gateway.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", url.rsplit(":", 1)[1],
                                 "--data-dir", str(data_dir)], stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Gateway(url, tokens)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def invoke(root: str, args: list[str]) -> Result:
    return CliRunner().invoke(ROOTS[root], args, env=ENV, prog_name=root)


def error_lines(r: Result) -> list[str]:
    """The error as printed: stderr's non-blank lines, or for click's own usage errors only its `Error:`
    lines (the `Usage:` and `Try ...` preamble and a required choice's `Choose from:` list are click's)."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):
        return [line for line in lines if line.startswith("Error")]
    return lines


def crash(r: Result) -> str:
    assert r.exc_info is not None
    return "".join(traceback.format_exception(*r.exc_info))


@pytest.mark.parametrize("node", params(NODES))
def test_help_describes_the_command_and_every_option(node: Node) -> None:
    r = invoke(node.root, [n for n, _ in node.chain[1:]] + ["--help"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Usage: ")
    description = " ".join((node.cmd.help or "").split())
    assert description, f"`{node.name}` has no description"
    assert " ".join(description.split()[:6]) in " ".join(r.stdout.split())
    undocumented = [_opt(p) for p in node.cmd.params
                    if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not undocumented, f"`{node.name}`: options without help text: {', '.join(undocumented)}"


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input_gets_one_line_and_a_nonzero_exit(case: Case, scratch: Scratch,
                                                    request: pytest.FixtureRequest) -> None:
    args = argv(case, scratch, request.getfixturevalue("gateway") if case.live else None)
    r = invoke(case.node.root, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), crash(r)
    assert r.exit_code != 0, f"{case.node.root} {args} exited 0:\n{r.output}"
    assert "Traceback" not in r.output
    assert r.exit_code == 2 or not r.stderr.startswith("Usage:"), r.stderr
    lines = error_lines(r)
    assert len(lines) == 1, f"{case.node.root} {args}: not one line on stderr:\n{r.stderr}"
    assert lines[0].startswith("Error: "), lines[0]
    assert case.expect in lines[0]


@pytest.mark.integration
def test_a_command_closes_its_connection(gateway: Gateway) -> None:
    """In-process (CliRunner, this sweep) a kept-alive socket left open would warn when collected."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        r = invoke("jobgate", ["job", "--gateway", gateway.url, "--token", gateway.tokens["alice"], "list"])
        gc.collect()
    assert r.exit_code == 0, r.output
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
