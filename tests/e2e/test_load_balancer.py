"""Two replicas behind HAProxy, started with the README's config itself (deploy/haproxy/haproxy.cfg, the addresses
given in the environment HAProxy substitutes): requests reach both replicas; a replica that stops being ready gets
none until it is ready again; a replica killed with -9 costs the clients nothing, HAProxy sends the rest to the
other at once and takes the dead one out within its checks; with no replica left, HAProxy's refusal is
problem+json saying nothing changed.

One pair of `jobgate up` processes on one PostgreSQL business database and one ledger (set up by `ledger
init-db`, each replica with an append-only role of its own, as in production), one HAProxy in front, for the whole
module; the kill -9 goes last."""

from __future__ import annotations

import csv
import io
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from e2e_testkit import free_port, wait_for
from replicas_testkit import Replicas, seed_demo_without_agents

from gateway.settings import Settings
from ledger.admin import init_db
from ledger.keys import load_or_create_signer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@pytest.fixture(scope="module", autouse=True)
def haproxy_installed() -> None:
    """Debian's HAProxy; CI installs it (.ci/run). Fails, not skips, when JOBGATE_REQUIRE_HAPROXY=1."""
    if not Path(HAPROXY).exists():
        if os.environ.get("JOBGATE_REQUIRE_HAPROXY") == "1":
            pytest.fail("JOBGATE_REQUIRE_HAPROXY=1 but no HAProxy: apt-get install -y haproxy")
        pytest.skip("no HAProxy: apt-get install -y haproxy")


SPEC = {"name": "lb", "project": "vision", "gpus_per_node": 1, "command": ["true"]}


@dataclass
class Pair:
    lb: str  # what clients use
    admin: str  # HAProxy's stats
    replicas: dict[str, subprocess.Popen[bytes]]  # by HAProxy server name
    tokens: dict[str, str]
    ledger_owner: str  # the ledger database as its owner (init-db's URL)
    roles: dict[str, tuple[str, str]]  # each replica's ledger role and password

    def server_states(self) -> dict[str, str]:
        """Each replica's state in HAProxy (UP, DOWN, ...), from its stats CSV."""
        rows = csv.DictReader(io.StringIO(httpx.get(self.admin + "/stats;csv", timeout=5).text.lstrip("# ")))
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "replicas" and r["svname"] in self.replicas}

    def submit(self, client: httpx.Client) -> httpx.Response:
        return client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": secrets.token_hex(8)})


def _database(server: str, prefix: str) -> str:
    import psycopg

    name = f"{prefix}_{secrets.token_hex(5)}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(server)._replace(path="/" + name))


def _drop(server: str, url: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{urlsplit(url).path[1:]}" WITH (FORCE)')


@pytest.fixture(scope="module")
def pair(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    import psycopg

    tmp = tmp_path_factory.mktemp("lb")
    biz = _database(pg_server_url, "jobgate_lb_biz")
    ledger_owner = _database(pg_server_url, "jobgate_lb_ledger")
    roles = {f"replica{n}": (f"jobgate_lb_{os.getpid()}_{n}", secrets.token_hex(8)) for n in (1, 2)}
    ledgers = {name: init_db(ledger_owner, role=role, password=pw).gateway_url for name, (role, pw) in roles.items()}
    data_dir = tmp / "var"
    seed_demo_without_agents(data_dir, biz, str(ledgers["replica1"]))
    # The ledger's signing key every replica shares (D/keys), made before they start, as a deployment hands it out:
    # both replicas then start together, as systemd starts them at boot. Each has a ledger role of its own.
    settings = Settings(data_dir=data_dir, database_url=biz)
    load_or_create_signer(settings.keys_dir, settings.ledger_origin)
    sets = {name: Replicas(data_dir, biz, str(url)) for name, url in ledgers.items()}
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        replicas = {name: rs.start(demo=False, wait_ready=False) for name, rs in sets.items()}
        for name, rs in sets.items():
            rs.wait_ready(replicas[name])
        lb_port, admin_port = free_port(), free_port()
        env = {**os.environ, "JOBGATE_LB_BIND": f"127.0.0.1:{lb_port}",
               "JOBGATE_LB_ADMIN_BIND": f"127.0.0.1:{admin_port}",
               **{f"JOBGATE_REPLICA_{name[-1]}": f"127.0.0.1:{r.port}" for name, r in replicas.items()}}
        with (tmp / "haproxy.log").open("wb") as log:
            # -db: in the foreground, as systemd runs it (Type=notify aside); the file is the README's.
            haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], stdout=log, stderr=subprocess.STDOUT,
                                       env=env)
        p = Pair(f"http://127.0.0.1:{lb_port}", f"http://127.0.0.1:{admin_port}",
                 {name: r.proc for name, r in replicas.items()}, sets["replica1"].tokens, ledger_owner, roles)

        def both_up() -> bool:
            try:
                return set(p.server_states().values()) == {"UP"}
            except httpx.HTTPError:
                return False

        wait_for(both_up, 30, "HAProxy to find both replicas ready")
        yield p
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(timeout=20)
        for rs in sets.values():
            rs.stop()
        _drop(pg_server_url, biz)
        _drop(pg_server_url, ledger_owner)
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            for role, _ in roles.values():
                c.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_config_is_the_one_the_readme_gives() -> None:
    """The README's production section tells operators to run this file; a moved or renamed file would leave it
    pointing nowhere."""
    readme = (CONFIG.parents[2] / "README.md").read_text()
    assert "deploy/haproxy/haproxy.cfg" in readme.split("## Running in production", 1)[1]
    env = {**os.environ, "JOBGATE_REPLICA_1": "127.0.0.1:1", "JOBGATE_REPLICA_2": "127.0.0.1:2"}
    r = subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_requests_through_haproxy_reach_both_replicas_on_one_organisation(pair: Pair) -> None:
    with httpx.Client(base_url=pair.lb, headers={"Authorization": f"Bearer {pair.tokens['alice']}"},
                      timeout=30) as alice:
        answered = [pair.submit(alice) for _ in range(20)]
        assert {r.status_code for r in answered} == {201}, [r.text for r in answered if r.status_code != 201]
        assert {r.headers["x-jobgate-replica"] for r in answered} == {"replica1", "replica2"}
        # HAProxy's request id is the one the replica logged and answered with (it makes its own, req-..., of an id
        # it would not keep), one id per request; a client's own id passes through.
        ids = {r.headers["x-request-id"] for r in answered}
        assert len(ids) == len(answered) and not any(i.startswith("req-") for i in ids), ids
        assert alice.get("/v1/jobs", headers={"X-Request-ID": "mine-1"}).headers["x-request-id"] == "mine-1"
        # One organisation: every job either replica took is listed by whichever answers now.
        listed = {j["id"] for j in alice.get("/v1/jobs", params={"limit": 200}).json()["jobs"]}
        assert {r.json()["id"] for r in answered} <= listed


