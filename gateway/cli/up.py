"""`jobgate up`: start the gateway (and, with --demo, a seeded organisation and two local node agents)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import click
from pydantic import ValidationError

from gateway.demo import AGENTS_LOCK, DEMO_GPUS_PER_NODE, DEMO_NODES
from gateway.settings import Settings, settings_refused
from nodeagent.layout import private_state_dir

if TYPE_CHECKING:
    from gateway.context import Gateway


def demo_isolation(data_dir: Path) -> str | None:
    """Why the demo's agents cannot isolate their jobs here (None: they can, each job under its own uid)."""
    from nodeagent.errors import ConfigError
    from nodeagent.isolation import reachable
    from nodeagent.spawn import find_setpriv

    if os.geteuid() != 0:
        return "the gateway does not run as root, so its agents cannot give jobs identities of their own"
    try:
        find_setpriv()
        reachable(data_dir / "agents")
    except ConfigError as e:
        return e.detail
    return None


def _start_agents(data_dir: Path, url: str, *, isolate: bool) -> list[subprocess.Popen[bytes]]:
    procs = []
    for node in DEMO_NODES:
        work = data_dir / "agents" / node
        state = private_state_dir(work)
        # The work dir goes in the environment, not the command line, which every process on the node can read.
        env = {**os.environ, "JOBGATE_AGENT_WORK_DIR": str(work)}
        if not isolate:
            env["JOBGATE_AGENT_UNSAFE_JOBS_SHARE_AGENT_UID"] = "1"
        with open(state / "agent.log", "ab") as log:  # the child has its own copy of the descriptor
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "--node", node, "--gpus", str(DEMO_GPUS_PER_NODE),
                 "--gateway", url, "--command-key", str(data_dir / "keys" / "command.pub")],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            ))
    return procs


def _still_running(settings: Settings) -> list[str]:
    """Ids of the jobs whose processes the demo's agents leave running when they stop (workloads outlive their
    agent on purpose: restarting an agent must not take training runs down with it)."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.exc import SQLAlchemyError

    from gateway.store.models import Job
    from gateway.store.states import ACTIVE_STATES

    engine = create_engine(settings.resolved_database_url())
    try:
        with engine.connect() as c:
            return list(c.scalars(select(Job.id).where(Job.state.in_(ACTIVE_STATES)).order_by(Job.id)))
    except SQLAlchemyError:
        return []  # only a courtesy on the way out: never fail the shutdown for it
    finally:
        engine.dispose()


def _check_port_free(host: str, port: int) -> None:
    """Raises ClickException when HOST:PORT cannot be bound, before anything is seeded, started or printed: the
    banner's "Try, in another terminal" lines would otherwise send the reader to whatever already listens there
    (often another gateway, whose tokens differ). SO_REUSEADDR as uvicorn sets it, so a port in TIME_WAIT passes."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror}") from e
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            why = "the port is already in use" if e.errno == errno.EADDRINUSE else e.strerror
            other = port + 1 if port < 65535 else port - 1
            raise click.ClickException(
                f"cannot listen on {host}:{port}: {why}. Pick another port: `jobgate up --port {other}`"
                f" (`make run PORT={other}`), then use JOBGATE_URL=http://{host}:{other}"
            ) from e


def _check_startable(policies_dir: Path, rate_limit_storage: str) -> None:
    """Raises ClickException naming what the gateway could not start with: a policy set it refuses (each problem
    as file:line) or a rate limit storage URI `limits` does not know. Checked before anything starts, so the
    answer is one line rather than the traceback of a failed application start-up."""
    from limits.errors import ConfigurationError
    from limits.storage import storage_from_string

    from gateway.decisions.policy.errors import PolicyError, PolicyLoadError
    from gateway.decisions.policy.testing import load_tested_set

    try:
        load_tested_set(policies_dir)
    except PolicyLoadError as e:
        problems = "; ".join(str(p) for p in e.errors)
        raise click.ClickException(f"policy set {policies_dir} refused: {problems}") from e
    except PolicyError as e:
        raise click.ClickException(f"policy set {policies_dir} refused: {e}") from e
    try:
        storage_from_string(rate_limit_storage)
    except ConfigurationError as e:
        raise click.ClickException(f"rate limit storage {rate_limit_storage!r} cannot be used: {e}") from e


