"""Replica benchmarks; prints one JSON object. `python bench/replicas.py --ledger [--quick]`, `--failover`.

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
import json
import os
import secrets
import shutil
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


FAILOVER_TARGET_S = 5.0


def bench_failover(server: str, kills: int) -> dict[str, Any]:
    _here = Path(__file__).resolve().parent
    sys.path[:0] = [str(_here.parent / "tests"), str(_here.parent / "tests" / "e2e")]
    from replicas_testkit import Replicas, failover

    from gateway.leadership import RETRY_S

    urls = [fresh_database(server), fresh_database(server)]
    tmp = Path(tempfile.mkdtemp(prefix="jobgate-failover-"))
    replicas = Replicas(tmp / "var", *urls)
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
        url, key_file, threads, seconds = sys.argv[2:6]
        worker(url, key_file, int(threads), float(seconds))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--ledger", action="store_true", help="ledger appends from several processes (PostgreSQL)")
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each with its own 1-process baseline")
    ap.add_argument("--seconds", type=float, default=None, help="appending time per run (default 5, quick 2)")
    ap.add_argument("--failover", action="store_true", help="kill -9 of the leader replica, --kills times")
    ap.add_argument("--kills", type=int, default=10, help="with --failover: how many kills (default 10)")
    args = ap.parse_args()
    if not (args.ledger or args.failover):
        ap.error("say what to measure: --ledger and/or --failover")
    server = os.environ.get("JOBGATE_BENCH_PG_URL") or os.environ.get("JOBGATE_TEST_PG_URL")
    if not server:
        ap.error("set JOBGATE_BENCH_PG_URL (or JOBGATE_TEST_PG_URL) to a PostgreSQL server URL")
    out: dict[str, Any] = {"benchmark": "replicas", "quick": args.quick, "cpus": os.cpu_count(),
                           "loadavg_start": os.getloadavg(), "machine": calibration()}
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    if args.ledger:
        out["ledger"] = bench_ledger(server, 1 if args.quick else args.rounds, seconds)
    if args.failover:
        out["failover"] = bench_failover(server, 2 if args.quick else args.kills)
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
