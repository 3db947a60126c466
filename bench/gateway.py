"""End-to-end authorised mutations over real HTTP, beside a no-op endpoint of the same app (issue 5).

Starts the gateway (SQLite, embedded Rego, no node agents) in a subprocess on a free port and drives it from
this process over 32 keep-alive connections, with a minimal HTTP/1.1 client on asyncio streams so that the
load generator, which shares the two cores, takes as little CPU from the server as it can.

Endpoints:
- `noop`: an authenticated GET that returns at once (the HTTP + framework + token check floor);
- `submit`: POST /v1/jobs — token check, decision, durable ledger append, DB commit;
- `approve`: POST /v1/approvals/{id}/approve — re-decision, execution and ledger in one transaction.

Two measures per endpoint:
- capacity: every connection sends its next request as soon as the last one answers (closed loop);
- latency at an offered rate (open loop): requests are due at fixed intervals and spread over the
  connections; each latency counts from when the request was due, so time spent waiting for a free
  connection is included (no coordinated omission). A closed loop of 32 clients cannot show a p99 below
  32 / throughput, so the p99 targets are read at the target rate (submissions: also at half the measured
  capacity; approvals: at a person's pace, then as fast as 32 approvers can go).
Capacity figures also give the server's CPU time per request, which bounds what one gateway process can
serve on this machine, and its context switches per request (hand-offs between its threads). Approvals run
on a second fresh gateway whose queue length is set (--queued): every decision on an existing job records
the whole queue (H3), so its cost grows with the queue. Both gateways run without the scheduler's loop;
--with-scheduler measures the approvals again on a third whose loop runs, as `jobgate up` runs it.

Each measure is taken in rounds (--rounds), the no-op and the mutation side by side in each, and the round
with the median figure is reported beside every round's figures (bench.machine.median_round says why).
Prints one JSON object. Usage: python bench/gateway.py [--only submissions|approvals] [--seconds 5]
[--clients 32] [--rate 500] [--queued 1000] [--rounds 3] [--with-scheduler]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# This file is named like the package it measures: let `import gateway` find the package, not this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.machine import calibration, median_round  # noqa: E402
from gateway.api.deps import Ctx  # noqa: E402  (resolved by FastAPI from this module's globals)

Response = tuple[int, bytes]


def serve(data_dir: Path, policies: Path, port: int, scheduler: bool) -> None:
    """Child process: seed the demo cast and serve the app with an added no-op route (and the scheduler's loop
    if `scheduler`, as `jobgate up` runs it)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.demo import prepare_demo
    from gateway.settings import Settings

    settings = Settings(data_dir=data_dir, policies_dir=policies)
    prepare_demo(settings)
    app = create_app(settings, run_scheduler=scheduler)

    @app.get("/bench/noop")
    def noop(ctx: Ctx) -> dict[str, bool]:
        with ctx.gw.transaction(immediate=False) as session:
            ctx.caller(session)
        return {"ok": True}

    app.router.routes.insert(0, app.router.routes.pop())  # matched first: the floor, not a route search
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Connection:
    """One keep-alive HTTP/1.1 connection; requests are JSON, responses carry Content-Length."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.auth = f"Authorization: Bearer {token}\r\n"

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def request(self, method: str, path: str, body: object = None, extra: str = "") -> Response:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\n{self.auth}{extra}Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        self.writer.write(head.encode() + data)
        status = int((await self.reader.readuntil(b"\r\n")).split(b" ", 2)[1])
        length = 0
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


Make = Callable[[Connection, int], Awaitable[Response | None]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def figures(latencies: list[float], errors: int, elapsed: float) -> dict[str, float]:
    return {"requests": len(latencies), "errors": errors, "per_second": round(len(latencies) / elapsed, 1),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process and its live child processes have used so far (Linux /proc): a gateway
    whose scheduler loop runs plans in a child process of its own (gateway/native/planner_process.py)."""
    total = _own_cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread or a child that ended meanwhile
            total += sum(_own_cpu_seconds(int(child)) for child in (task / "children").read_text().split())
    return total


