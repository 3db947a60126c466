"""Ledger benchmarks; prints one JSON object. `python bench/ledger.py [--quick]`.

Each figure sits beside a baseline measured in the same run, on the same machine:
1. Durable appends, closed loop: 64 threads, 1 KiB bodies, on SQLite (and PostgreSQL when
   JOBGATE_BENCH_PG_URL or JOBGATE_TEST_PG_URL names a server) vs raw durable inserts of the same
   bytes in batches of 256 into the same kind of database.
2. Append latency, open loop: appends offered at 10,000/s on a schedule (latency counts from the
   scheduled instant, so queueing is included); p50/p99, beside the same schedule with no ledger.
   Both in rounds (--rounds, each with its own baseline): the median round is reported with every round's
   figure (bench.machine.median_round says why).
   Beside 1, its two parts, measured apart: the ledger's own work with no thread hand-off (one caller
   appending 64 entries at a time), and the hand-off alone (64 threads passing appends to a writer that
   does nothing with them, woken as Ledger._wake wakes them). Their CPU per entry, spent mostly holding
   CPython's one interpreter lock, bounds what 64 appending threads can reach in one process.
3. Proof generation on a 1,000,000-leaf tree.
4. Offline verification of an N-entry export bundle (1,000,000 unless --quick; --verify-entries N; the fastest of
   --verify-repeat runs) vs hashlib SHA-256 over the same entry bytes in this process, in wall and in CPU
   seconds per entry; and of a SQLite store.
The machine's load average is printed too: other processes share these cores.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import resource
import secrets
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import calibration, median_round
from ledger.bundle import FORMAT, open_bundle
from ledger.entry import encode, prepare, tail_bytes
from ledger.fastscan import tasks_for, workers_for
from ledger.keys import NoteSigner
from ledger.merkle import MerkleTree, leaf_hash
from ledger.note import Checkpoint, sign_checkpoint
from ledger.service import Ledger
from ledger.store import SqliteStore
from ledger.verify import verify_material, verify_store

ORIGIN = "bench.local/ledger"


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the verifier's worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _switches() -> int:
    """Context switches of this process's threads so far, voluntary and not: with many appenders on few
    cores, thread hand-offs (each wake-up, each wait for the GIL) cost more CPU than the appends do."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def body_1k(t: int, i: int) -> dict[str, object]:
    return {"actor": f"user-{t}", "i": i, "action": "preempt", "pad": "x" * 960}


def closed_loop(url: str, threads: int, per_thread: int) -> tuple[dict[str, Any], Ledger]:
    led = Ledger.open(url, signer=NoteSigner.generate(ORIGIN))
    lat: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        mine = []
        barrier.wait()
        for i in range(per_thread):
            t0 = time.perf_counter()
            led.append("decision", body_1k(t, i))
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    barrier.wait()
    c0, s0 = _cpu(), _switches()
    t0 = time.perf_counter()
    for th in ths:
        th.join()
    elapsed = time.perf_counter() - t0
    cpu, switches = _cpu() - c0, _switches() - s0
    n = threads * per_thread
    s = led.stats
    return {
        "threads": threads,
        "entries": n,
        "entries_per_s": round(n / elapsed),
        "cpu_us_per_entry": round(cpu / n * 1e6, 1),
        "context_switches_per_entry": round(switches / n, 2),
        "latency_ms_p50": round(pct(lat, 50) * 1e3, 3),
        "latency_ms_p99": round(pct(lat, 99) * 1e3, 3),
        "batches": s.batches,
        "mean_batch": round(n / s.batches, 1),
        "max_batch": s.max_batch,
        "batches_held_open": s.held_open,
        "batches_lingered": s.lingered,
    }, led


def in_rounds(rounds: int, measure: Callable[[int], dict[str, Any]], key: str) -> dict[str, Any]:
    """measure(round) `rounds` times: the median round by `key`, with every round's `key` figure beside it."""
    taken = [measure(r) for r in range(rounds)]
    return {**median_round(taken, lambda r: float(r[key])), "rounds": {key: [r[key] for r in taken]}}


