"""What a newcomer following the README is told when they slip: where `--token` goes, why a call was refused
and where the refusal is recorded, which approval to confirm, why a finished job "waits", what a blast radius
is, that `--plot` needs matplotlib, and that :8080 is taken; and that the README's curl never saves a refusal.

Answers come from a canned HTTP server (a real socket, `http.server`) so the CLI's formatting is tested
without a whole gateway; the gateway's own answers are tested in test_jobs_api.py and test_approvals_api.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from cli_testkit import TOKEN, Canned, readme_curls, run
from click.testing import CliRunner

from gateway.cli.approvals import _radius
from gateway.cli.client import ClientOption
from gateway.cli.main import cli
from gateway.cli.queue import describe_why
from ledger.store import open_store

# -- where --gateway, --token and --trigger go: anywhere, in every command that calls the gateway ----------------

# Commands that never call the gateway, by path; every other takes the three options.
OFFLINE = {"up", "demo-token", "policy check", "policy test", "policy explain", "policy whatif", "sim generate",
           "ledger consistency", "ledger export", "ledger init-db", "ledger prove", "ledger rotate-key",
           "ledger verify"}
# What a command needs before it sends its first request ("x" would be refused by the command itself).
GOOD = {"scope": "job=j-1", "seq": "3", "concern": "safety", "job_id": "j-1"}


def leaves(group: click.Group = cli, above: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from leaves(cmd, (*above, name))
        else:
            yield (*above, name), cmd


def calls_gateway(cmd: click.Command) -> bool:
    return any(p.name == "token" for p in cmd.params)


CLIENT_COMMANDS = [(path, cmd) for path, cmd in leaves() if " ".join(path) not in OFFLINE]


def required(cmd: click.Command, tmp: Path) -> tuple[list[str], list[str]]:
    """Options and arguments that get COMMAND as far as its first request."""
    options: list[str] = []
    args: list[str] = []
    for p in cmd.params:
        if not p.required and p.name not in GOOD:
            continue
        value = GOOD.get(str(p.name)) or (
            str(tmp / "out") if isinstance(p.type, click.Path) else "1" if isinstance(
                p.type, click.types.IntParamType | click.types.FloatParamType) else "x-long-enough-for-a-reason")
        if isinstance(p, click.Argument):
            args.append(value)
        else:
            options += [max(p.opts, key=len), value]
    return options, args


def test_every_command_either_calls_the_gateway_with_the_three_options_or_is_named_offline() -> None:
    """A new command (or group) that calls the gateway without them, or one offline that is not listed, fails
    here; and --trigger means one thing in every command, the pipeline run of a service account's call (an
    emergency stop's concern was `--trigger safety`)."""
    assert {" ".join(path) for path, cmd in leaves() if not calls_gateway(cmd)} == OFFLINE
    for path, cmd in CLIENT_COMMANDS:
        assert {"gateway", "token", "trigger"} <= {str(p.name) for p in cmd.params}, path
    triggers = [(path, p) for path, cmd in leaves() for p in cmd.params if "--trigger" in getattr(p, "opts", ())]
    assert triggers and all(isinstance(p, ClientOption) for _, p in triggers), triggers


@pytest.mark.parametrize("placement", ["before", "after", "both"])
@pytest.mark.parametrize(("path", "cmd"), CLIENT_COMMANDS, ids=[" ".join(p) for p, _ in CLIENT_COMMANDS])
def test_gateway_token_and_trigger_work_before_and_after_the_subcommand(
    canned: Canned, tmp_path: Path, path: tuple[str, ...], cmd: click.Command, placement: str
) -> None:
    """`jobgate job --token T list` worked and `jobgate job list --token T` did not, while the token, service-account,
    break-glass and approvals commands took them only after the subcommand. Now both, in every group; written on
    both sides, the one after the subcommand wins. The environment (a dead gateway, another token) loses to both."""
    if len(path) == 1 and placement != "after":
        pytest.skip("a command of its own, in no group: its options follow it")
    given = ["--gateway", f"http://127.0.0.1:{canned.server_address[1]}", "--token", "jg_given", "--trigger", "ci#7"]
    wrong = ["--gateway", "http://127.0.0.1:9", "--token", "jg_wrong", "--trigger", "ci#wrong"]
    options, args = required(cmd, tmp_path)
    group, leaf = list(path[:-1]), path[-1]
    before, after = {"before": (given, []), "after": ([], given), "both": (wrong, given)}[placement]
    argv = [*group, *before, leaf, *options, *after, *(["--", *args] if args else [])]
    env = {"JOBGATE_URL": "http://127.0.0.1:9", "JOBGATE_TOKEN": "jg_environment", "JOBGATE_TRIGGER": None}
    result = CliRunner().invoke(cli, argv, env=env, prog_name="jobgate")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 1 and result.output.startswith("Error: 404 not canned"), (argv, result.output)
    assert (canned.authorization, canned.trigger) == ("Bearer jg_given", "ci#7"), argv