def test_a_replica_that_is_not_ready_gets_no_requests_until_it_is_again(pair: Pair) -> None:
    """replica2's ledger role loses its INSERT grant: its /readyz answers 503 (the ledger check), HAProxy takes it
    out and every request goes to replica1, which is ready; init-db run again restores the grant, /readyz answers
    200 and HAProxy puts replica2 back. (Checked by /healthz, which says the process lives, it would have kept
    sending replica2 submissions it could not record.)"""
    import psycopg

    role, password = pair.roles["replica2"]
    with httpx.Client(base_url=pair.lb, headers={"Authorization": f"Bearer {pair.tokens['alice']}"},
                      timeout=30) as alice:
        with psycopg.connect(pair.ledger_owner, autocommit=True) as c:
            c.execute(f'REVOKE INSERT ON ledger_entries FROM "{role}"')
        wait_for(lambda: pair.server_states()["replica2"] == "DOWN", 30, "HAProxy to take the unready replica out")
        answered = [pair.submit(alice) for _ in range(6)]
        assert {r.status_code for r in answered} == {201}, [r.text for r in answered if r.status_code != 201]
        assert {r.headers["x-jobgate-replica"] for r in answered} == {"replica1"}

        init_db(pair.ledger_owner, role=role, password=password)
        wait_for(lambda: pair.server_states()["replica2"] == "UP", 30, "HAProxy to put the ready replica back")
        answered = [pair.submit(alice) for _ in range(10)]
        assert {r.status_code for r in answered} == {201}, [r.text for r in answered if r.status_code != 201]
        assert {r.headers["x-jobgate-replica"] for r in answered} == {"replica1", "replica2"}


def test_a_replica_killed_costs_the_clients_nothing_and_haproxy_takes_it_out(pair: Pair) -> None:
    """kill -9 of replica2: the requests HAProxy still routes to it are refused at connect and sent to replica1
    (option redispatch), so no client sees an error; its checks (every 1 s, then every 250 ms once one failed; two
    failures) mark it DOWN, by this config within about 1.3 s plus a connect. The figure measured is printed."""
    victim = pair.replicas["replica2"]
    with httpx.Client(base_url=pair.lb, headers={"Authorization": f"Bearer {pair.tokens['alice']}"},
                      timeout=30) as alice:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed = time.monotonic()
        answered: list[httpx.Response] = []
        while pair.server_states()["replica2"] != "DOWN" and time.monotonic() - killed < 30:
            answered.append(pair.submit(alice))
        down_after = time.monotonic() - killed
        answered += [pair.submit(alice) for _ in range(5)]
        print(f"HAProxy marked the killed replica DOWN {down_after:.2f} s after kill -9;"
              f" {len(answered)} submissions meanwhile and after, all answered by replica1")
        assert pair.server_states() == {"replica1": "UP", "replica2": "DOWN"}
        assert {r.status_code for r in answered} == {201}, [r.text for r in answered if r.status_code != 201]
        assert {r.headers["x-jobgate-replica"] for r in answered} == {"replica1"}

        # The last replica gone too: HAProxy's own refusal, problem+json like the gateway's, saying nothing changed.
        survivor = pair.replicas["replica1"]
        os.kill(survivor.pid, signal.SIGKILL)
        survivor.wait()
        wait_for(lambda: pair.server_states()["replica1"] == "DOWN", 30, "HAProxy to mark replica1 DOWN")
        refused = pair.submit(alice)
        assert refused.status_code == 503 and refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["status"] == 503 and "nothing was changed" in refused.json()["detail"]