def bench_append_sqlite(tmp: Path, threads: int, per_thread: int, rnd: int = 0) -> dict[str, Any]:
    db = tmp / f"append-{rnd}.db"
    res, led = closed_loop(f"sqlite:///{db}", threads, per_thread)
    led.close()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq").fetchall()
    conn.close()
    # The same database file, engine settings and bytes; just no ledger around the inserts.
    base = sqlite3.connect(db, isolation_level=None)
    base.execute("PRAGMA journal_mode=WAL")
    base.execute("PRAGMA synchronous=FULL")
    base.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, hash TEXT, data BLOB)")
    t0 = time.perf_counter()
    for i in range(0, len(rows), 256):
        base.execute("BEGIN")
        base.executemany("INSERT INTO t VALUES (?, ?, ?)", rows[i : i + 256])
        base.execute("COMMIT")
    base_rate = len(rows) / (time.perf_counter() - t0)
    base.close()
    res["baseline_raw_sqlite_batch256_entries_per_s"] = round(base_rate)
    res["ratio_to_baseline"] = round(res["entries_per_s"] / base_rate, 3)
    return res


def bench_append_parts(tmp: Path, threads: int, per_thread: int) -> dict[str, Any]:
    """Item 1's two costs apart (see the module docstring)."""
    led = Ledger.open(f"sqlite:///{tmp / 'parts.db'}", signer=NoteSigner.generate(ORIGIN))
    batch = [("decision", body_1k(0, i), None) for i in range(64)]
    rounds = threads * per_thread // 64
    led.append_many(batch)
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(rounds):
        led.append_many(batch)
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    led.close()
    n = rounds * 64
    own = {"entries_per_s": round(n / elapsed), "cpu_us_per_entry": round(cpu / n * 1e6, 1)}
    return {"ledger_work_one_caller_batches_of_64": own, "thread_handoff_only": handoff(threads, per_thread)}


def handoff(threads: int, per_thread: int) -> dict[str, Any]:
    """Threads queue appends for a writer that does nothing but wake them, one after another (a baton)."""
    queue: list[list[Any]] = []  # [lock, next]
    qlock, kick = threading.Lock(), threading.Lock()
    kick.acquire()
    state = {"idle": True, "done": False}

    def writer() -> None:
        while True:
            with qlock:
                batch, queue[:] = queue[:], []
                if not batch:
                    state["idle"] = True
            if not batch:
                if state["done"]:
                    return
                kick.acquire()
                continue
            for a, b in itertools.pairwise(batch):
                a[1] = b
            batch[0][0].release()

    def appender() -> None:
        for _ in range(per_thread):
            me: list[Any] = [threading.Lock(), None]
            me[0].acquire()
            with qlock:
                queue.append(me)
                if state["idle"]:
                    state["idle"] = False
                    kick.release()
            me[0].acquire()
            if me[1] is not None:
                me[1][0].release()

    w = threading.Thread(target=writer)
    w.start()
    ths = [threading.Thread(target=appender) for _ in range(threads)]
    c0, t0 = _cpu(), time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    with qlock:
        state["done"] = True
        if state["idle"]:
            state["idle"] = False
            kick.release()
    w.join()
    n = threads * per_thread
    return {"entries_per_s": round(n / elapsed), "cpu_us_per_entry": round(cpu / n * 1e6, 1)}