@pytest.mark.parametrize(("path", "cmd"), CLIENT_COMMANDS, ids=[" ".join(p) for p, _ in CLIENT_COMMANDS])
def test_help_shows_the_gateway_url_jobgate_url_gives(path: tuple[str, ...], cmd: click.Command) -> None:
    """--help said `[default: http://127.0.0.1:8080]` with JOBGATE_URL pointing elsewhere."""
    for at in {path, path[:-1]} - {()}:  # the command's help, and its group's
        r = CliRunner().invoke(cli, [*at, "--help"], env={"JOBGATE_URL": "http://10.1.2.3:8081"}, prog_name="jobgate")
        assert r.exit_code == 0 and "http://10.1.2.3:8081 (JOBGATE_URL)" in " ".join(r.output.split()), r.output
        r = CliRunner().invoke(cli, [*at, "--help"], env={"JOBGATE_URL": None}, prog_name="jobgate")
        assert "[default: http://127.0.0.1:8080]" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["job", "--json", "list"], "--json goes after the subcommand here: `jobgate job SUBCOMMAND --json ...`"),
        (["sim", "generate", "--trace", "t"], "--trace goes before the subcommand: `jobgate sim --trace VALUE"
                                              " generate ...`"),
        (["job", "list", "--nope"], "No such option '--nope'"),
        (["emergency-stop", "create", "--scope", "job=j-1", "--trigger", "safety", "--reason", "runaway"],
         "Missing option '--concern'. It names the concern behind the stop; --trigger is the pipeline run"),
    ],
    ids=["flag-before-list", "group-option-after-generate", "really-unknown", "trigger-is-not-the-concern"],
)
def test_an_option_on_the_wrong_side_of_the_subcommand_says_where_it_goes(args: list[str], expect: str) -> None:
    code, out = run(None, *args)
    assert code == 2 and expect in out, out
    assert "goes" not in expect or "Did you mean" not in out  # click used to suggest --json for --token


