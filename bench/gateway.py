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
Prints one JSON object. Usage: python bench/gateway.py [--seconds 5] [--clients 32] [--rate 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This file is named like the package it measures: let `import gateway` find the package, not this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from gateway.api.deps import Ctx  # noqa: E402  (resolved by FastAPI from this module's globals)

Response = tuple[int, bytes]


def serve(data_dir: Path, policies: Path, port: int) -> None:
    """Child process: seed the demo cast and serve the app with an added no-op route."""
    import uvicorn

    from gateway.app import create_app
    from gateway.db import Database
    from gateway.demo import seed_demo
    from gateway.settings import Settings

    settings = Settings(data_dir=data_dir, policies_dir=policies)
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url())
    db.create_schema()
    with db.transaction() as session:
        seed_demo(session, data_dir)
    db.close()
    app = create_app(settings, run_scheduler=False)

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

    async def request(self, method: str, path: str, body: object = None) -> Response:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\n{self.auth}Content-Type: application/json\r\n"
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


async def closed_loop(port: int, token: str, clients: int, seconds: float, make: Make) -> dict[str, float]:
    """Each connection sends its next request as soon as the previous one answered."""
    conns = [await Connection(port, token).open() for _ in range(clients)]
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
    return figures(latencies, errors, elapsed)


async def open_loop(port: int, token: str, clients: int, seconds: float, rate: float, make: Make) -> dict[str, float]:
    """Requests fall due every 1/rate s; each takes a free connection and its latency counts from when it was due."""
    free: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(clients):
        free.put_nowait(await Connection(port, token).open())
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
    parser.add_argument("--serve", nargs=3, metavar=("DATA_DIR", "POLICIES", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), int(args.serve[2]))
        return
    try:
        import uvloop

        uvloop.install()  # the load generator too: less of the shared CPU spent on our side
    except ImportError:
        pass

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
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "var"), str(policies), str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tokens = asyncio.run(wait_ready(server, port, tmp / "var" / "demo-tokens.json"))
        print(json.dumps(asyncio.run(measure(port, tokens, args)), indent=2))
    finally:
        server.terminate()
        server.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


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


async def measure(port: int, tokens: dict[str, str], args: argparse.Namespace) -> dict[str, object]:
    spec = {"name": "bench", "project": "vision", "gpus_per_node": 1, "command": ["true"]}

    async def noop(c: Connection, i: int) -> Response:
        return await c.request("GET", "/bench/noop")

    async def submit(c: Connection, i: int) -> Response:
        return await c.request("POST", "/v1/jobs", spec)

    alice = tokens["alice"]
    warm = await closed_loop(port, alice, args.clients, 1.0, submit)
    noop_cap = await closed_loop(port, alice, args.clients, args.seconds, noop)
    submit_cap = await closed_loop(port, alice, args.clients, args.seconds, submit)
    noop_lat = await open_loop(port, alice, args.clients, args.seconds, args.rate, noop)
    submit_lat = await open_loop(port, alice, args.clients, args.seconds, args.rate, submit)
    # Where the target rate is beyond capacity its latencies are mostly queueing; half the capacity shows
    # the latency of a gateway with room to spare.
    half = round(submit_cap["per_second"] / 2, 1)
    submit_half = await open_loop(port, alice, args.clients, args.seconds, half, submit)

    # Approvals: carol asks to stop alice's queued jobs; dave approves them.
    carol = await Connection(port, tokens["carol"]).open()
    wanted = min(1000, int(args.seconds * (args.approval_rate + 150)) + 50)  # the list endpoint caps at 1000
    _, body = await carol.request("GET", f"/v1/jobs?state=pending&limit={wanted}")
    pending: list[str] = []
    for job in json.loads(body)["jobs"][:wanted]:
        _, answer = await carol.request("POST", f"/v1/jobs/{job['id']}/stop", {"reason": "bench stop"})
        if approval_id := json.loads(answer).get("approval_id"):
            pending.append(approval_id)
    carol.close()

    async def approve(c: Connection, i: int) -> Response | None:
        if not pending:
            return None
        return await c.request("POST", f"/v1/approvals/{pending.pop()}/approve")

    approve_lat = await open_loop(port, tokens["dave"], args.clients, args.seconds, args.approval_rate, approve)
    approve_cap = await closed_loop(port, tokens["dave"], args.clients, args.seconds, approve)
    return {
        "bench": "gateway",
        "clients": args.clients,
        "warm_up_submit_per_second": warm["per_second"],
        "noop": {"capacity": noop_cap, "at_rate": noop_lat},
        "submit": {"capacity": submit_cap, "at_rate": submit_lat, "at_half_capacity": submit_half},
        "submit_vs_noop_ratio": round(submit_cap["per_second"] / noop_cap["per_second"], 3),
        "approve": {"at_rate": approve_lat, "capacity": approve_cap, "approvals_prepared": wanted},
        "targets": {"submit_per_second": 500, "submit_p99_ms_at_500_per_second": 30, "approve_p99_ms": 15},
    }


if __name__ == "__main__":
    main()