def _own_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Context switches of the process's live threads so far, voluntary and not (Linux /proc). Each is a
    hand-off between threads (a wake-up, a wait for the interpreter lock), dear on this machine
    (bench.machine's thread_wake_round_trip_us)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
    return total


def _ports(port: int | Sequence[int]) -> list[int]:
    """One port, or several (replicas: connection w goes to the w-th modulo their number, spread evenly)."""
    return [port] if isinstance(port, int) else list(port)


async def closed_loop(port: int | Sequence[int], token: str, clients: int, seconds: float, make: Make,
                      server_pid: int | None = None) -> dict[str, float]:
    """Each connection sends its next request as soon as the previous one answered.

    With `server_pid`, also the server's CPU time per request: what bounds its capacity on this machine
    (the gateway is one process; its Python runs one thread at a time)."""
    ports = _ports(port)
    conns = [await Connection(ports[w % len(ports)], token).open() for w in range(clients)]
    cpu_before = cpu_seconds(server_pid) if server_pid else 0.0
    switches_before = context_switches(server_pid) if server_pid else 0
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(w: int, conn: Connection) -> None:
        nonlocal errors
        i = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            r = await make(conn, w * 1_000_000 + i)
            if r is None:
                return
            latencies.append(time.perf_counter() - t0)
            errors += r[0] >= 400
            i += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w, c) for w, c in enumerate(conns)))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    result = figures(latencies, errors, elapsed)
    if server_pid and latencies:
        result["server_cpu_ms_per_request"] = round((cpu_seconds(server_pid) - cpu_before) * 1000 / len(latencies), 3)
        result["server_context_switches_per_request"] = round(
            (context_switches(server_pid) - switches_before) / len(latencies), 1)
    return result