def bench_append_pg(server: str, threads: int, per_thread: int) -> dict[str, Any]:
    import psycopg
    from psycopg import sql

    name = f"jobgate_bench_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = server.rsplit("/", 1)[0] + "/" + name
    try:
        res, led = closed_loop(url, threads, per_thread)
        led.close()
        with psycopg.connect(url, autocommit=True) as c:
            rows = c.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq").fetchall()
            c.execute("SET synchronous_commit = on")
            c.execute("CREATE TABLE t (seq BIGINT PRIMARY KEY, hash TEXT, data BYTEA)")
            t0 = time.perf_counter()
            for i in range(0, len(rows), 256):
                with c.transaction(), c.cursor() as cur:
                    cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", rows[i : i + 256])
            base_rate = len(rows) / (time.perf_counter() - t0)
    finally:
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    res["baseline_raw_pg_batch256_entries_per_s"] = round(base_rate)
    res["ratio_to_baseline"] = round(res["entries_per_s"] / base_rate, 3)
    return res


def offer(append: Any, rate: float, seconds: float, workers: int) -> tuple[list[float], float, int, float]:
    """Call append(w, j) on a schedule of `rate` calls a second from `workers` threads; returns the
    latencies (from each call's scheduled instant, so queueing counts), CPU seconds, context switches
    and the achieved rate."""
    total = int(rate * seconds)
    lat: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2

    def worker(w: int) -> None:
        mine = []
        for j in range(w, total, workers):
            due = start + j / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            append(w, j)
            mine.append(time.perf_counter() - due)
        with lock:
            lat.extend(mine)

    ths = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    c0, s0 = _cpu(), _switches()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    achieved = total / (time.perf_counter() - start)
    return lat, _cpu() - c0, _switches() - s0, achieved


def bench_open_loop(tmp: Path, rate: float, seconds: float, workers: int = 128, rnd: int = 0) -> dict[str, Any]:
    led = Ledger.open(f"sqlite:///{tmp}/openloop-{rnd}.db", signer=NoteSigner.generate(ORIGIN))
    lat, cpu, switches, achieved = offer(lambda w, j: led.append("decision", body_1k(w, j)), rate, seconds, workers)
    s = led.stats
    led.close()
    # The baseline: the same schedule, threads and bodies with no ledger, which is what this machine's
    # scheduler and the interpreter deliver at best. On a shared virtual machine its p99 alone can pass
    # 10 ms (the process is paused now and then), and a ledger at this rate cannot answer faster than it.
    floor, _, _, _ = offer(body_1k, rate, seconds, workers)
    total = len(lat)
    return {
        "offered_per_s": rate,
        "achieved_per_s": round(achieved),
        "appends": total,
        # Beside the latencies, which other processes on the machine move a lot: the work per append.
        "cpu_us_per_entry": round(cpu / total * 1e6, 1),
        "context_switches_per_entry": round(switches / total, 2),
        "latency_ms_p50": round(pct(lat, 50) * 1e3, 3),
        "latency_ms_p99": round(pct(lat, 99) * 1e3, 3),
        "latency_ms_max": round(max(lat) * 1e3, 3),
        "mean_batch": round(total / s.batches, 1),
        "batches_held_open": s.held_open,
        "batches_lingered": s.lingered,
        "baseline_no_ledger_latency_ms_p50": round(pct(floor, 50) * 1e3, 3),
        "baseline_no_ledger_latency_ms_p99": round(pct(floor, 99) * 1e3, 3),
        "baseline_no_ledger_latency_ms_max": round(max(floor) * 1e3, 3),
    }


