"""H1 on the node: a job runs under an identity of its own and cannot reach the agent or another job.

Real agents, real processes under real separate uids, real cgroups: these run as root (CI does, with
JOBGATE_REQUIRE_ISOLATION=1 so that they fail rather than skip elsewhere)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
from job_host import searchable_by_jobs
from nodeagent_testkit import AgentProcess, EventLog, FakeGateway, command, py, wait_for_log

from nodeagent import cgroups
from nodeagent.identity import Identities
from nodeagent.isolation import Isolation, detect
from nodeagent.runner import Runner
from nodeagent.spawn import find_setpriv

pytestmark = pytest.mark.integration

if os.geteuid() != 0:
    if os.environ.get("JOBGATE_REQUIRE_ISOLATION") == "1":
        raise RuntimeError("JOBGATE_REQUIRE_ISOLATION=1 but the tests do not run as root")
    pytest.skip("isolating jobs needs root", allow_module_level=True)

# Everything a job could try against the agent and its neighbour; each attempt's outcome is printed as JSON.
ATTACK = py(r'''
import ctypes, json, os, signal
work, victim, agent = os.environ["WORK"], int(os.environ["VICTIM_PID"]), int(os.environ["AGENT_PID"])
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": sorted(os.environ)}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = type(e).__name__
attempt("read token", lambda: open(work + "/state/token").read())
attempt("list agent state", lambda: os.listdir(work + "/state"))
attempt("read process records", lambda: open(work + "/state/processes.json").read())
attempt("write nonce store", lambda: open(work + "/state/nonces.json", "a").write("{}"))
attempt("list jobs", lambda: os.listdir(work + "/jobs"))
attempt("read neighbour's checkpoints", lambda: os.listdir(os.environ["VICTIM_DIR"] + "/checkpoints"))
attempt("signal neighbour", lambda: os.kill(victim, signal.SIGTERM))
attempt("kill neighbour's group", lambda: os.killpg(victim, signal.SIGKILL))
attempt("read neighbour's environment", lambda: open("/proc/%d/environ" % victim, "rb").read())
attempt("read agent's environment", lambda: open("/proc/%d/environ" % agent, "rb").read())
libc = ctypes.CDLL(None, use_errno=True)
out["trace neighbour"] = "done" if libc.ptrace(16, victim, 0, 0) == 0 else os.strerror(ctypes.get_errno())
out["agent command line"] = open("/proc/%d/cmdline" % agent, "rb").read().decode(errors="replace")
print("RESULT " + json.dumps(out), flush=True)
''')
REFUSED = {"read token", "list agent state", "read process records", "write nonce store", "list jobs",
           "read neighbour's checkpoints", "signal neighbour", "kill neighbour's group",
           "read neighbour's environment", "read agent's environment"}


def result(job_dir: Path) -> dict[str, Any]:
    log = job_dir / "output.log"
    wait_for_log(job_dir, "RESULT ", timeout=20)
    line = next(x for x in log.read_text().splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


def test_a_job_can_reach_neither_the_agents_secrets_nor_its_neighbour(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    """The attack of issue 26 from inside a job on a shared node: read the node's token and state, then act
    as the node or on another tenant's job directly. Every step is refused by the kernel."""
    agent_process.start()
    agent_process.wait_reconciled()
    gateway.push(command(signing_key, "start", "victim", argv=py("import time; print('ready', flush=True); "
                                                                 "time.sleep(60)"), gpus=[0]))
    victim = gateway.wait_report("victim", "started")["pid"]
    jobs = agent_process.work_dir / "jobs"
    wait_for_log(jobs / "victim", "ready")
    env = {"WORK": str(agent_process.work_dir), "VICTIM_PID": str(victim), "AGENT_PID": str(agent_process.proc.pid),
           "VICTIM_DIR": str(jobs / "victim")}
    gateway.push(command(signing_key, "start", "attacker", argv=ATTACK, gpus=[1], env=env))
    out = result(jobs / "attacker")

    assert {k: out[k] for k in REFUSED} == dict.fromkeys(REFUSED, "PermissionError")
    assert out["trace neighbour"] == os.strerror(1)  # EPERM
    victim_uid = os.stat(f"/proc/{victim}").st_uid
    assert out["uid"] not in (0, os.geteuid(), victim_uid) and out["gid"] == out["uid"] and out["groups"] == []
    # Nothing names the agent's secrets: not its command line, not what the job inherited.
    assert "token" not in out["agent command line"] and str(agent_process.work_dir) not in out["agent command line"]
    assert not [k for k in out["env"] if k.startswith("JOBGATE_AGENT")]
    assert os.kill(victim, 0) is None  # the neighbour still runs
    # Each job's directory is its own, its checkpoints too; the agent's state is the agent's.
    assert os.stat(jobs / "victim" / "checkpoints").st_uid == victim_uid
    assert oct(os.stat(agent_process.work_dir / "state").st_mode & 0o777) == "0o700"