async def open_loop(port: int | Sequence[int], token: str, clients: int, seconds: float, rate: float,
                    make: Make) -> dict[str, float]:
    """Requests fall due every 1/rate s; each takes a free connection and its latency counts from when it was due."""
    free: asyncio.Queue[Connection] = asyncio.Queue()
    ports = _ports(port)
    for w in range(clients):
        free.put_nowait(await Connection(ports[w % len(ports)], token).open())
    latencies: list[float] = []
    errors = 0

    async def one(due: float, i: int) -> None:
        nonlocal errors
        conn = await free.get()
        try:
            r = await make(conn, i)
        finally:
            free.put_nowait(conn)
        if r is not None:
            latencies.append(time.perf_counter() - due)
            errors += r[0] >= 400

    start = time.perf_counter()
    tasks = []
    for i in range(int(seconds * rate)):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, i)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    while not free.empty():
        free.get_nowait().close()
    result = figures(latencies, errors, elapsed)
    return {"offered_per_second": rate, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument("--clients", type=int, default=32, help="keep-alive connections")
    parser.add_argument("--rate", type=float, default=500.0, help="offered submissions/s for the latency figure")
    parser.add_argument("--approval-rate", type=float, default=10.0,
                        help="offered approvals/s (people approve one request at a time)")
    parser.add_argument("--approval-seconds", type=float, default=20.0,
                        help="length of each round of approvals at a person's pace (200 samples at 10/s)")
    parser.add_argument("--queued", type=int, default=1000,
                        help="jobs that stay queued while approvals run (each decision records the queue)")
    parser.add_argument("--only", choices=["submissions", "approvals"], help="measure only these")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measure; the median one is reported")
    parser.add_argument("--with-scheduler", action="store_true",
                        help="approvals also on a gateway whose scheduler loop runs, as `jobgate up` runs it (each"
                             " approval changes the queue, so the loop plans again beside them)")
    parser.add_argument("--serve", nargs=4, metavar=("DATA_DIR", "POLICIES", "PORT", "SCHEDULER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), int(args.serve[2]), args.serve[3] == "scheduler")
        return
    try:
        import uvloop

        uvloop.install()  # the load generator too: less of the shared CPU spent on our side
    except ImportError:
        pass

    asyncio.run(run(args))


@contextlib.asynccontextmanager
async def gateway_under_test(*, scheduler: bool = False) -> AsyncIterator[tuple[int, dict[str, str], int]]:
    """A fresh gateway (its own data dir, the demo cast; no node agents) in a subprocess: yields port, tokens and
    pid. Its scheduler's loop runs only if `scheduler`: with no node agents up it places nothing, but it still
    plans and explains the whole queue after every change, as it would on a full cluster."""
    tmp = Path(tempfile.mkdtemp(prefix="jobgate-bench-"))
    policies = tmp / "policies"
    shutil.copytree(ROOT / "policies", policies)
    data = json.loads((policies / "data.json").read_text())
    # The benchmark measures throughput, not the H2 rate limit: lift the per-minute ceilings.
    data["limits"].update({"calls_per_minute_per_principal": 10**9, "calls_per_minute_per_project": 10**9})
    (policies / "data.json").write_text(json.dumps(data))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "var"), str(policies), str(port),
                               "scheduler" if scheduler else "-"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield port, await wait_ready(server, port, tmp / "var" / "demo-tokens.json"), server.pid
    finally:
        server.terminate()
        server.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
        # What it wrote is still being written back to disk (hundreds of MB after the submissions), and those
        # writes queued with the next gateway's fsyncs added several ms to the approvals' latencies.
        os.sync()


async def wait_ready(server: subprocess.Popen[bytes], port: int, tokens_file: Path) -> dict[str, str]:
    for _ in range(600):
        if server.poll() is not None:
            raise SystemExit("the gateway under test exited early")
        try:
            conn = await Connection(port, "-").open()
            status, _ = await conn.request("GET", "/healthz")
            conn.close()
            if status == 200:
                return dict(json.loads(tokens_file.read_text()))
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the gateway under test did not start")


WARM_UP_APPROVALS = 20
SPEC = {"name": "bench", "project": "vision", "gpus_per_node": 1, "command": ["true"]}


async def submit(c: Connection, i: int) -> Response:
    return await c.request("POST", "/v1/jobs", SPEC)


async def submit_keyed(c: Connection, i: int) -> Response:
    """A submission as the CLI sends it: with an Idempotency-Key of its own (gateway/api/idempotency.py)."""
    return await c.request("POST", "/v1/jobs", SPEC, f'Idempotency-Key: "{uuid.uuid4()}"\r\n')


async def run(args: argparse.Namespace) -> None:
    machine = calibration()  # before the gateway starts: nothing else of ours is running
    submissions: dict[str, object] = {}
    approvals: dict[str, object] = {}
    if args.only in (None, "submissions"):
        async with gateway_under_test() as (port, tokens, pid):
            submissions = await measure_submissions(port, tokens, args, pid)
    if args.only in (None, "approvals"):
        async with gateway_under_test() as (port, tokens, pid):
            approvals = {"approve": await measure_approvals(port, tokens, args, pid)}
        if args.with_scheduler:
            async with gateway_under_test(scheduler=True) as (port, tokens, pid):
                approvals["approve_with_scheduler"] = await measure_approvals(port, tokens, args, pid)
    print(json.dumps({
        "bench": "gateway",
        "clients": args.clients,
        "machine": machine,
        **submissions,
        **approvals,
        "targets": {"submit_per_second": 500, "submit_p99_ms_at_500_per_second": 30, "approve_p99_ms": 15},
    }, indent=2))


async def measure_submissions(port: int, tokens: dict[str, str], args: argparse.Namespace,
                              pid: int) -> dict[str, object]:
    async def noop(c: Connection, i: int) -> Response:
        return await c.request("GET", "/bench/noop")

    alice = tokens["alice"]
    warm = await closed_loop(port, alice, args.clients, 1.0, submit)
    capacity: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        noop_cap = await closed_loop(port, alice, args.clients, args.seconds, noop, pid)
        submit_cap = await closed_loop(port, alice, args.clients, args.seconds, submit, pid)
        keyed_cap = await closed_loop(port, alice, args.clients, args.seconds, submit_keyed, pid)
        capacity.append({"noop": noop_cap, "submit": submit_cap, "submit_keyed": keyed_cap,
                         "ratio": round(submit_cap["per_second"] / noop_cap["per_second"], 3)})
    at_rate: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        at_rate.append({"noop": await open_loop(port, alice, args.clients, args.seconds, args.rate, noop),
                        "submit": await open_loop(port, alice, args.clients, args.seconds, args.rate, submit)})
    cap = median_round(capacity, lambda r: r["submit"]["per_second"])
    lat = median_round(at_rate, lambda r: r["submit"]["p99_ms"])
    # Where the target rate is beyond capacity its latencies are mostly queueing; half the capacity shows
    # the latency of a gateway with room to spare.
    half = round(cap["submit"]["per_second"] / 2, 1)
    submit_half = await open_loop(port, alice, args.clients, args.seconds, half, submit)
    return {
        "warm_up_submit_per_second": warm["per_second"],
        "noop": {"capacity": cap["noop"], "at_rate": lat["noop"]},
        "submit": {"capacity": cap["submit"], "at_rate": lat["submit"], "at_half_capacity": submit_half},
        "submit_vs_noop_ratio": cap["ratio"],
        # The same submission with an Idempotency-Key (its reservation, its mark in the write, its stored answer),
        # beside the one without in the same round.
        "submit_with_idempotency_key": {"capacity": cap["submit_keyed"], "cpu_ratio_to_submit": round(
            cap["submit_keyed"]["server_cpu_ms_per_request"] / cap["submit"]["server_cpu_ms_per_request"], 3)},
        "rounds": {
            "capacity_per_second": [[r["noop"]["per_second"], r["submit"]["per_second"]] for r in capacity],
            "capacity_server_cpu_ms_per_submit": [r["submit"]["server_cpu_ms_per_request"] for r in capacity],
            "capacity_server_context_switches_per_submit": [r["submit"]["server_context_switches_per_request"]
                                                            for r in capacity],
            "submit_p99_ms_at_rate": [r["submit"]["p99_ms"] for r in at_rate],
        },
    }


async def measure_approvals(port: int, tokens: dict[str, str], args: argparse.Namespace,
                            pid: int) -> dict[str, object]:
    """Carol asks to stop alice's queued jobs; dave approves them. Every decision on an existing job records
    the whole queue (H3), so the queue's length is set (--queued jobs stay queued throughout) and reported.
    The first approvals of a fresh gateway also pay for one-off set-up (statements compiled, routes built),
    so a few go first, unmeasured, as the submissions get their warm-up second."""
    wanted = (WARM_UP_APPROVALS + int(args.rounds * args.approval_seconds * args.approval_rate + args.seconds * 100)
              + 50)
    left = args.queued + wanted
    ids: list[str] = []

    async def fill(c: Connection, i: int) -> Response | None:
        nonlocal left
        if left <= 0:
            return None
        left -= 1
        status, body = await submit(c, i)
        if status == 201 and len(ids) < wanted:
            ids.append(json.loads(body)["id"])
        return status, body

    await closed_loop(port, tokens["alice"], args.clients, 3600, fill)
    pending: list[str] = []

    async def ask(c: Connection, i: int) -> Response | None:
        if not ids:
            return None
        status, body = await c.request("POST", f"/v1/jobs/{ids.pop()}/stop", {"reason": "bench stop"})
        if approval_id := json.loads(body).get("approval_id"):
            pending.append(approval_id)
        return status, body

    await closed_loop(port, tokens["carol"], args.clients, 3600, ask)

    async def approve(c: Connection, i: int) -> Response | None:
        if not pending:
            return None
        return await c.request("POST", f"/v1/approvals/{pending.pop()}/approve")

    warm_up = WARM_UP_APPROVALS

    async def approve_to_warm_up(c: Connection, i: int) -> Response | None:
        nonlocal warm_up
        warm_up -= 1
        return await approve(c, i) if warm_up >= 0 else None

    await closed_loop(port, tokens["dave"], 1, 60, approve_to_warm_up)
    at_start = args.queued + len(pending)
    at_rate = [await open_loop(port, tokens["dave"], args.clients, args.approval_seconds, args.approval_rate, approve)
               for _ in range(args.rounds)]
    approve_cap = await closed_loop(port, tokens["dave"], args.clients, args.seconds, approve, pid)
    return {"at_rate": median_round(at_rate, lambda r: r["p99_ms"]), "capacity": approve_cap,
            "queued_jobs": {"at_start": at_start, "at_end": args.queued + len(pending)},
            "rounds": {"p99_ms_at_rate": [r["p99_ms"] for r in at_rate],
                       "p50_ms_at_rate": [r["p50_ms"] for r in at_rate]}}


if __name__ == "__main__":
    main()
