"""What sharing state between replicas costs (issue 28); prints one JSON object. `python bench/replica_state.py`.

On the PostgreSQL server JOBGATE_BENCH_PG_URL or JOBGATE_TEST_PG_URL names (a fresh database per run):
1. The policy check every decision makes on a replica (gateway/decisions/policy_sync.py: one read of the row that
   names the set in force and the count of role binding changes), beside the same transaction without it (the
   baseline: a business transaction doing one SELECT 1), wall and CPU per transaction, median of --rounds.
2. How long a signal takes from the commit of the transaction that sent it to the handler in another listener
   (gateway/store/signals.py: LISTEN/NOTIFY), beside a SELECT 1 round trip on an open connection (the baseline:
   the least a message between two sessions can cost). This is the delay before a token revoked through one
   replica stops working on another.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from gateway.decisions.policy.engine import EmbeddedEngine
from gateway.decisions.policy_sync import PolicySync
from gateway.store.db import Database
from gateway.store.schema import create_schema
from gateway.store.signals import Signals


class _Engine:
    """Stands in for the policy engine: the check compares its hash, and the bindings never change here."""

    policy_hash = "0" * 64

    def replace_bindings(self, _bindings: object) -> None:
        pass


def _per_transaction(db: Database, check: Any, n: int, rounds: int) -> dict[str, float]:
    runs = []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            with db.transaction() as session:
                session.execute(text("SELECT 1"))
                check(session)
        runs.append(((time.perf_counter() - wall) / n * 1e3, (time.process_time() - cpu) / n * 1e3))
    return {"wall_ms": round(statistics.median(r[0] for r in runs), 4),
            "cpu_ms": round(statistics.median(r[1] for r in runs), 4)}


def _signal_latency(db: Database, url: str, n: int) -> dict[str, float]:
    sender, listener = Signals(url, replica="bench-a"), Signals(url, replica="bench-b")
    arrived: dict[int, float] = {}
    got = threading.Event()

    def on(value: Any) -> None:
        arrived[int(value)] = time.perf_counter()
        got.set()

    listener.on("bench", on)
    listener.start()
    if not listener.wait_connected(10):
        raise SystemExit("the listener did not connect")
    samples = []
    try:
        for i in range(n):
            got.clear()
            with db.transaction() as session:
                sender.publish(session, "bench", i)
                session.flush()
                committed_from = time.perf_counter()  # just before COMMIT is sent
            if not got.wait(5):
                raise SystemExit(f"signal {i} never arrived")
            samples.append((arrived[i] - committed_from) * 1e3)
    finally:
        listener.close()
    samples.sort()
    return {"p50_ms": round(samples[len(samples) // 2], 3), "p99_ms": round(samples[int(len(samples) * 0.99)], 3),
            "max_ms": round(samples[-1], 3)}


def _round_trip(db: Database, n: int) -> dict[str, float]:
    with db.engine.connect() as conn:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            conn.exec_driver_sql("SELECT 1").all()
            samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    return {"p50_ms": round(samples[len(samples) // 2], 3), "p99_ms": round(samples[int(len(samples) * 0.99)], 3),
            "max_ms": round(samples[-1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=2000, help="per round of the policy check")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--signals", type=int, default=300)
    args = parser.parse_args()
    server = os.environ.get("JOBGATE_BENCH_PG_URL") or os.environ.get("JOBGATE_TEST_PG_URL")
    if not server:
        raise SystemExit("set JOBGATE_BENCH_PG_URL (or JOBGATE_TEST_PG_URL) to a PostgreSQL server")
    import psycopg

    name = f"jobgate_bench_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.rsplit("/", 1)[0] + "/" + name
    try:
        db = Database(url)
        create_schema(db.engine)
        sync = PolicySync(Signals(url), threading.RLock())
        with db.transaction() as session:
            sync.publish_set(session, _Engine.policy_hash, "bench", datetime.now(UTC))
        engine = cast(EmbeddedEngine, _Engine())
        baseline = _per_transaction(db, lambda _s: None, args.transactions, args.rounds)
        checked = _per_transaction(db, lambda s: sync.check(lambda: engine, s), args.transactions, args.rounds)
        print(json.dumps({
            "policy_check_per_decision": {
                "baseline_transaction": baseline, "with_check": checked,
                "check_cost": {"wall_ms": round(checked["wall_ms"] - baseline["wall_ms"], 4),
                               "cpu_ms": round(checked["cpu_ms"] - baseline["cpu_ms"], 4)}},
            "signal_commit_to_handler": _signal_latency(db, url, args.signals),
            "baseline_select1_round_trip": _round_trip(db, args.signals),
        }, indent=2))
        db.close()
    finally:
        time.sleep(0.6)  # the listener's thread leaves within its poll
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