def test_demo_token_run_from_another_folder_says_how_to_point_it_at_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said `var/demo-tokens.json does not exist; run jobgate up --demo first` while a demo ran."""
    monkeypatch.chdir(tmp_path)
    code, out = run(None, "demo-token", "alice")
    assert code == 1 and out.count("\n") == 1, out
    assert f"no demo tokens at {tmp_path / 'var' / 'demo-tokens.json'}" in out, out
    assert "`jobgate demo-token alice --data-dir DIR`" in out and "banner" in out, out


def test_a_refusal_names_its_rule_and_ledger_seq(canned: Canned) -> None:
    canned.answers[("POST", "/v1/jobs/j-1/stop")] = (403, {
        "type": "https://jobgate.dev/problems/policy-denied", "title": "Denied by policy", "status": 403,
        "detail": "mallory holds no role in project vision that grants job.stop.any",
        "rules": ["A4.no_capability"], "ledger_seq": 21})
    canned.answers[("GET", "/v1/jobs/j-1")] = (403, {
        "detail": "mallory holds no role in project vision that grants job.view", "rules": ["A1.not_member"],
        "ledger_seq": -1})
    code, out = run(canned, "job", "stop", "j-1", "--reason", "I need the GPUs")
    assert code == 1
    assert out == ("Error: 403 mallory holds no role in project vision that grants job.stop.any"
                   " (rule A4.no_capability; refusal recorded at ledger seq 21)\n")
    code, out = run(canned, "job", "show", "j-1")
    assert code == 1 and out.endswith("grants job.view (rule A1.not_member)\n"), out  # no seq: none recorded


def test_a_rate_limit_refusal_is_one_line_that_says_when_to_try_again(canned: Canned) -> None:
    canned.answers[("POST", "/v1/jobs/j-1/stop")] = (429, {
        "type": "https://jobgate.dev/problems/rate-limited", "title": "Too many requests", "status": 429,
        "detail": "rate limit calls_per_minute_per_principal: principal bob may make 60 mutating calls per minute;"
                  " this would be call 61", "rules": ["H2.rate_limit"], "ledger_seq": 130, "retry_after_s": 17},
        {"Retry-After": "17"})
    code, out = run(canned, "job", "stop", "j-1", "--reason", "poke")
    assert code == 1 and out.count("\n") == 1, out
    assert out.startswith("Error: 429 rate limit calls_per_minute_per_principal: principal bob may make 60 mutating"
                          " calls per minute; this would be call 61 (rule H2.rate_limit; refusal recorded at ledger"
                          " seq 130); try again in 17 s (after "), out
    canned.answers[("POST", "/v1/jobs/j-1/stop")] = (429, {"detail": "slow down"})  # a proxy's, with no header
    code, out = run(canned, "job", "stop", "j-1", "--reason", "poke")
    assert code == 1 and out == "Error: 429 slow down; try again later\n", out


def test_a_missing_token_says_where_one_goes(canned: Canned) -> None:
    canned.answers[("GET", "/v1/jobs")] = (401, {"detail": "missing Authorization header"})
    code, out = run(canned, "job", "list", token=None)
    assert code == 1 and "(no token given: set JOBGATE_TOKEN or pass --token)" in out, out
    code, out = run(canned, "job", "list")
    assert code == 1 and "no token given" not in out, out  # a token was sent: the server's word is the news


def test_a_pasted_token_with_spaces_around_it_works_and_is_never_echoed(canned: Canned) -> None:
    """A trailing space made the request unsendable; the message blamed the network and printed the token."""
    canned.answers[("GET", "/v1/jobs")] = (200, {"jobs": []})
    code, out = run(canned, "job", "list", token=f" {TOKEN} \n")
    assert code == 0, out
    assert canned.authorization == f"Bearer {TOKEN}"
    code, out = run(canned, "job", "list", token=f"{TOKEN[:10]}\n{TOKEN[10:]}")
    assert code == 1 and "must be printable ASCII, on one line" in out and TOKEN[10:] not in out, out


def test_a_non_object_error_body_is_still_one_line(canned: Canned) -> None:
    canned.answers[("GET", "/v1/jobs")] = (502, ["upstream", "down"])  # type: ignore[assignment]
    code, out = run(canned, "job", "list")
    assert code == 1 and out.startswith("Error: 502 ") and out.count("\n") == 1, out


def _job(state: str) -> dict[str, Any]:
    return {"id": "j-1", "name": "n", "project": "vision", "queue": "normal", "state": state, "state_reason": "",
            "nodes": 1, "gpus_per_node": 2, "placement": [], "ownership": {"owner": "alice"}}


def test_a_stop_that_needs_a_second_person_names_the_approval(canned: Canned) -> None:
    canned.answers[("POST", "/v1/jobs/j-1/stop")] = (202, {
        "job": _job("running"), "approval_id": "apr-42",
        "decision": {"effect": "needs_approval", "ledger_seq": 24,
                     "reasons": ["carol stops alice's job j-1; a second person must confirm"]}})
    code, out = run(canned, "job", "stop", "j-1", "--reason", "urgent eval needs the GPUs")
    assert code == 0, out
    assert "j-1: needs approval (carol stops alice's job j-1; a second person must confirm)" in out
    assert "approval apr-42: nothing changes until a second person runs `jobgate approve apr-42`" in out
    assert "(`jobgate approvals show apr-42` shows them exactly what)" in out
    code, out = run(canned, "job", "stop", "j-1", "--reason", "urgent eval needs the GPUs", "--json")
    assert code == 0 and json.loads(out)["approval_id"] == "apr-42", out


def _why(state: str, reason: str) -> dict[str, Any]:
    return {"job_id": "j-1", "state": state, "queue": "normal", "position": None, "queue_length": 0,
            "priority": {"effective": 570.0, "parts": {"baseline": 500, "contribution": 20, "aging": 7.4e-06,
                                                       "fairshare": 50}},
            "blocking_reason": reason, "estimated_start": None, "estimated_at": None, "quota": "owned",
            "preemptions": 0, "wait_credit_s": 0, "others_in_queue": [], "priority_history": []}


@pytest.mark.parametrize(
    ("state", "reason", "expect", "absent"),
    [
        ("stopped", "graceful", ["  state reason: graceful", "  ran on owned quota"], "waiting because"),
        ("pending", "no node has 2 free GPUs", ["  waiting because: no node has 2 free GPUs"], "state reason"),
    ],
    ids=["stopped", "pending"],
)
def test_why_does_not_say_a_finished_job_waits(state: str, reason: str, expect: list[str], absent: str) -> None:
    out = describe_why(_why(state, reason))
    assert "effective priority 570.0 = baseline 500 + contribution 20 + fairshare 50\n" in out, out  # no 7.4e-06
    assert all(line in out.splitlines() for line in expect), out
    assert absent not in out


@pytest.mark.parametrize(
    ("radius", "text"),
    [
        ({"jobs": 1, "gpus": 1, "projects": ["vision"]}, "1 job(s), 1 GPU(s), project(s) vision"),
        ({"jobs": 3, "projects": ["speech", "vision"], "gpus": 16, "gpu_hours_at_stake": 41.5, "running": 2},
         "3 job(s), 2 running, 16 GPU(s), 41.5 GPU-hours at stake, project(s) speech, vision"),
    ],
    ids=["emergency", "batch"],
)
def test_blast_radius_reads_as_words(radius: dict[str, Any], text: str) -> None:
    assert _radius(radius) == text


def test_sim_plot_without_matplotlib_fails_before_the_replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is not installed
    code, out = run(None, "sim", "--trace", str(tmp_path / "missing.csv"), "--plot", str(tmp_path / "out.png"))
    assert code == 1 and "--plot needs matplotlib" in out and "pip install -e '.[sim]'" in out, out
    assert "missing.csv" not in out  # refused before the trace was read, not after a long replay


def test_up_on_a_taken_port_says_so_before_seeding_or_printing_the_banner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data_dir = tmp_path / "var"
        r = subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--demo", "--port", str(port),
                            "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "JOBGATE_URL": ""})
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in r.stderr
    assert f"`jobgate up --port {port + 1}` (`make run PORT={port + 1}`)" in r.stderr
    assert "Try, in another terminal" not in r.stdout and not data_dir.exists()


def test_up_with_a_setting_it_cannot_take_names_the_variable_in_one_line(tmp_path: Path) -> None:
    """A mistyped JOBGATE_* value was a pydantic traceback of some forty lines, the variable's name deep inside."""
    data_dir = tmp_path / "var"
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--demo", "--port", "1", "--data-dir",
                        str(data_dir)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "JOBGATE_URL": "", "JOBGATE_SCHEDULER_MAX_SHARE": "a quarter"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "Error: invalid setting scheduler_max_share (JOBGATE_SCHEDULER_MAX_SHARE) = 'a quarter': Input should be a"
        " valid number, unable to parse string as a number"], r.stderr
    assert not data_dir.exists()


