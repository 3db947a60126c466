"""Policy decisions: latency in-process and over HTTP, and what-if replay throughput (JSON to stdout).

Measured in the same run, on the same requests:
- full in-process decision (Casbin + Rego + counters, no DB) with 200 projects x 50 bound principals
  (10,000 role bindings) plus global on-call — the current policy set, and as a baseline the policy
  set before the speed restructuring (commit 23bf37e, read from git) under the same engine;
- Casbin alone (capabilities + roles for the input; one Casbin enforce) and Rego alone (input conversion and
  evaluation as the engine does them, and with regopy's generic Input/Output for comparison);
- a decision over HTTP on loopback with a keep-alive client: GET /v1/jobs/{id} (token check, job read, A1
  decision) against a real uvicorn server, beside GET /healthz (the HTTP floor);
- `jobgate policy whatif` replay over 100,000 recorded decision entries (ledger entry bytes, unique
  inputs: distinct job ids and times), parsed and replayed under the policy set.

Usage: python bench/policy.py [--quick]   (--quick: 20,000 replayed decisions, fewer rounds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/gateway.py is named like the package: make `import gateway` find the package, not that script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from regopy import Input  # noqa: E402

from gateway.policy import EmbeddedEngine, RoleBinding, load_policy_set  # noqa: E402
from gateway.policy.loader import DECISION_ENTRYPOINT, compile_rego  # noqa: E402
from gateway.policy.regoio import query_value, rego_input  # noqa: E402
from gateway.policy.testing import expand_input  # noqa: E402
from gateway.policy.whatif import records_from_entries, replay  # noqa: E402

PROJECTS = 200
PRINCIPALS = 50
BASELINE_COMMIT = "23bf37e"


def bindings() -> list[RoleBinding]:
    out = [RoleBinding("oncall-1", "oncall", "*"), RoleBinding("oncall-2", "oncall", "*")]
    for p in range(PROJECTS):
        for u in range(PRINCIPALS):
            out.append(RoleBinding(f"u{p}-{u}", "queue_admin" if u < 2 else "researcher", f"p{p}"))
    return out


def compact_mix(n: int = 50, unique: bool = False) -> list[dict[str, Any]]:
    """Own stop (allow), queue-admin stop (needs approval), stranger (deny), view, on-call pause."""
    mix = []
    for i in range(n):
        p = f"p{(i * 37) % PROJECTS}"
        job = {"project": p, "creator": f"u{p[1:]}-7"}
        if unique:
            job["id"] = f"j-{i:08d}"
        mix += [
            {"action": "job.stop", "actor": f"u{p[1:]}-7", "targets": [job]},
            {"action": "job.stop", "actor": f"u{p[1:]}-0", "reason": "hung", "targets": [job]},
            {"action": "job.stop", "actor": f"u{(int(p[1:]) + 1) % PROJECTS}-9", "targets": [job]},
            {"action": "job.view", "actor": f"u{p[1:]}-3", "targets": [job]},
            {"action": "job.pause", "actor": "oncall-1", "targets": [job]},
        ]
    return mix


def requests() -> list[dict[str, Any]]:
    return [expand_input(r) for r in compact_mix()]


def measure(fn: Callable[[dict[str, Any]], object], docs: list[dict[str, Any]], rounds: int) -> dict[str, float]:
    for doc in docs[:200]:
        fn(doc)  # warm up
    samples = []
    for i in range(rounds):
        doc = docs[i % len(docs)]
        start = time.perf_counter_ns()
        fn(doc)
        samples.append(time.perf_counter_ns() - start)
    return summary(samples)


def summary(samples: list[int]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_ms": round(samples[len(samples) // 2] / 1e6, 4),
        "p99_ms": round(samples[int(len(samples) * 0.99)] / 1e6, 4),
        "mean_ms": round(statistics.fmean(samples) / 1e6, 4),
    }


def baseline_policies(target: Path) -> Path | None:
    """Today's policy directory with the Rego modules as they were before the restructuring (from git).

    Only the modules are old: data.json, matrix.csv and tests are today's, so the loader's checks pass and
    the comparison isolates the Rego. None outside a git checkout.
    """
    import shutil

    try:
        names = subprocess.run(["git", "ls-tree", "--name-only", BASELINE_COMMIT, "policies/"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
        shutil.copytree(ROOT / "policies", target, dirs_exist_ok=True)
        for path in target.glob("*.rego"):
            path.unlink()
        for name in names:
            if name.endswith(".rego"):
                body = subprocess.run(["git", "show", f"{BASELINE_COMMIT}:{name}"], cwd=ROOT, capture_output=True,
                                      check=True).stdout
                (target / Path(name).name).write_bytes(body)
        return target
    except (subprocess.CalledProcessError, OSError):
        return None


def in_process(rounds: int) -> dict[str, Any]:
    policy_set = load_policy_set(ROOT / "policies")
    started = time.perf_counter()
    engine = EmbeddedEngine(policy_set, bindings())
    setup_s = time.perf_counter() - started
    docs = requests()
    enriched = [engine.decision_input(d) for d in docs]
    rego, bundle = compile_rego(policy_set.rego_modules, policy_set.data)

    entrypoint = DECISION_ENTRYPOINT.encode()

    def rego_only(doc: dict[str, Any]) -> object:
        # As the engine does it (gateway.policy.regoio): input built with its hot keys first, answer parsed once.
        rego.set_input(rego_input(doc))
        return query_value(rego, bundle, entrypoint)

    def rego_only_generic_io(doc: dict[str, Any]) -> object:
        # regopy's own Input and Output, for comparison.
        rego.set_input(Input(doc))
        return rego.query_bundle_entrypoint(bundle, DECISION_ENTRYPOINT)

    effects: dict[str, int] = {}
    for d in docs:
        effect = engine.decide(d).effect
        effects[effect] = effects.get(effect, 0) + 1
    out: dict[str, Any] = {
        "engine_setup_s": round(setup_s, 3),
        "request_mix_effects": effects,
        "full_decision": measure(engine.decide, docs, rounds),
        "casbin_alone_capabilities_and_roles": measure(engine.decision_input, docs, rounds),
        "casbin_alone_single_enforce": measure(
            lambda d: engine.enforce(d["actor"]["id"], d["targets"][0]["project"], "job.stop.any"), docs, rounds),
        "rego_alone": measure(rego_only, enriched, rounds),
        "rego_alone_regopy_generic_input_output": measure(rego_only_generic_io, enriched, rounds),
    }
    with tempfile.TemporaryDirectory() as tmp:
        old_dir = baseline_policies(Path(tmp) / "policies")
        if old_dir is not None:
            old = EmbeddedEngine(load_policy_set(old_dir), bindings())
            same = all(old.decide(d).to_json() | {"policy_hash": ""} == engine.decide(d).to_json() | {"policy_hash": ""}
                       for d in docs)
            out[f"baseline_full_decision_rego_modules_at_{BASELINE_COMMIT}"] = measure(old.decide, docs, rounds)
            out["baseline_same_decisions_on_the_mix"] = same
    out["target_full_p50_ms"] = 0.5
    out["target_full_p99_ms"] = 1.5
    return out


def recorded_entries(n: int) -> list[bytes]:
    """n ledger decision entries as stored (canonical JSON bytes), each with a distinct input."""
    from gateway.policy.testing import DEFAULT_REQUEST

    compact = compact_mix(n // 5 + 1, unique=True)[:n]
    out = []
    for i, c in enumerate(compact):
        request = expand_input({**c, "now": f"2026-11-{1 + i % 28:02d}T{(i // 60) % 24:02d}:{i % 60:02d}:00+00:00"})
        assert set(DEFAULT_REQUEST) <= set(request)
        entry = {"seq": i, "time": f"2026-11-{1 + i % 28:02d}T10:00:00.000000Z", "kind": "decision",
                 "prev": "0" * 64, "blobs": {},
                 "body": {"request_id": f"req-{i}", "input": request,
                          "decision": {"effect": "allow", "approvals_required": {"count": 0}, "rules": []}}}
        out.append(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())
    return out


def whatif(n: int) -> dict[str, Any]:
    raw = recorded_entries(n)
    started = time.perf_counter()
    records = list(records_from_entries(raw))
    parsed_s = time.perf_counter() - started
    report = replay(ROOT / "policies", records, bindings(), bindings_source="bench: 10,002 bindings")
    total = time.perf_counter() - started
    return {
        "recorded_decisions": n,
        "distinct_inputs": report.unique_inputs,
        "workers": os.cpu_count(),
        "parse_s": round(parsed_s, 3),
        "total_s": round(total, 3),
        "replayed_per_s": round(n / total),
        "flipped_vs_recorded": len(report.flips),
        "target_per_s": 2000,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def over_http(rounds: int) -> dict[str, Any]:
    import httpx
    import uvicorn

    from gateway.app import create_app
    from gateway.db import Database
    from gateway.demo import seed_demo
    from gateway.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        settings = Settings(data_dir=data, policy_watch_interval_s=0)
        db = Database(settings.resolved_database_url())
        db.create_schema()
        with db.transaction() as session:
            seed_demo(session, data)
        db.close()
        tokens = json.loads((data / "demo-tokens.json").read_text())
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings, run_scheduler=False), host="127.0.0.1",
                                               port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                              headers={"Authorization": f"Bearer {tokens['alice']}"}) as client:
                job = client.post("/v1/jobs", json={"name": "bench", "project": "vision", "gpus_per_node": 1,
                                                    "nodes": 1, "command": ["true"]}).json()["id"]

                def timed(path: str) -> dict[str, float]:
                    for _ in range(100):
                        client.get(path)
                    samples = []
                    for _ in range(rounds):
                        t = time.perf_counter_ns()
                        r = client.get(path)
                        samples.append(time.perf_counter_ns() - t)
                        assert r.status_code == 200, r.text
                    return summary(samples)

                return {"decision_get_job": timed(f"/v1/jobs/{job}"), "floor_healthz": timed("/healthz"),
                        "target_p99_ms": 5.0}
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer rounds and 20,000 replayed decisions.")
    args = parser.parse_args()
    rounds = 1000 if args.quick else 4000
    result: dict[str, Any] = {
        "bench": "policy_decision",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "projects": PROJECTS,
        "principals_per_project": PRINCIPALS,
        "bindings": PROJECTS * PRINCIPALS + 2,
        **in_process(rounds),
        "http": over_http(500 if args.quick else 2000),
        "whatif": whatif(20_000 if args.quick else 100_000),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