def _check_slurm(settings: Settings) -> None:
    """Raises ClickException, in one line, when the Slurm cluster cannot be used (no slurm.conf, no such user,
    slurmctld does not answer): checked first, before the policy set is compiled, so the answer comes at once."""
    from gateway.execution.slurm import SlurmClient, SlurmConnection, SlurmError

    try:
        SlurmClient(SlurmConnection(slurm_conf=settings.slurm_conf, user=settings.slurm_service_user,
                                    timeout_s=settings.slurm_timeout_s)).ping()
    except SlurmError as e:
        raise click.ClickException(f"cannot start on Slurm ({settings.slurm_conf}): {e}") from e


def _open(settings: Settings, demo: bool) -> tuple[Gateway, bool | None]:
    """Seed the demo (if asked) and open the gateway's stores, keys and policy engine before uvicorn starts:
    (the gateway, whether the demo was seeded now). Raises ClickException with the reason in one line (another
    gateway writing this data dir's ledger, a data dir that cannot be created, an OPA server not there), which
    inside uvicorn's start-up was a traceback of a hundred lines or more after a banner saying it ran."""
    from sqlalchemy.exc import SQLAlchemyError

    from gateway.bootstrap import execution_for, open_gateway
    from gateway.decisions.policy.errors import PolicyError, PolicyLoadError
    from gateway.demo import prepare_demo
    from gateway.errors import GatewayError
    from gateway.execution.slurm import SlurmError
    from gateway.native.command_key import load_or_create_command_key
    from ledger.errors import LedgerError

    try:
        seeded = None
        if demo:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            load_or_create_command_key(settings.keys_dir)
            seeded = prepare_demo(settings)
        return open_gateway(settings, execution=execution_for(settings)), seeded
    except SlurmError as e:
        raise click.ClickException(f"cannot start on Slurm ({settings.slurm_conf}): {e}") from e
    except PolicyLoadError as e:
        raise click.ClickException("cannot start: " + "; ".join(str(p) for p in e.errors)) from e
    except (LedgerError, PolicyError) as e:
        raise click.ClickException(f"cannot start: {e.diagnostics()}") from e
    except OSError as e:
        raise click.ClickException(f"cannot start: data dir {settings.data_dir}: {e.strerror or e}") from e
    except GatewayError as e:  # another gateway process on this business database
        raise click.ClickException(f"cannot start: {e.detail}") from e
    except SQLAlchemyError as e:
        raise click.ClickException(f"cannot start: the business database refused: {e.__class__.__name__}:"
                                   f" {str(getattr(e, 'orig', e)).splitlines()[0]}") from e


def _lead_or_follow(gateway: Gateway) -> None:
    """Take part in the leader election now, so the start-up line can say which part this replica has. Raises
    ClickException (the business database cannot be reached for the election's own connection)."""
    from gateway.app import lead_or_follow

    try:
        lead_or_follow(gateway)
    except Exception as e:
        gateway.close()
        first = str(e).strip().splitlines()
        raise click.ClickException(f"cannot start: the business database refused the leader election's connection:"
                                   f" {first[0] if first else e.__class__.__name__}") from e


def _role_line(gateway: Gateway) -> str:
    """Whether this replica leads or follows (gateway/leadership.py), and who leads."""
    lead = gateway.leadership
    if lead.leads():
        status = lead.status()
        if status["mode"] == "single":
            return "this gateway leads (the only one on its business database)"
        return f"this replica leads (replica {lead.replica_id}, epoch {status['epoch']})"
    try:
        leader = lead.status()["leader"] or {}
    except Exception:  # only a courtesy line: the replica still serves
        leader = {}
    return (f"this replica follows (replica {lead.replica_id}); leader {leader.get('id', 'unknown')} at"
            f" {leader.get('address', '?')}, epoch {leader.get('epoch', '?')}; it takes over within"
            " a few seconds of the leader's end")


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(":" + parts.password + "@", ":***@", 1)))