def _up(port: int, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "up", "--demo", "--port", str(port),
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JOBGATE_URL": ""})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_up_beside_a_running_gateway_or_on_an_unusable_data_dir_says_why_in_one_line(tmp_path: Path) -> None:
    """Both failed inside uvicorn's start-up, after the banner said the gateway ran: a traceback of 140 lines
    or more (the second gateway's ledger claim), or one ending in FileNotFoundError (the data dir)."""
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    held = open_store(f"sqlite:///{data_dir / 'ledger.db'}")  # as a first gateway on this data dir holds it
    try:
        held.claim_writer()
        r = _up(_free_port(), data_dir)
    finally:
        held.close()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("Error: cannot start: ") and "already being written by another process" in r.stderr
    assert "API docs" not in r.stdout  # no banner for a gateway that is not running
    (tmp_path / "a-file").write_text("")
    r = _up(_free_port(), tmp_path / "a-file" / "var")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "cannot start: data dir" in r.stderr, r.stderr


def test_a_curl_in_the_readme_that_saves_its_answer_fails_on_a_refusal() -> None:
    """`curl ... > saved-checkpoint.txt` saved a 403's problem+json as the trusted checkpoint, and exited 0."""
    saving = [argv for argv in readme_curls() if {"-o", "--output", ">"} & set(argv)]
    assert any("/v1/ledger/checkpoint" in " ".join(argv) for argv in saving), readme_curls()
    for argv in saving:
        short = "".join(a[1:] for a in argv if re.fullmatch(r"-[A-Za-z]+", a))
        assert "f" in short or "--fail" in argv, argv  # an HTTP error is a failed command, its body unsaved
        assert "s" not in short or "S" in short, argv  # silent, but the error still shown
        assert ">" not in argv, argv  # the shell would create (or empty) the file even when curl fails
