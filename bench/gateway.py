"""End-to-end authorised mutations over real HTTP, beside a no-op endpoint of the same app (issue 5).

Starts the gateway (SQLite, embedded Rego, no node agents) in a subprocess on a free port, then drives it
from this process with 32 concurrent keep-alive clients:
- `noop`: an authenticated GET that returns at once (the HTTP + framework floor);
- `mutation`: POST /v1/jobs — token check, decision, ledger append (durable), DB commit;
- `approval`: POST /v1/approvals/{id}/approve — re-decision, execution and ledger in one transaction.
Prints one JSON object. Usage: python bench/gateway.py [--seconds 5] [--clients 32]
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# This file is named like the package it measures: let `import gateway` find the package, not this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import httpx  # noqa: E402

from gateway.api.deps import Ctx  # noqa: E402  (resolved by FastAPI from this module's globals)


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

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(url: str, token: str, clients: int, seconds: float, make: Any) -> dict[str, float]:
    """Run `clients` loops for `seconds`; each awaits `make(client, i)` and records its latency."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as client:

        async def worker(w: int) -> None:
            nonlocal errors
            i = 0
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await make(client, w * 1_000_000 + i)
                if r is None:
                    return
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code >= 400
                i += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        elapsed = time.perf_counter() - start
    return {"requests": len(latencies), "errors": errors, "per_second": round(len(latencies) / elapsed, 1),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--serve", nargs=3, metavar=("DATA_DIR", "POLICIES", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), int(args.serve[2]))
        return

    tmp = Path(tempfile.mkdtemp(prefix="jobgate-bench-"))
    policies = tmp / "policies"
    shutil.copytree(ROOT / "policies", policies)
    data = json.loads((policies / "data.json").read_text())
    # The benchmark measures throughput, not the H2 rate limit: lift the per-minute ceilings.
    data["limits"].update({"calls_per_minute_per_principal": 10**9, "calls_per_minute_per_project": 10**9})
    (policies / "data.json").write_text(json.dumps(data))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "var"), str(policies), str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if server.poll() is not None:
                raise SystemExit("the gateway under test exited early")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        tokens = json.loads((tmp / "var" / "demo-tokens.json").read_text())
        spec = {"name": "bench", "project": "vision", "gpus_per_node": 1, "command": ["true"]}

        async def noop(c: httpx.AsyncClient, i: int) -> httpx.Response:
            return await c.get("/bench/noop")

        async def submit(c: httpx.AsyncClient, i: int) -> httpx.Response:
            return await c.post("/v1/jobs", json=spec)

        noop_fig = asyncio.run(drive(url, tokens["alice"], args.clients, args.seconds, noop))
        mut_fig = asyncio.run(drive(url, tokens["alice"], args.clients, args.seconds, submit))

        # Approvals: carol asks to stop alice's queued jobs; dave approves them as fast as he can.
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens['carol']}"}) as carol:
            jobs = carol.get("/v1/jobs", params={"state": "pending", "limit": 1000}).json()["jobs"]
            approval_ids = [carol.post(f"/v1/jobs/{j['id']}/stop", json={"reason": "bench stop"}).json()
                            .get("approval_id") for j in jobs[:600]]
        pending = [a for a in approval_ids if a]

        async def approve(c: httpx.AsyncClient, i: int) -> httpx.Response | None:
            if not pending:
                return None
            return await c.post(f"/v1/approvals/{pending.pop()}/approve")

        appr_fig = asyncio.run(drive(url, tokens["dave"], args.clients, args.seconds, approve))
        print(json.dumps({
            "bench": "gateway",
            "clients": args.clients,
            "noop": noop_fig,
            "mutation_submit": mut_fig,
            "mutation_vs_noop_ratio": round(mut_fig["per_second"] / noop_fig["per_second"], 3),
            "approval_execute": appr_fig,
            "targets": {"mutations_per_second": 500, "mutation_p99_ms": 30, "approval_p99_ms": 15},
        }, indent=2))
    finally:
        server.terminate()
        server.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
