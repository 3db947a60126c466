"""Policy decisions: latency in-process and over HTTP, and what-if replay throughput (JSON to stdout).

Measured in the same run, on the same requests:
- full in-process decision (Casbin + Rego + counters, no DB) with 200 projects x 50 bound principals
  (10,000 role bindings) plus global on-call — the current policy set, and as a baseline the policy
  set before the speed restructuring (commit 23bf37e, read from git) under the same engine;
- Casbin alone (capabilities + roles for the input; one Casbin enforce) and Rego alone (input conversion and
  evaluation as the engine does them, and with regopy's generic Input/Output for comparison);
- a decision over HTTP on loopback: GET /v1/jobs/{id} (token check, job read, A1 decision) against the app
  served by uvicorn in a process of its own (its own data dir), from a one-connection keep-alive client in
  this process, beside GET /healthz (the HTTP floor); with the server's CPU time per request;
- `jobgate policy whatif` replay over 100,000 recorded decision entries (ledger entry bytes, unique
  inputs: distinct job ids and times), parsed and replayed under the policy set;
- OPA (v1.20.2's Go evaluator, opa-golib-python-bindings) beside the embedded engine on the same requests,
  measured interleaved: the full decision and the Rego alone in-process (`--policy-engine opa-inprocess`), the
  full decision through the OPA server engine (`--policy-engine opa`, HTTP on loopback to
  tests/gateway/decisions/policy/opa_server.py: OPA's evaluator behind a Python HTTP front, so slower than
  `opa run --server`),
  and decisions per second from two threads at once.

Usage: python bench/policy.py [--quick]   (--quick: 20,000 replayed decisions, fewer rounds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/gateway.py is named like the package: make `import gateway` find the package, not that script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from regopy import Input  # noqa: E402

from bench.machine import calibration  # noqa: E402
from gateway.decisions.policy import EmbeddedEngine, RoleBinding, load_policy_set  # noqa: E402
from gateway.decisions.policy.loader import DECISION_ENTRYPOINT, compile_rego  # noqa: E402
from gateway.decisions.policy.regoio import query_value, rego_input  # noqa: E402
from gateway.decisions.policy.testing import expand_input  # noqa: E402
from gateway.decisions.policy.whatif import records_from_entries, replay  # noqa: E402

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
    return summary(timings(fn, docs, rounds))


def timings(fn: Callable[[dict[str, Any]], object], docs: list[dict[str, Any]], rounds: int,
            offset: int = 0) -> list[int]:
    samples = []
    for i in range(offset, offset + rounds):
        doc = docs[i % len(docs)]
        start = time.perf_counter_ns()
        fn(doc)
        samples.append(time.perf_counter_ns() - start)
    return samples


def interleaved(fns: dict[str, Callable[[dict[str, Any]], object]], docs: list[dict[str, Any]],
                rounds: int) -> dict[str, dict[str, float]]:
    """Each fn timed on the same docs in four alternating quarters, so a burst of load from elsewhere on the
    machine hits all alike."""
    for fn in fns.values():
        for doc in docs[:200]:
            fn(doc)  # warm up
    samples: dict[str, list[int]] = {name: [] for name in fns}
    quarter = rounds // 4
    for q in range(4):
        for name, fn in fns.items():
            samples[name] += timings(fn, docs, quarter, offset=q * quarter)
    return {name: summary(s) for name, s in samples.items()}


def per_second_two_threads(fn: Callable[[dict[str, Any]], object], docs: list[dict[str, Any]],
                           rounds: int) -> int:
    """Decisions per second with two threads deciding at once (the API serves from a thread pool)."""
    import threading

    def work(offset: int) -> None:
        for i in range(offset, offset + rounds):
            fn(docs[i % len(docs)])

    threads = [threading.Thread(target=work, args=(n * 7,)) for n in range(2)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round(2 * rounds / (time.perf_counter() - started))


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
        # As the engine does it (gateway.decisions.policy.regoio): input built with its hot keys first, answer parsed
        # once.
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
    out["opa"] = opa_beside_embedded(policy_set, engine, docs, rounds, embedded_setup_s=setup_s)
    return out


def opa_beside_embedded(policy_set: Any, engine: EmbeddedEngine, docs: list[dict[str, Any]], rounds: int, *,
                        embedded_setup_s: float) -> dict[str, Any]:
    """OPA's evaluator in-process and through the OPA server engine, each beside the embedded engine (the
    baseline), on the same requests in the same run."""
    from gateway.decisions.policy.errors import PolicyLoadError

    try:
        from gateway.decisions.policy.opa_inprocess import OPA_GOLIB_PIN, OpaInProcessEngine

        started = time.perf_counter()
        opa = OpaInProcessEngine(policy_set, bindings())
        setup_s = time.perf_counter() - started
    except PolicyLoadError as e:
        return {"skipped": str(e)}
    server = _opa_server()
    try:
        from gateway.decisions.policy.opa import OpaEngine

        over_http = OpaEngine(policy_set, bindings(), url=server.url, timeout_s=5.0)
        same = all(opa.decide(d) == engine.decide(d) == over_http.decide(d) for d in docs)
        full = interleaved({"embedded": engine.decide, "opa_inprocess": opa.decide,
                            "opa_server_http": over_http.decide}, docs, rounds)
        over_http.close()
    finally:
        server.stop()
    enriched = [engine.decision_input(d) for d in docs]
    rego = interleaved({"embedded": engine.evaluate, "opa_inprocess": opa.evaluate}, enriched, rounds)
    threads = {"embedded": per_second_two_threads(engine.decide, docs, rounds // 2),
               "opa_inprocess": per_second_two_threads(opa.decide, docs, rounds // 2)}
    opa.close()
    return {
        "evaluator": f"OPA v1.20.2 ({OPA_GOLIB_PIN})",
        "baseline": "embedded",
        "setup_s": {"embedded": round(embedded_setup_s, 3), "opa_inprocess": round(setup_s, 3)},
        "same_decisions_on_the_mix": same,
        "full_decision": full,
        "rego_alone": rego,
        "two_threads_decisions_per_s": threads,
    }


def _opa_server() -> Any:
    """tests/gateway/decisions/policy/opa_server.py as a process of its own (OPA's evaluator behind OPA's REST API)."""
    import importlib.util

    server = ROOT / "tests" / "gateway" / "decisions" / "policy" / "opa_server.py"
    spec = importlib.util.spec_from_file_location("opa_server", server)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OpaServerProcess()


def recorded_entries(n: int) -> list[bytes]:
    """n ledger decision entries as stored (canonical JSON bytes), each with a distinct input."""
    from gateway.decisions.policy.testing import DEFAULT_REQUEST

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


def serve(data_dir: Path, port: int) -> None:
    """Child process (--serve): the demo cast seeded into its own data dir, the app served by uvicorn."""
    import uvicorn

    from gateway.app import create_app
    from gateway.demo import prepare_demo
    from gateway.settings import Settings

    settings = Settings(data_dir=data_dir, policy_watch_interval_s=0)
    prepare_demo(settings)
    uvicorn.run(create_app(settings, run_scheduler=False), host="127.0.0.1", port=port, log_level="warning")


class Http:
    """One keep-alive HTTP/1.1 connection, blocking: the lightest client for one request at a time, so the
    figure is the server's answer time plus as little client work as possible."""

    def __init__(self, port: int, token: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f"Host: bench\r\nAuthorization: Bearer {token}\r\n".encode()
        self.buf = b""

    def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        self.sock.sendall(f"{method} {path} HTTP/1.1\r\n".encode() + self.head
                          + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:"))
        while len(self.buf) < length:
            self._fill()
        payload, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split(b" ", 2)[1]), payload

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def over_http(rounds: int) -> dict[str, Any]:
    """GET /v1/jobs/{id} (token check, job read, A1 decision) and GET /healthz, one request at a time on one
    keep-alive connection, from this process to a gateway in its own process (uvicorn, its own data dir)."""
    tmp = Path(tempfile.mkdtemp(prefix="jobgate-bench-policy-"))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "var"), str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError("the gateway under test exited early")
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway under test did not start")
            try:
                probe = Http(port, "-")
                ready = probe.request("GET", "/healthz")[0] == 200
                probe.close()
                if ready:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        tokens = json.loads((tmp / "var" / "demo-tokens.json").read_text())
        client = Http(port, tokens["alice"])
        status, body = client.request("POST", "/v1/jobs", {"name": "bench", "project": "vision", "gpus_per_node": 1,
                                                           "nodes": 1, "command": ["true"]})
        assert status == 201, body
        job = json.loads(body)["id"]

        def timed(path: str) -> tuple[list[int], float]:
            for _ in range(100):
                client.request("GET", path)
            cpu_before = _cpu_seconds(server.pid)
            samples = []
            for _ in range(rounds // 2):
                t = time.perf_counter_ns()
                status, body = client.request("GET", path)
                samples.append(time.perf_counter_ns() - t)
                assert status == 200, body
            return samples, _cpu_seconds(server.pid) - cpu_before

        # Two interleaved halves per path, so a burst of load from elsewhere on the machine hits both alike.
        runs = [timed(path) for path in (f"/v1/jobs/{job}", "/healthz", f"/v1/jobs/{job}", "/healthz")]
        client.close()

        def figures(a: tuple[list[int], float], b: tuple[list[int], float]) -> dict[str, float]:
            samples = a[0] + b[0]
            return {**summary(samples), "server_cpu_ms_per_request": round((a[1] + b[1]) * 1000 / len(samples), 3)}

        return {"decision_get_job": figures(runs[0], runs[2]), "floor_healthz": figures(runs[1], runs[3]),
                "target_p99_ms": 5.0}
    finally:
        server.terminate()
        server.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer rounds and 20,000 replayed decisions.")
    parser.add_argument("--serve", nargs=2, metavar=("DATA_DIR", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), int(args.serve[1]))
        return
    rounds = 1000 if args.quick else 4000
    result: dict[str, Any] = {
        "bench": "policy_decision",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": calibration(),
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