def _banner(url: str, settings: Settings, demo: bool, isolated: bool = True, agents: bool = True) -> str:
    data_dir = settings.data_dir
    # On PostgreSQL (JOBGATE_DATABASE_URL / JOBGATE_LEDGER_URL) the stores are not the data dir's files: the banner
    # named jobgate.db and ledger.db there, and its verify command answered "no ledger database at .../ledger.db".
    stores = ["business DB " + (_without_password(settings.database_url) if settings.database_url else "jobgate.db"),
              "ledger " + (_without_password(settings.ledger_url) if settings.ledger_url else "ledger.db"), "keys/"]
    verify = (f'jobgate ledger verify --db "$JOBGATE_LEDGER_URL" --public-key {settings.keys_dir / "ledger.vkey"}'
              if settings.ledger_url else f"jobgate ledger verify --data-dir {data_dir}")
    lines = [
        "",
        f"jobgate gateway   {url}",
        f"  console         {url}/ui  (sign in with a token)",
        f"  API docs        {url}/docs",
        f"  health          {url}/healthz  (readiness: {url}/readyz)",
        f"  data dir        {data_dir}  ({', '.join(stores)})",
    ]
    if demo:
        lines += [
            "  node agents     none: Slurm's nodes run the jobs" if settings.backend == "slurm" else
            (f"  node agents     {', '.join(DEMO_NODES)} ({DEMO_GPUS_PER_NODE} virtual GPUs each; "
             + ("each job under a uid of its own)" if isolated else "isolation: none)")) if agents else
            "  node agents     beside the first replica started",
            f"  demo tokens     {data_dir / 'demo-tokens.json'}",
            "",
            "Try, in another terminal:",
            f"  export PATH={Path(sys.executable).parent}:$PATH",
            f"  export JOBGATE_URL={url}",
            f"  export JOBGATE_TOKEN=$(jobgate demo-token alice --data-dir {data_dir})",
            "  jobgate job submit --name hello --project vision --gpus 2 -- python3 -c 'import time; time.sleep(600)'",
            "  jobgate job list",
            "  JOBGATE_TOKEN=$(jobgate demo-token mallory --data-dir "
            f"{data_dir}) jobgate job stop <id> --reason 'mine now'   # refused by policy",
            "  jobgate job stop <id> --reason 'done with it' --wait 60",
            f"  {verify}",
        ]
    return "\n".join(lines) + "\n"


