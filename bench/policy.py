"""Policy decision latency: full in-process decision beside Casbin alone and Rego alone (JSON to stdout).

200 projects x 50 bound principals (10,000 role bindings) plus global on-call; each figure is measured
in the same run on the same requests.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regopy import Input  # noqa: E402

from gateway.policy import EmbeddedEngine, RoleBinding, load_policy_set  # noqa: E402
from gateway.policy.loader import DECISION_ENTRYPOINT, compile_rego  # noqa: E402
from gateway.policy.testing import expand_input  # noqa: E402

PROJECTS = 200
PRINCIPALS = 50
ROUNDS = 4000


def bindings() -> list[RoleBinding]:
    out = [RoleBinding("oncall-1", "oncall", "*"), RoleBinding("oncall-2", "oncall", "*")]
    for p in range(PROJECTS):
        for u in range(PRINCIPALS):
            out.append(RoleBinding(f"u{p}-{u}", "queue_admin" if u < 2 else "researcher", f"p{p}"))
    return out


def requests() -> list[dict[str, Any]]:
    """A mix: own stop (allow), queue-admin stop (needs approval), stranger (deny), view, on-call pause."""
    mix = []
    for i in range(50):
        p = f"p{(i * 37) % PROJECTS}"
        job = {"project": p, "creator": f"u{p[1:]}-7"}
        mix += [
            {"action": "job.stop", "actor": f"u{p[1:]}-7", "targets": [job]},
            {"action": "job.stop", "actor": f"u{p[1:]}-0", "reason": "hung", "targets": [job]},
            {"action": "job.stop", "actor": f"u{(int(p[1:]) + 1) % PROJECTS}-9", "targets": [job]},
            {"action": "job.view", "actor": f"u{p[1:]}-3", "targets": [job]},
            {"action": "job.pause", "actor": "oncall-1", "targets": [job]},
        ]
    return [expand_input(r) for r in mix]


def measure(fn: Callable[[dict[str, Any]], object], docs: list[dict[str, Any]]) -> dict[str, float]:
    for doc in docs[:200]:
        fn(doc)  # warm up
    samples = []
    for i in range(ROUNDS):
        doc = docs[i % len(docs)]
        start = time.perf_counter_ns()
        fn(doc)
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return {
        "p50_ms": round(samples[len(samples) // 2] / 1e6, 4),
        "p99_ms": round(samples[int(len(samples) * 0.99)] / 1e6, 4),
        "mean_ms": round(statistics.fmean(samples) / 1e6, 4),
    }


def main() -> None:
    policy_set = load_policy_set(ROOT / "policies")
    started = time.perf_counter()
    engine = EmbeddedEngine(policy_set, bindings())
    setup_s = time.perf_counter() - started
    docs = requests()
    enriched = [engine.decision_input(d) for d in docs]
    rego, bundle = compile_rego(policy_set.rego_modules, policy_set.data)

    def rego_only(doc: dict[str, Any]) -> object:
        rego.set_input(Input(doc))
        return rego.query_bundle_entrypoint(bundle, DECISION_ENTRYPOINT)

    effects: dict[str, int] = {}
    for d in docs:
        effect = engine.decide(d).effect
        effects[effect] = effects.get(effect, 0) + 1

    result = {
        "bench": "policy_decision",
        "python": platform.python_version(),
        "projects": PROJECTS,
        "principals_per_project": PRINCIPALS,
        "bindings": PROJECTS * PRINCIPALS + 2,
        "engine_setup_s": round(setup_s, 3),
        "request_mix_effects": effects,
        "full_decision": measure(engine.decide, docs),
        "casbin_alone_capabilities_and_roles": measure(engine.decision_input, docs),
        "casbin_alone_single_enforce": measure(
            lambda d: engine.enforce(d["actor"]["id"], d["targets"][0]["project"], "job.stop.any"), docs
        ),
        "rego_alone": measure(rego_only, enriched),
        "target_full_p50_ms": 0.5,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
