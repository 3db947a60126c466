"""A real local Slurm cluster for tests and benchmarks, started and stopped with deploy/slurm.

`start_cluster` runs the project's starter in a fresh directory under /tmp (job users must be able to
reach it, so not under pytest's 0700 basetemp) with its own ports, cluster name and accounting database;
`LocalCluster` holds the facts a client needs and can run a command as any of the demo users, which is
how tests act on Slurm behind jobgate's back.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

from gateway.execution.slurm import SlurmClient, SlurmConnection

REPO = Path(__file__).resolve().parents[4]
STARTER = REPO / "deploy" / "slurm"
T = TypeVar("T")


class StarterFailed(RuntimeError):
    """deploy/slurm/up exited non-zero; the message ends with the last lines it printed."""


def why_no_slurm() -> str | None:
    """Why this machine cannot run the starter at all (None when it can try)."""
    if os.name != "posix" or not Path("/proc/self/environ").exists():
        return "not Linux"
    if os.geteuid() != 0:
        return "not root: slurmd starts jobs as their owners and the demo users are added with useradd"
    if not shutil.which("dpkg-query"):
        return "not Debian: the starter installs Debian's Slurm packages"
    port = int(os.environ.get("JOBGATE_SLURM_MYSQL_PORT", "3306"))
    try:
        with socket.create_connection(("127.0.0.1", port), 2):
            pass
    except OSError:
        return f"no MariaDB on 127.0.0.1:{port} for slurmdbd"
    return None


def no_slurm_here(reason: str) -> NoReturn:
    """Skip the test for want of Slurm; fail it instead under JOBGATE_REQUIRE_SLURM=1 (CI)."""
    if os.environ.get("JOBGATE_REQUIRE_SLURM") == "1":
        pytest.fail(f"JOBGATE_REQUIRE_SLURM=1 but no Slurm cluster: {reason}", pytrace=False)
    pytest.skip(f"no Slurm cluster: {reason}")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(nodes: int) -> int:
    """A port base whose slurmctld (+17), slurmdbd (+19), slurmrestd (+20) and slurmd (+100+i) ports are free.

    All below the kernel's ephemeral range: a port in it that is free now may be any client's next
    outgoing port by the time a slurmd binds it (that slurmd then exits, and its node stays unknown)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = min(low, 65536) - 101 - nodes
    if top <= 10000:
        raise StarterFailed(f"no room for {nodes} slurmd ports below the ephemeral range starting at {low}")
    for _ in range(50):
        base = secrets.randbelow((top - 10000) // 200) * 200 + 10000
        ports = [base + 17, base + 19, base + 20, *(base + 100 + i for i in range(1, nodes + 1))]
        if all(_free(p) for p in ports):
            return base
    raise StarterFailed("no free port range for a Slurm cluster on 127.0.0.1")


@dataclass(frozen=True)
class LocalCluster:
    """One running cluster started by deploy/slurm/up, and what its clients need."""

    dir: Path
    env: dict[str, str]
    cluster: str
    slurm_conf: Path
    rest_url: str
    jwt_key: Path
    service_user: str
    nodes: int
    gpus_per_node: int
    workdir: Path

    def connection(self, user: str | None = None, **kw: object) -> SlurmConnection:
        return SlurmConnection(slurm_conf=self.slurm_conf, user=user or self.service_user, rest_url=self.rest_url,
                               jwt_key=self.jwt_key, **kw)  # type: ignore[arg-type]

    def client(self, user: str | None = None, **kw: object) -> SlurmClient:
        return SlurmClient(self.connection(user, **kw))

    def run_as(self, user: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command as a Unix user, as that person would at a shell (out of band)."""
        entry = pwd.getpwnam(user)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.workdir, check=check,
                              env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(self.slurm_conf), "USER": user},
                              user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])

    def pid(self, daemon: str) -> int:
        return int((self.dir / "run" / f"{daemon}.pid").read_text().strip())

    def stop_daemon(self, daemon: str) -> None:
        """SIGTERM one daemon by its pid file and wait until it is gone."""
        pid = self.pid(daemon)
        os.kill(pid, 15)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{daemon} (pid {pid}) to exit")

    def up(self) -> float:
        """Run the starter again (it starts only what is missing); the seconds it took."""
        return run_starter("up", self.env, str(self.nodes))

    def cancel_everything(self) -> None:
        """Cancel every job as root and wait until none runs: each test starts on an empty cluster."""
        env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(self.slurm_conf)}
        ids = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, env=env,
                             timeout=60).stdout.split()
        if not ids:
            return
        subprocess.run(["scancel", *ids], capture_output=True, env=env, timeout=60)

        def idle() -> bool:
            out = subprocess.run(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%A"], capture_output=True, text=True,
                                 env=env, timeout=60)
            return out.returncode == 0 and not out.stdout.strip()

        wait_for(idle, 60, "every job to end")


def run_starter(script: str, env: dict[str, str], *args: str) -> float:
    """Run deploy/slurm/<script>; the seconds it took. Raises StarterFailed."""
    t0 = time.monotonic()
    proc = subprocess.run([str(STARTER / script), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise StarterFailed(f"deploy/slurm/{script} exited {proc.returncode}:\n{tail}")
    return time.monotonic() - t0


def start_cluster(nodes: int = 4, *, prefix: str = "jobgate-slurm-test-",
                  preempt: str = "jobgate") -> tuple[LocalCluster, float]:
    """Start a fresh cluster of `nodes` nodes; it and the bring-up seconds. `preempt`: who preempts
    (JOBGATE_SLURM_PREEMPT: jobgate, or slurm for a benchmark's baseline). Raises StarterFailed."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    tag = secrets.token_hex(4)
    env = {
        "JOBGATE_SLURM_DIR": str(d),
        "JOBGATE_SLURM_PORT_BASE": str(free_port_base(nodes)),
        "JOBGATE_SLURM_CLUSTER": f"t{tag}",
        "JOBGATE_SLURM_DB": f"jobgate_slurm_test_{tag}",
        "JOBGATE_SLURM_PREEMPT": preempt,
    }
    try:
        seconds = run_starter("up", env, str(nodes))
    except BaseException:
        stop_cluster_dir(env)
        raise
    facts = json.loads((d / "cluster.json").read_text())
    return LocalCluster(dir=d, env=env, cluster=facts["cluster"], slurm_conf=Path(facts["slurm_conf"]),
                        rest_url=facts["rest_url"], jwt_key=Path(facts["jwt_key"]),
                        service_user=facts["service_user"], nodes=facts["nodes"],
                        gpus_per_node=facts["gpus_per_node"], workdir=Path(facts["workdir"])), seconds


def stop_cluster_dir(env: dict[str, str]) -> float:
    """Stop the cluster of that starter environment and delete its directory and database."""
    return run_starter("down", {**env, "JOBGATE_SLURM_PURGE": "1"})


def wait_for(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll pred until it returns something truthy; that value. Raises AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def script(body: str) -> str:
    """A bash batch script with `body` after the interpreter line."""
    return "#!/bin/bash\n" + body.strip("\n") + "\n"


# A job that, on its prepare signal, writes "$CKPT" and exits 0. It reaps its child first: a script that
# exits while a child of its process group lingers stays RUNNING in Slurm for ~3 s more (proctrack/pgid).
# Both signal scripts touch "$READY" once their handler is in place (a signal before would kill bash).
CHECKPOINTS_ON_TERM = script("""
sleep 600 & child=$!
trap 'kill $child; wait $child; echo weights > "$CKPT"; exit 0' TERM
touch "$READY"
wait $child
""")
# A job that ignores its prepare signal and runs until it is killed.
IGNORES_TERM = script("""
trap '' TERM
touch "$READY"
while :; do sleep 1; done
""")
SLEEPS = script("exec sleep 600")
