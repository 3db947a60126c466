"""Replica benchmarks; prints one JSON object.
`python bench/replicas.py [--ledger] [--submissions] [--failover] [--quick]` (no flag: all three).

--submissions: authorised submissions (POST /v1/jobs, the demo's alice, bench/gateway.py's load generator: 32
keep-alive connections, closed loop for capacity, open loop for latency) on real `jobgate up` processes, each
round on fresh PostgreSQL databases (business DB and an init-db ledger):
1. 1 replica, clients straight to it: capacity, then latency at 80% of it (the baseline);
2. 2 replicas on one business DB and ledger: capacity with the clients spread straight over both (the figure
   beside the baseline: the same client path), capacity through HAProxy (deploy/haproxy/haproxy.cfg as it is,
   what production runs) and latency at 80% of that.
Server CPU per submission is summed over the replicas and the PostgreSQL backends serving their connections (by
pid from pg_stat_activity, read from /proc); HAProxy's and every PostgreSQL process's on the machine (WAL writer,
checkpointer, and whatever else the server ran meanwhile) are given beside it. The coordination overhead is that
CPU with 2 replicas / with 1 (target <= 1.15); the round with its median is reported beside every round's figures.

--ledger: one PostgreSQL ledger (on the server JOBGATE_BENCH_PG_URL or JOBGATE_TEST_PG_URL names, a fresh database
per run) appended to by real processes, each a Ledger with 64 threads appending 1 KiB entries in a closed loop
for a few seconds:
1. 2 processes x 64 appenders, beside 1 process x 64 (the baseline), in rounds (--rounds, each with its own
   baseline; the median round of the ratio is reported with every round's figures, see bench.machine.median_round).
2. The head-lock hold time per batch (p50/p99), measured in the store from the moment SELECT ... FOR UPDATE
   returned the head row to the moment COMMIT returned, and its parts: numbering, hashing and signing in Python
   (build), the one statement that writes the batch (write), COMMIT with its WAL flush (commit). The head row
   serialises batches whatever the number of processes, so mean batch / hold time is the ceiling any number of
   processes shares (ceiling_appends_per_s).
3. Beside them, measured in the same run on the same server with no ledger: the same statements for a batch of 64
   precomputed entries from one connection (the database's part of a hold), and a one-row commit (the WAL flush).
CPU seconds per append are given for the appending processes and for the PostgreSQL server's processes (all of
them on this machine, read from /proc: the appenders' sessions, the WAL writer, and whatever else the server ran).

--failover: two replicas (`jobgate up --port A/B --data-dir D`, real processes, one PostgreSQL business database and
one PostgreSQL ledger, fresh databases per run); kill -9 of the leader, --kills times (10): each time, seconds from
the kill to the survivor's election (its epoch row) and to its first scheduler cycle as leader (the replicas' own
timestamps, read from /readyz), p50 and max beside the target (5 s) and beside the followers' retry interval
(gateway/leadership.py RETRY_S, the part of the bound that is waiting by design); then the killed replica is
started again as a follower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import calibration, median_round

ORIGIN = "bench.local/ledger"
THREADS = 64
TARGET_APPENDS_PER_S = 5000


def body_1k(t: int, i: int) -> dict[str, object]:
    return {"actor": f"user-{t}", "i": i, "action": "preempt", "pad": "x" * 960}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def ms(x: float) -> float:
    return round(x * 1e3, 3)


# -- one appending process ------------------------------------------------------------------------------------


def worker(url: str, key_file: str, threads: int, seconds: float) -> None:
    """An appending process: open the ledger, say `ready`, wait for `go` on stdin, append from `threads` threads
    for `seconds`, print one JSON line of what it did."""
    from ledger.keys import load_signer
    from ledger.service import Ledger
    from ledger.store import PostgresStore

    store = PostgresStore(url)  # kept at hand for its BatchTimings
    led = Ledger.from_store(store, signer=load_signer(Path(key_file)))
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    lat: list[float] = []
    lock = threading.Lock()
    counts = [0] * threads
    c0 = os.times()
    t_go = time.perf_counter()
    deadline = t_go + seconds

    def run(t: int) -> None:
        mine: list[float] = []
        i = 0
        while (t0 := time.perf_counter()) < deadline:
            led.append("decision", body_1k(t, i))
            mine.append(time.perf_counter() - t0)
            i += 1
        counts[t] = i
        with lock:
            lat.extend(mine)

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    elapsed = time.perf_counter() - t_go
    c1 = os.times()
    timings = list(store.timings)
    print(json.dumps({
        "appends": sum(counts),
        "elapsed_s": elapsed,
        "cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
        "latency_ms_p50": ms(pct(lat, 50)),
        "latency_ms_p99": ms(pct(lat, 99)),
        "batches": len(timings),
        "timings": [[b.wait, b.hold, b.build, b.write, b.commit, b.entries] for b in timings],
    }), flush=True)
    # Open until told: the parent reads the server's CPU while this process's sessions (and their CPU) are there.
    assert sys.stdin.readline().strip() == "close"
    led.close()


# -- the parent -------------------------------------------------------------------------------------------------


def postgres_cpu_s() -> float:
    """CPU seconds used so far by the PostgreSQL server's processes on this machine (/proc, clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index(b"(") + 1 : stat.rindex(b")")]
        if name.startswith(b"postgres"):
            fields = stat[stat.rindex(b")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def fresh_database(server: str) -> str:
    import psycopg
    from psycopg import sql

    name = f"jobgate_bench_replicas_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return server.rsplit("/", 1)[0] + "/" + name


def drop_database(server: str, url: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(url.rsplit("/", 1)[1])))


def run_processes(server: str, key_file: Path, processes: int, seconds: float) -> dict[str, Any]:
    """`processes` appending processes on one fresh ledger, started together; their figures pooled."""
    from ledger.keys import load_signer
    from ledger.verify import verify_store

    url = fresh_database(server)
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        procs = [subprocess.Popen([sys.executable, __file__, "--ledger-worker", url, str(key_file), str(THREADS),
                                   str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(processes)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        pg0 = postgres_cpu_s()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.readline()))
        pg_cpu = postgres_cpu_s() - pg0
        for p in procs:
            p.communicate("close\n", timeout=60)
        verdict = verify_store(url, load_signer(key_file).verifier())
        assert verdict.ok, verdict.message
    finally:
        drop_database(server, url)
    appends = sum(r["appends"] for r in results)
    elapsed = max(r["elapsed_s"] for r in results)
    timings = [t for r in results for t in r["timings"]]
    holds = [t[1] for t in timings]
    entries = sum(t[5] for t in timings)
    mean_batch = entries / len(timings)
    hold_p50 = pct(holds, 50)
    return {
        "processes": processes,
        "appenders_per_process": THREADS,
        "seconds": seconds,
        "appends": appends,
        "appends_per_s": round(appends / elapsed),
        "per_process_appends_per_s": [round(r["appends"] / r["elapsed_s"]) for r in results],
        "latency_ms_p50": max(r["latency_ms_p50"] for r in results),
        "latency_ms_p99": max(r["latency_ms_p99"] for r in results),
        "batches": len(timings),
        "mean_batch": round(mean_batch, 1),
        "head_lock": {
            "hold_ms_p50": ms(hold_p50),
            "hold_ms_p99": ms(pct(holds, 99)),
            "build_ms_p50": ms(pct([t[2] for t in timings], 50)),
            "write_ms_p50": ms(pct([t[3] for t in timings], 50)),
            "commit_ms_p50": ms(pct([t[4] for t in timings], 50)),
            "wait_ms_p50": ms(pct([t[0] for t in timings], 50)),
            "wait_ms_p99": ms(pct([t[0] for t in timings], 99)),
            # The share of the run the head was held: near 1, batches queue for it and processes add nothing.
            "held_fraction": round(sum(holds) / elapsed, 3),
            "ceiling_appends_per_s": round(mean_batch / hold_p50),
        },
        "appender_cpu_us_per_append": round(sum(r["cpu_s"] for r in results) / appends * 1e6, 1),
        "postgres_cpu_us_per_append": round(pg_cpu / appends * 1e6, 1),
        "verified_entries": verdict.size,
    }


def db_only(server: str, batch: int = 64, n: int = 200) -> dict[str, Any]:
    """The database's part of a hold with no ledger around it: the same statements for `batch` precomputed 1 KiB
    entries from one connection, n times; and a one-row commit (the WAL flush), n times."""
    import psycopg

    from ledger.store import _PG_SCHEMA, _PG_WRITE_BATCH

    url = fresh_database(server)
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(_PG_SCHEMA)
            c.execute("SET synchronous_commit = on")
            data = json.dumps(body_1k(0, 0)).encode()
            holds, commits = [], []
            seq = 0
            for _ in range(n):
                rows = [(seq + i, secrets.token_hex(32), data) for i in range(batch)]
                with c.transaction():
                    c.execute("SELECT next_seq FROM ledger_head FOR UPDATE").fetchone()
                    t1 = time.perf_counter()
                    c.execute(_PG_WRITE_BATCH, ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                                [], [], seq + batch, "note", seq + batch, rows[-1][1], b"", "", ""))
                holds.append(time.perf_counter() - t1)
                seq += batch
            c.execute("CREATE TABLE one (n int)")
            c.execute("INSERT INTO one VALUES (0)")
            for _ in range(n):
                t0 = time.perf_counter()
                with c.transaction():
                    c.execute("UPDATE one SET n = n + 1")
                commits.append(time.perf_counter() - t0)
    finally:
        drop_database(server, url)
    return {
        "batch": batch,
        "hold_ms_p50": ms(pct(holds, 50)),
        "hold_ms_p99": ms(pct(holds, 99)),
        "one_row_commit_ms_p50": ms(pct(commits, 50)),
        "one_row_commit_ms_p99": ms(pct(commits, 99)),
        "ceiling_appends_per_s": round(batch / pct(holds, 50)),
    }


def bench_ledger(server: str, rounds: int, seconds: float) -> dict[str, Any]:
    from ledger.keys import NoteSigner, write_signer

    with tempfile.TemporaryDirectory(prefix="jobgate-bench-replicas-") as tmp:
        key_file = Path(tmp) / "ledger.key"
        write_signer(key_file, NoteSigner.generate(ORIGIN))
        taken = []
        for _ in range(rounds):
            one = run_processes(server, key_file, 1, seconds)
            two = run_processes(server, key_file, 2, seconds)
            taken.append({"two_processes": two, "one_process_baseline": one,
                          "ratio_two_to_one": round(two["appends_per_s"] / one["appends_per_s"], 3)})
    best = median_round(taken, lambda r: float(r["ratio_two_to_one"]))
    return {
        **best,
        "db_only_baseline": db_only(server),
        "target_two_processes_appends_per_s": TARGET_APPENDS_PER_S,
        "rounds": {
            "two_processes_appends_per_s": [r["two_processes"]["appends_per_s"] for r in taken],
            "one_process_appends_per_s": [r["one_process_baseline"]["appends_per_s"] for r in taken],
            "ratio_two_to_one": [r["ratio_two_to_one"] for r in taken],
            "hold_ms_p50_two": [r["two_processes"]["head_lock"]["hold_ms_p50"] for r in taken],
        },
        "median_two_processes_appends_per_s": statistics.median(r["two_processes"]["appends_per_s"] for r in taken),
    }


# -- submissions through 1 and 2 replicas ------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"


def haproxy_binary() -> str | None:
    """Debian's HAProxy (in /usr/sbin, off a user's PATH), or one on PATH; None if neither is installed."""
    debian = Path("/usr/sbin/haproxy")
    return shutil.which("haproxy") or (str(debian) if debian.exists() else None)
TARGET_SUBMISSIONS_PER_S = 500
TARGET_CPU_RATIO = 1.15
TARGET_P99_MS_AT_80_PERCENT = 30


class ReplicaSet:
    """N `jobgate up` processes on one fresh PostgreSQL business database and one fresh ledger (init-db), one data
    dir (keys, demo tokens), optionally HAProxy in front with deploy/haproxy/haproxy.cfg as it is. Rate limits are
    lifted in a copy of the policy set: the benchmark measures throughput, not H2 (as bench/gateway.py does)."""

    def __init__(self, server: str, n: int, haproxy: bool) -> None:
        self.server, self.n, self.with_haproxy = server, n, haproxy
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.lb_port = 0
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.databases: list[str] = []

    async def __aenter__(self) -> ReplicaSet:
        from bench.gateway import wait_ready
        from gateway.demo import prepare_demo
        from gateway.settings import Settings
        from ledger.admin import init_db

        self.tmp = Path(tempfile.mkdtemp(prefix="jobgate-bench-replicas-"))
        try:
            biz, ledger = fresh_database(self.server), fresh_database(self.server)
            self.databases = [biz, ledger]
            init_db(ledger)
            policies = self.tmp / "policies"
            shutil.copytree(ROOT / "policies", policies)
            data = json.loads((policies / "data.json").read_text())
            data["limits"].update({"calls_per_minute_per_principal": 10**9, "calls_per_minute_per_project": 10**9})
            (policies / "data.json").write_text(json.dumps(data))
            data_dir = self.tmp / "var"
            prepare_demo(Settings(data_dir=data_dir, database_url=biz, ledger_url=ledger, policies_dir=policies))
            env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": biz,
                   "JOBGATE_LEDGER_URL": ledger, "JOBGATE_POLICIES_DIR": str(policies)}
            for i in range(self.n):  # one after the other: the first writes the keys the others read
                port = free_port()
                with (self.tmp / f"replica{i + 1}.log").open("wb") as log:
                    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                                             "--data-dir", str(data_dir)], stdout=log, stderr=subprocess.STDOUT,
                                            env=env)
                self.procs.append(proc)
                self.ports.append(port)
                self.tokens = await wait_ready(proc, port, data_dir / "demo-tokens.json")
            if self.with_haproxy:
                self.lb_port, admin = free_port(), free_port()
                hp_env = {**os.environ, "JOBGATE_LB_BIND": f"127.0.0.1:{self.lb_port}",
                          "JOBGATE_LB_ADMIN_BIND": f"127.0.0.1:{admin}",
                          **{f"JOBGATE_REPLICA_{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(self.ports)}}
                if self.n == 1:  # the config names two replicas; a second that is never there stays DOWN
                    hp_env["JOBGATE_REPLICA_2"] = f"127.0.0.1:{free_port()}"
                with (self.tmp / "haproxy.log").open("wb") as log:
                    self.haproxy = subprocess.Popen([haproxy_binary() or "haproxy", "-db", "-f",
                                                     str(HAPROXY_CONFIG)], stdout=log, stderr=subprocess.STDOUT,
                                                    env=hp_env)
                await self._replicas_up(f"http://127.0.0.1:{admin}/stats;csv")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _replicas_up(self, stats: str) -> None:
        import urllib.request

        for _ in range(300):
            try:
                with urllib.request.urlopen(stats, timeout=2) as r:
                    rows = r.read().decode().splitlines()
                up = sum(1 for row in rows if row.startswith("replicas,replica") and ",UP," in row)
                if up == self.n:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.1)
        raise SystemExit("HAProxy did not find the replicas ready: " + (self.tmp / "haproxy.log").read_text())

    async def __aexit__(self, *_: object) -> None:
        for p in [*self.procs, *([self.haproxy] if self.haproxy else [])]:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in [*self.procs, *([self.haproxy] if self.haproxy else [])]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for url in self.databases:
            drop_database(self.server, url)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def backend_pids(self) -> list[int]:
        """The PostgreSQL server processes serving these replicas' connections (both databases)."""
        import psycopg

        names = [u.rsplit("/", 1)[1] for u in self.databases]
        with psycopg.connect(self.server, autocommit=True) as c:
            return [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)", (names,))]

    def cpu(self) -> dict[str, Any]:
        """CPU seconds so far: each replica, each of their PostgreSQL backends (by pid), HAProxy, the whole server."""
        from bench.gateway import cpu_seconds

        def of(pid: int) -> float:
            try:
                return cpu_seconds(pid)
            except (OSError, IndexError):  # a backend that ended meanwhile
                return 0.0

        return {"replicas": [of(p.pid) for p in self.procs],
                "backends": {pid: of(pid) for pid in self.backend_pids()},
                "haproxy": of(self.haproxy.pid) if self.haproxy else 0.0,
                "postgres_all": postgres_cpu_s()}


def cpu_per_request(before: dict[str, Any], after: dict[str, Any], requests: int) -> dict[str, float]:
    """Server CPU per request, in ms: the replicas plus their PostgreSQL backends (a backend opened during the run
    counts from zero); beside it HAProxy's, and every PostgreSQL process on the machine (the WAL writer and
    checkpointer too, but also what other users of the server ran meanwhile)."""
    backends = sum(cpu - before["backends"].get(pid, 0.0) for pid, cpu in after["backends"].items())
    each = [a - b for a, b in zip(after["replicas"], before["replicas"], strict=True)]
    replicas = sum(each)
    per = 1e3 / max(requests, 1)
    return {"server_cpu_ms_per_submission": round((replicas + backends) * per, 3),
            "replicas_cpu_ms": round(replicas * per, 3), "postgres_backends_cpu_ms": round(backends * per, 3),
            # The first replica leads (it started first): the scheduler cycles and chores are its alone.
            "each_replica_cpu_ms": [round(x * per, 3) for x in each],
            "haproxy_cpu_ms": round((after["haproxy"] - before["haproxy"]) * per, 3),
            "postgres_all_processes_cpu_ms": round((after["postgres_all"] - before["postgres_all"]) * per, 3)}


async def capacity(rs: ReplicaSet, ports: list[int], clients: int, seconds: float) -> dict[str, Any]:
    from bench.gateway import closed_loop, submit

    before = rs.cpu()
    result = await closed_loop(ports, rs.tokens["alice"], clients, seconds, submit)
    return {**result, **cpu_per_request(before, rs.cpu(), int(result["requests"]))}


async def idle(rs: ReplicaSet, seconds: float = 3.0) -> dict[str, Any]:
    """With no requests: each replica's CPU per second, and the jobs waiting. The submitted jobs stay pending (no
    node agents), and the leader's scheduler cycle (every second) reads them all, so its cost grows with the run."""
    import psycopg

    before = rs.cpu()
    await asyncio.sleep(seconds)
    after = rs.cpu()
    with psycopg.connect(rs.databases[0], autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM jobs WHERE state = 'pending'").fetchone()
    return {"each_replica_cpu_ms_per_s": [round((a - b) * 1e3 / seconds, 1)
                                          for a, b in zip(after["replicas"], before["replicas"], strict=True)],
            "pending_jobs": row[0] if row else None}


async def submissions_round(server: str, clients: int, seconds: float) -> dict[str, Any]:
    """1 replica (clients straight to it), then 2 on fresh databases: clients spread straight over both (the
    figure beside the 1-replica baseline: same client path), then through HAProxy (what production runs); open
    loops at 80% of each capacity through the same path."""
    from bench.gateway import closed_loop, open_loop, submit

    out: dict[str, Any] = {}
    async with ReplicaSet(server, 1, haproxy=False) as one:
        await closed_loop(one.ports, one.tokens["alice"], clients, 1.0, submit)  # warm-up
        cap1 = await capacity(one, one.ports, clients, seconds)
        at80 = await open_loop(one.ports, one.tokens["alice"], clients, seconds, 0.8 * cap1["per_second"], submit)
        out["one_replica"] = {"capacity": cap1, "at_80_percent": at80, "idle_after": await idle(one)}
    async with ReplicaSet(server, 2, haproxy=True) as two:
        await closed_loop(two.ports, two.tokens["alice"], clients, 1.0, submit)
        spread = await capacity(two, two.ports, clients, seconds)
        via = await capacity(two, [two.lb_port], clients, seconds)
        at80 = await open_loop([two.lb_port], two.tokens["alice"], clients, seconds, 0.8 * via["per_second"], submit)
        out["two_replicas"] = {"capacity_spread": spread, "capacity_through_haproxy": via,
                               "at_80_percent_through_haproxy": at80, "idle_after": await idle(two)}
    out["throughput_two_to_one"] = round(spread["per_second"] / cap1["per_second"], 3)
    out["coordination_overhead_cpu_two_to_one"] = round(
        spread["server_cpu_ms_per_submission"] / cap1["server_cpu_ms_per_submission"], 3)
    return out


def bench_submissions(server: str, rounds: int, clients: int, seconds: float) -> dict[str, Any]:
    try:
        import uvloop

        uvloop.install()  # the load generator's side of the shared cores kept small (as bench/gateway.py)
    except ImportError:
        pass
    taken = [asyncio.run(submissions_round(server, clients, seconds)) for _ in range(rounds)]
    best = median_round(taken, lambda r: float(r["coordination_overhead_cpu_two_to_one"]))
    return {
        **best,
        "clients": clients,
        "targets": {"two_replicas_submissions_per_s": TARGET_SUBMISSIONS_PER_S,
                    "coordination_overhead_cpu_two_to_one": TARGET_CPU_RATIO,
                    "p99_ms_at_80_percent": TARGET_P99_MS_AT_80_PERCENT},
        "rounds": {
            "one_replica_per_s": [r["one_replica"]["capacity"]["per_second"] for r in taken],
            "two_replicas_spread_per_s": [r["two_replicas"]["capacity_spread"]["per_second"] for r in taken],
            "two_replicas_haproxy_per_s": [r["two_replicas"]["capacity_through_haproxy"]["per_second"]
                                           for r in taken],
            "coordination_overhead_cpu_two_to_one": [r["coordination_overhead_cpu_two_to_one"] for r in taken],
            "p99_ms_at_80_percent_one": [r["one_replica"]["at_80_percent"]["p99_ms"] for r in taken],
            "p99_ms_at_80_percent_two_haproxy": [r["two_replicas"]["at_80_percent_through_haproxy"]["p99_ms"]
                                                 for r in taken],
        },
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAILOVER_TARGET_S = 5.0


def bench_failover(server: str, kills: int) -> dict[str, Any]:
    _here = Path(__file__).resolve().parent
    sys.path[:0] = [str(_here.parent / "tests"), str(_here.parent / "tests" / "e2e")]
    from replicas_testkit import Replicas, failover, seed_demo_without_agents

    from gateway.leadership import RETRY_S

    urls = [fresh_database(server), fresh_database(server)]
    tmp = Path(tempfile.mkdtemp(prefix="jobgate-failover-"))
    replicas = Replicas(tmp / "var", *urls)
    # The demo's tokens, without its agents: /readyz tells the leader's epoch and times only to a valid token.
    seed_demo_without_agents(tmp / "var", *urls)
    rounds: list[dict[str, float]] = []
    try:
        leader = replicas.start(demo=False)
        survivor = replicas.start(demo=False)
        for _ in range(kills):
            took = failover(replicas, leader, survivor)
            rounds.append({k: round(v, 3) for k, v in took.items()})
            replicas.replicas.remove(leader)
            leader, survivor = survivor, replicas.start(demo=False)  # the killed one comes back, as a follower
    finally:
        replicas.stop()
        for url in urls:
            drop_database(server, url)
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(key: str) -> dict[str, float]:
        xs = [r[key] for r in rounds]
        return {"p50_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3)}

    return {"kills": kills, "target_s": FAILOVER_TARGET_S, "baseline_retry_interval_s": RETRY_S,
            "to_new_leader": summary("elected_s"), "to_first_cycle": summary("first_cycle_s"),
            "within_target": all(r["first_cycle_s"] <= FAILOVER_TARGET_S for r in rounds), "rounds": rounds}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--ledger-worker":
        url, key_file, threads, secs = sys.argv[2:6]
        worker(url, key_file, int(threads), float(secs))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--ledger", action="store_true", help="ledger appends from several processes (PostgreSQL)")
    ap.add_argument("--submissions", action="store_true",
                    help="authorised submissions through 1 and 2 replicas (PostgreSQL, HAProxy)")
    ap.add_argument("--clients", type=int, default=32, help="keep-alive connections of the submissions' load")
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each with its own 1-process baseline")
    ap.add_argument("--seconds", type=float, default=None,
                    help="length of each appending run or load measure (default 5, quick 2)")
    ap.add_argument("--failover", action="store_true", help="kill -9 of the leader replica, --kills times")
    ap.add_argument("--kills", type=int, default=10, help="with --failover: how many kills (default 10)")
    args = ap.parse_args()
    if not (args.ledger or args.submissions or args.failover):  # `make bench`: every measure
        args.ledger = args.submissions = args.failover = True
    server = os.environ.get("JOBGATE_BENCH_PG_URL") or os.environ.get("JOBGATE_TEST_PG_URL")
    if not server:
        ap.error("set JOBGATE_BENCH_PG_URL (or JOBGATE_TEST_PG_URL) to a PostgreSQL server URL")
    if args.submissions and haproxy_binary() is None:
        ap.error("the submission measure puts HAProxy in front of the replicas and it is not installed"
                 " (apt-get install haproxy)")
    out: dict[str, Any] = {"benchmark": "replicas", "quick": args.quick, "cpus": os.cpu_count(),
                           "loadavg_start": os.getloadavg(), "machine": calibration()}
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    if args.ledger:
        out["ledger"] = bench_ledger(server, 1 if args.quick else args.rounds, seconds)
    if args.submissions:
        out["submissions"] = bench_submissions(server, 1 if args.quick else args.rounds, args.clients, seconds)
    if args.failover:
        out["failover"] = bench_failover(server, 2 if args.quick else args.kills)
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