@pytest.fixture
def isolated(tmp_path: Path, events: EventLog, request: pytest.FixtureRequest) -> Iterator[Runner]:
    """An in-process runner isolating its jobs, with cgroups (param "cgroup") or by uid alone ("uid")."""
    work = tmp_path / "agent"
    searchable_by_jobs(tmp_path)
    iso = detect(f"test-{os.getpid()}-{request.node.name[-12:]}".replace("[", "-").replace("]", ""), work / "jobs",
                 Identities(range(2_000_100_000, 2_000_100_003)))
    if getattr(request, "param", "cgroup") == "uid":
        iso = Isolation(iso.identities, iso.setpriv, None)
    elif iso.cgroups is None:
        pytest.skip("no cgroup v2 here")
    r = Runner(work, events, isolation=iso)
    yield r
    for record in r.running():
        r.stop(record.job_id, 0)
    r.join_stops(10)
    r.close()
    if iso.cgroups is not None:
        for name in iso.cgroups.children():
            cgroups.remove(iso.cgroups.path_of(name))
        cgroups.remove(iso.cgroups.root)


# A job that leaves helpers behind in sessions of their own (double fork, setsid), as launchers and data loaders
# do; their pids go to a file so the test can look for them afterwards.
ESCAPING = py('''
import os, time
for _ in range(2):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
with open("helpers", "w") as f:
    time.sleep(0.3)
print("ready", flush=True)
time.sleep(600)
''')


@pytest.mark.parametrize("isolated", ["cgroup", "uid"], indirect=True)
def test_a_job_that_started_helpers_in_new_sessions_is_stopped_whole(isolated: Runner, events: EventLog) -> None:
    record = isolated.start("escaper", ESCAPING, [0], {}, 5, "SIGTERM")
    assert record is not None and record.uid is not None
    wait_for_log(isolated.job_dir("escaper"), "ready")
    helpers = [p for p in _pids_of(record.uid) if p != record.pid]
    assert len(helpers) == 2 and all(os.getsid(p) != record.pid for p in helpers)  # outside the job's session
    isolated.stop("escaper", 0.5)
    ev = events.wait("escaper", "stopped", timeout=20).evidence
    assert ev is not None and ev["process_group_gone"] is True
    assert ev["confinement"] == ("cgroup" if record.cgroup else "uid")
    assert _pids_of(record.uid) == []


def test_a_uid_handed_out_again_cannot_read_the_runs_that_had_it_before(isolated: Runner, events: EventLog) -> None:
    first = isolated.start("first", py("import os, pathlib; pathlib.Path(os.environ['JOBGATE_CHECKPOINT_DIR'], "
                                       "'weights').write_text('secret')"), [0], {}, 5, "SIGTERM")
    events.wait("first", "exited", timeout=20)
    ckpt = isolated.job_dir("first") / "checkpoints"
    assert os.stat(ckpt / "weights").st_uid == 0  # given back to the agent once the run ended
    second = isolated.start("second", py(f"open({str(ckpt / 'weights')!r}).read()"), [0], {}, 5, "SIGTERM")
    assert first is not None and second is not None and second.uid == first.uid
    ev = events.wait("second", "exited", timeout=20).evidence
    assert ev is not None and ev["exit_code"] != 0 and "PermissionError" in "\n".join(ev["log_tail"])


@pytest.fixture
def unix_account() -> Iterator[str]:
    name = f"jg{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", name], check=True)
    yield name
    subprocess.run(["userdel", name], check=False)


def test_a_person_mapped_to_a_unix_account_runs_as_that_account(tmp_path: Path, events: EventLog,
                                                                unix_account: str) -> None:
    entry = pwd.getpwnam(unix_account)
    searchable_by_jobs(tmp_path)
    iso = Isolation(Identities(accounts={"alice": unix_account}), find_setpriv(), None)
    runner = Runner(tmp_path / "agent", events, isolation=iso)
    try:
        runner.start("mapped", py("import os; print(os.getuid(), os.environ['USER'], os.environ['HOME'], "
                                  "flush=True)"), [0], {}, 5, "SIGTERM", run_as="alice")
        ev = events.wait("mapped", "exited", timeout=20).evidence
        assert ev is not None and ev["log_tail"] == [f"{entry.pw_uid} {unix_account} /nonexistent"]
        # Someone else's job (or one without a mapping) still gets a uid of its own.
        record = runner.start("unmapped", py("import time; time.sleep(30)"), [1], {}, 5, "SIGTERM", run_as="bob")
        assert record is not None and record.uid in iso.identities.uids
    finally:
        for record in runner.running():
            runner.stop(record.job_id, 0)
        runner.join_stops(10)
        runner.close()


def _pids_of(uid: int) -> list[int]:
    from nodeagent.confinement import processes_of

    return processes_of(uid)