def bench_proofs(n: int, samples: int) -> dict[str, Any]:
    leaves = bytearray(os.urandom(32 * n))
    t0 = time.perf_counter()
    tree = MerkleTree.from_leaf_hashes(leaves)
    build = time.perf_counter() - t0
    rnd = random.Random(1)
    inc, con = [], []
    for _ in range(samples):
        size = rnd.randint(n // 2, n)
        idx = rnd.randrange(size)
        t0 = time.perf_counter()
        tree.inclusion_proof(idx, size)
        inc.append(time.perf_counter() - t0)
        old = rnd.randint(1, size)
        t0 = time.perf_counter()
        tree.consistency_proof(old, size)
        con.append(time.perf_counter() - t0)
    return {
        "tree_size": n,
        "build_s": round(build, 2),
        "inclusion_ms_p50": round(pct(inc, 50) * 1e3, 4),
        "inclusion_ms_p99": round(pct(inc, 99) * 1e3, 4),
        "consistency_ms_p50": round(pct(con, 50) * 1e3, 4),
        "consistency_ms_p99": round(pct(con, 99) * 1e3, 4),
    }


def make_bundle(path: Path, n: int, signer: NoteSigner, batch: int = 256) -> None:
    """A full export bundle of n 1 KiB decision entries, one signed checkpoint per batch."""
    tree = MerkleTree()
    prev = b"0" * 64
    t = b"2025-01-01T00:00:00.000000Z"
    cps: list[tuple[int, str]] = []
    with open(path, "wb") as f:
        header = {"format": FORMAT, "origin": signer.name, "from_seq": 0, "to_seq": n - 1, "tree_size": n,
                  "keys": [signer.vkey], "exported_at": ""}  # fmt: skip
        f.write(json.dumps(header).encode() + b"\n")
        start = f.tell()
        for lo in range(0, n, batch):
            out, leaves = [], []
            for seq in range(lo, min(n, lo + batch)):
                prep = prepare("decision", body_1k(seq % 64, seq), None)
                tail = tail_bytes(seq, t, prev)
                digest, leaf = prep.hashes(tail)
                prev = digest.encode()
                leaves.append(leaf)
                out.append(b"%d %s %s%s\n" % (seq, prev, prep.head, tail))
            tree.extend(leaves)
            cps.append((tree.size, sign_checkpoint(Checkpoint(signer.name, tree.size, tree.root()), signer)))
            f.write(b"".join(out))
        end = f.tell()
        for size, note in cps:
            f.write(json.dumps({"checkpoint": size, "note": note, "consistency": None}).encode() + b"\n")
        trailer = {"end": FORMAT, "entries": n, "entries_bytes": [start, end], "blobs": 0,
                   "checkpoints": len(cps), "left": [], "right": [], "key_history": []}  # fmt: skip
        f.write(json.dumps(trailer).encode() + b"\n")


def bench_verify_bundle(tmp: Path, n: int, repeat: int = 1) -> dict[str, Any]:
    """Verify an n-entry bundle (repeat times: the fastest run is reported, with its CPU seconds)."""
    signer = NoteSigner.generate(ORIGIN)
    path = tmp / "verify.bundle"
    t0 = time.perf_counter()
    make_bundle(path, n, signer)
    made = time.perf_counter() - t0
    verifier = signer.verifier()
    runs = []
    for _ in range(max(1, repeat)):
        c0 = _cpu()
        t0 = time.perf_counter()
        _, material, f = open_bundle(path)
        try:
            verdict = verify_material(material, verifier)
        finally:
            f.close()
        runs.append((time.perf_counter() - t0, _cpu() - c0))
        assert verdict.ok, verdict.message
    elapsed, cpu = min(runs)
    span = material.entries_span
    raws = []
    with open(path, "rb") as fh:
        fh.readline()
        for _ in range(n):
            raws.append(fh.readline()[:-1].split(b" ", 2)[2])
    sha = hashlib.sha256
    c0 = _cpu()
    t0 = time.perf_counter()
    for raw in raws:
        sha(raw).digest()
    base = time.perf_counter() - t0
    base_cpu = _cpu() - c0
    size = path.stat().st_size
    path.unlink()
    workers = workers_for(n)
    return {
        "entries": n,
        "bundle_mb": round(size / 1e6),
        "checkpoints": verdict.checkpoints,
        "workers": workers,
        "ranges": tasks_for(workers, span[1] - span[0]) if workers > 1 else 1,
        "runs": len(runs),
        "seconds": round(elapsed, 2),
        "cpu_seconds": round(cpu, 2),
        "entries_per_s": round(n / elapsed),
        "baseline_sha256_entries_per_s": round(n / base),
        "ratio_to_baseline": round(base / elapsed, 3),
        # CPU per entry over all processes, against one SHA-256 of the entry: steadier than wall
        # figures on a shared machine (the work, not the cores it got).
        "cpu_us_per_entry": round(cpu / n * 1e6, 2),
        "baseline_sha256_cpu_us_per_entry": round(base_cpu / n * 1e6, 2),
        "bundle_build_s": round(made, 1),
    }


def bench_verify_store(tmp: Path, n: int) -> dict[str, Any]:
    signer = NoteSigner.generate(ORIGIN)
    store = SqliteStore(tmp / "verify.db")
    tree = MerkleTree()
    prev = "0" * 64
    data = []
    for start in range(0, n, 256):
        rows = []
        for seq in range(start, min(n, start + 256)):
            raw = encode(prepare("decision", body_1k(seq % 64, seq), None), seq, "2025-01-01T00:00:00.000000Z", prev)
            prev = hashlib.sha256(raw).hexdigest()
            rows.append((seq, prev, raw))
            tree.append(leaf_hash(raw))
            data.append(raw)
        store.write_batch(rows, {}, (tree.size, sign_checkpoint(Checkpoint(ORIGIN, tree.size, tree.root()), signer)))
    store.close()
    t0 = time.perf_counter()
    verdict = verify_store(f"sqlite:///{tmp}/verify.db", signer.verifier())
    elapsed = time.perf_counter() - t0
    assert verdict.ok, verdict.message
    t0 = time.perf_counter()
    for raw in data:
        hashlib.sha256(raw).digest()
    base = time.perf_counter() - t0
    return {
        "entries": n,
        "entries_per_s": round(n / elapsed),
        "baseline_sha256_entries_per_s": round(n / base),
        "ratio_to_baseline": round(base / elapsed, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller run (seconds, not minutes)")
    ap.add_argument("--only", choices=["append", "latency", "pg", "proofs", "verify"], action="append")
    ap.add_argument("--verify-entries", type=int, help="bundle size to verify (default 100,000 quick, else 1,000,000)")
    ap.add_argument("--verify-repeat", type=int, default=1, help="verify this many times; the fastest counts")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of each append measure, baseline beside it in each; the median round is reported")
    args = ap.parse_args()
    q = args.quick
    only = set(args.only or ["append", "latency", "pg", "proofs", "verify"])
    pg = os.environ.get("JOBGATE_BENCH_PG_URL") or os.environ.get("JOBGATE_TEST_PG_URL")
    out: dict[str, Any] = {"benchmark": "ledger", "quick": q, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                           "machine": calibration()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rounds = 1 if q else args.rounds
        if "append" in only:
            out["append_sqlite"] = in_rounds(rounds, lambda r: bench_append_sqlite(tmp, 64, 60 if q else 400, r),
                                             "ratio_to_baseline")
            out["append_sqlite_parts"] = bench_append_parts(tmp, 64, 60 if q else 400)
        if "latency" in only:
            out["append_latency_sqlite_open_loop"] = in_rounds(
                rounds, lambda r: bench_open_loop(tmp, 10_000, 1.0 if q else 3.0, rnd=r), "latency_ms_p99")
        if "pg" in only and pg:
            out["append_postgresql"] = in_rounds(rounds, lambda r: bench_append_pg(pg, 64, 40 if q else 200),
                                                 "ratio_to_baseline")
        if "proofs" in only:
            out["proofs"] = bench_proofs(100_000 if q else 1_000_000, 500 if q else 5000)
        if "verify" in only:
            n_verify = args.verify_entries or (100_000 if q else 1_000_000)
            out["verify_bundle"] = bench_verify_bundle(tmp, n_verify, args.verify_repeat)
            out["verify_sqlite_store"] = bench_verify_store(tmp, 20_000 if q else 200_000)
    out["loadavg_end"] = os.getloadavg()
    out["targets"] = {
        "appends_per_s": 20000,
        "append_ratio": 0.3,
        "append_p99_ms_at_10k_offered": 10,
        "verify_entries_per_s": 250000,
        "proof_ms_p99": 1.0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
