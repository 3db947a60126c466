"""Ledger benchmarks; prints one JSON object. `python bench/ledger.py [--quick]`.

1. Durable appends: 64 threads, 1 KiB bodies, SQLite file, vs raw sqlite3 inserts of the same
   bytes in durable batches of 256 (WAL, synchronous=FULL) measured in the same run.
2. Proof generation on a 1,000,000-leaf tree built from synthetic leaf hashes.
3. Verification of N stored entries vs plain hashlib.sha256 over the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger.entry import encode, prepare
from ledger.keys import NoteSigner
from ledger.merkle import MerkleTree, leaf_hash
from ledger.note import Checkpoint, sign_checkpoint
from ledger.service import Ledger
from ledger.store import SqliteStore
from ledger.verify import verify_store

ORIGIN = "bench.local/ledger"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def body_1k(t: int, i: int) -> dict[str, object]:
    return {"actor": f"user-{t}", "i": i, "action": "preempt", "pad": "x" * 960}


def bench_append(tmp: Path, threads: int, per_thread: int) -> dict[str, object]:
    signer = NoteSigner.generate(ORIGIN)
    led = Ledger.open(f"sqlite:///{tmp}/append.db", signer=signer)
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
    t0 = time.perf_counter()
    for th in ths:
        th.join()
    elapsed = time.perf_counter() - t0
    n = threads * per_thread
    stats = led.stats
    led.close()
    # Baseline: the same stored bytes, raw sqlite3, durable batches of 256.
    rows = []
    conn = sqlite3.connect(f"{tmp}/append.db")
    rows = conn.execute("SELECT seq, hash, data FROM ledger_entries ORDER BY seq").fetchall()
    conn.close()
    base = sqlite3.connect(f"{tmp}/baseline.db", isolation_level=None)
    base.execute("PRAGMA journal_mode=WAL")
    base.execute("PRAGMA synchronous=FULL")
    base.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, hash TEXT, data BLOB)")
    t0 = time.perf_counter()
    for i in range(0, len(rows), 256):
        base.execute("BEGIN")
        base.executemany("INSERT INTO t VALUES (?, ?, ?)", rows[i : i + 256])
        base.execute("COMMIT")
    base_elapsed = time.perf_counter() - t0
    base.close()
    rate = n / elapsed
    base_rate = n / base_elapsed
    return {
        "threads": threads,
        "entries": n,
        "entries_per_s": round(rate),
        "baseline_raw_sqlite_batch256_entries_per_s": round(base_rate),
        "ratio_to_baseline": round(rate / base_rate, 3),
        "latency_ms_p50": round(pct(lat, 50) * 1e3, 3),
        "latency_ms_p99": round(pct(lat, 99) * 1e3, 3),
        "batches": stats.batches,
        "mean_batch": round(n / stats.batches, 1),
        "max_batch": stats.max_batch,
    }


def bench_proofs(n: int, samples: int) -> dict[str, object]:
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
    t0 = time.perf_counter()
    for i in range(samples):
        tree.append(leaf_hash(i.to_bytes(8, "big")))
    append_us = (time.perf_counter() - t0) / samples * 1e6
    return {
        "tree_size": n,
        "build_s": round(build, 2),
        "inclusion_ms_p50": round(pct(inc, 50) * 1e3, 4),
        "inclusion_ms_p99": round(pct(inc, 99) * 1e3, 4),
        "consistency_ms_p50": round(pct(con, 50) * 1e3, 4),
        "consistency_ms_p99": round(pct(con, 99) * 1e3, 4),
        "tree_append_us_mean": round(append_us, 2),
    }


def bench_verify(tmp: Path, n: int, deep: bool) -> dict[str, object]:
    signer = NoteSigner.generate(ORIGIN)
    store = SqliteStore(tmp / "verify.db")
    tree = MerkleTree()
    prev = "0" * 64
    batch, data = 256, []
    for start in range(0, n, batch):
        rows = []
        for seq in range(start, min(n, start + batch)):
            raw = encode(prepare("decision", body_1k(seq % 64, seq), None), seq, "2025-01-01T00:00:00.000000Z", prev)
            prev = hashlib.sha256(raw).hexdigest()
            rows.append((seq, prev, raw))
            tree.append(leaf_hash(raw))
            data.append(raw)
        note = sign_checkpoint(Checkpoint(ORIGIN, tree.size, tree.root()), signer)
        store.write_batch(rows, {}, (tree.size, note))
    store.close()
    t0 = time.perf_counter()
    verdict = verify_store(f"sqlite:///{tmp}/verify.db", signer.verifier())
    elapsed = time.perf_counter() - t0
    assert verdict.ok, verdict.message
    t0 = time.perf_counter()
    for raw in data:
        hashlib.sha256(raw).digest()
    base = time.perf_counter() - t0
    extra: dict[str, object] = {}
    if deep:
        t0 = time.perf_counter()
        verify_store(f"sqlite:///{tmp}/verify.db", signer.verifier(), deep=True)
        extra["deep_entries_per_s"] = round(n / (time.perf_counter() - t0))
    return {
        "entries": n,
        "checkpoints": verdict.checkpoints,
        "entries_per_s": round(n / elapsed),
        "baseline_sha256_entries_per_s": round(n / base),
        "ratio_to_baseline": round(base / elapsed, 3),
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller run (a few seconds)")
    ap.add_argument("--deep", action="store_true", help="also time verify(deep=True) (slow: full RFC 8785 re-encode)")
    args = ap.parse_args()
    q = args.quick
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = {
            "benchmark": "ledger",
            "quick": q,
            "cpus": os.cpu_count(),
            "append_sqlite": bench_append(tmp, 64, 40 if q else 400),
            "proofs": bench_proofs(100_000 if q else 1_000_000, 500 if q else 5000),
            "verify": bench_verify(tmp, 20_000 if q else 200_000, args.deep),
            "targets": {"appends_per_s": 20000, "verify_entries_per_s": 250000, "proof_ms_p99": 1.0},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