@click.command("up")
@click.option("--demo", is_flag=True, help="Seed the demo organisation and start two local node agents.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--data-dir", default="var", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where the business DB, the ledger and the keys are kept.")
@click.option("--policy-engine", type=click.Choice(["embedded", "opa", "opa-inprocess"]),
              envvar="JOBGATE_POLICY_ENGINE", default="embedded", show_default=True,
              help="Decide with embedded Rego, an OPA server, or OPA's evaluator in-process.")
@click.option("--opa-url", envvar="JOBGATE_OPA_URL", help="OPA server URL (with --policy-engine opa).")
@click.option("--backend", type=click.Choice(["native", "slurm"]), envvar="JOBGATE_BACKEND", default="native",
              show_default=True, help="What runs the jobs: jobgate's own nodes, or a Slurm cluster (JOBGATE_SLURM_CONF"
                                      " names its slurm.conf; README, On Slurm).")
def up(demo: bool, host: str, port: int, data_dir: Path, policy_engine: str, opa_url: str | None,
       backend: str) -> None:
    """Start the gateway on the embedded default (SQLite business DB, separate SQLite ledger, embedded Rego)."""
    import uvicorn

    from gateway.app import create_app

    data_dir = data_dir.resolve()
    if policy_engine == "opa" and not opa_url:
        raise click.ClickException("--policy-engine opa needs --opa-url (or JOBGATE_OPA_URL)")
    _check_port_free(host, port)
    try:
        settings = Settings(data_dir=data_dir, host=host, port=port, policy_engine=policy_engine, opa_url=opa_url,
                            backend=backend)
    except ValidationError as e:  # a JOBGATE_* variable with a value it cannot take: one line, not a traceback
        raise click.ClickException(settings_refused(e)) from e
    if backend == "slurm":
        _check_slurm(settings)
    _check_startable(settings.policies_dir, settings.rate_limit_storage)
    url = f"http://{host}:{port}"
    gateway, seeded = _open(settings, demo)
    _lead_or_follow(gateway)
    agents: list[subprocess.Popen[bytes]] = []
    unisolated = None
    if demo:
        click.echo("seeded the demo organisation" if seeded else "demo organisation already seeded; keeping data")
        if backend != "native":
            pass  # on Slurm, Slurm's nodes run the jobs: no demo agents
        elif gateway.db.hold(AGENTS_LOCK):  # the first replica to start (alone: always this one)
            unisolated = demo_isolation(data_dir)
            if unisolated:
                click.echo(f"node agents: isolation none ({unisolated}): every demo job runs as your own user")
            agents = _start_agents(data_dir, url, isolate=unisolated is None)
        else:
            # Another replica runs them, and any replica serves them: two agents per node would each run the
            # node's jobs.
            click.echo("node agents: none started here; the demo's run beside the first replica started")
    click.echo(_role_line(gateway))
    if gateway.leadership.status()["mode"] != "single" and settings.rate_limit_storage.startswith("memory"):
        # Not refused: one replica alone on a shared database is a fine way to start. But each replica counting
        # its own budget lets N replicas allow N times every limit.
        click.echo("warning: rate limits are counted in this process's memory (JOBGATE_RATE_LIMIT_STORAGE); with"
                   " several replicas each counts alone: set it to redis://... so they share one budget", err=True)
    click.echo(_banner(url, settings, demo, isolated=unisolated is None, agents=bool(agents) or not demo))
    if backend == "slurm":
        click.echo(f"  jobs run on Slurm cluster {getattr(gateway.execution, 'cluster', '?')} ({settings.slurm_conf})")

    def _terminate(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    app = create_app(settings, gateway=gateway)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Release the agents' long polls first: uvicorn waits for open requests before it shuts the app
            # down (which would release them), and after its graceful timeout cancels them with a traceback.
            gateway = getattr(app.state, "gateway", None)
            if gateway is not None:
                gateway.bus.close()
            super().handle_exit(sig, frame)

    try:
        Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)).run()
    except KeyboardInterrupt:
        pass
    finally:
        for p in agents:
            p.terminate()
        for p in agents:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if agents and (running := _still_running(settings)):
            click.echo(f"stopped; {len(running)} job(s) still running on the demo nodes ({', '.join(running[:5])}"
                       f"{', ...' if len(running) > 5 else ''}): their processes outlive the node agents on purpose."
                       f" `jobgate up --demo --data-dir {data_dir}` picks them up again; stop them there with"
                       " `jobgate job stop ID --reason ...`.")


@click.command("demo-token")
@click.argument("name")
@click.option("--data-dir", default="var", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Data dir of `jobgate up --demo` (holds demo-tokens.json).")
def demo_token(name: str, data_dir: Path) -> None:
    """Print the demo token of NAME (alice, bob, carol, dave, erin, frank, sam, audrey, mallory, ci-bot)."""
    import json

    path = data_dir / "demo-tokens.json"
    if not path.exists():
        # Run from another folder than the demo's, the default names a var/ that is not the demo's.
        default = "" if data_dir.is_absolute() else f"; --data-dir {data_dir} is read in the folder you are in"
        raise click.ClickException(
            f"no demo tokens at {path.absolute()}{default}. A running demo keeps them in its own data dir, which its"
            f" banner names (\"demo tokens\"); point at it: `jobgate demo-token {name} --data-dir DIR` (for"
            " `make run`, DIR is var/ in the repository). No demo running: start one with `jobgate up --demo`")
    tokens = json.loads(path.read_text())
    if name not in tokens:
        raise click.ClickException(f"no demo token for {name!r}; known: {', '.join(sorted(tokens))}")
    click.echo(tokens[name])
