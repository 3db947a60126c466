"""Seeded synthetic job traces shaped like published GPU-cluster traces (Microsoft Philly, SenseTime
Helios, Alibaba PAI): most jobs use 1 GPU, a heavy tail of 8–64-GPU gangs; durations log-normal from
minutes to days; Poisson arrivals; a few tenants submit most of the work (Zipf)."""

from __future__ import annotations

import math
import random

from scheduler.sim import TraceJob

# GPUs per job and its probability (Philly/Helios: ~70 % single-GPU, under 3 % at 16 or more).
SIZES: tuple[tuple[int, float], ...] = ((1, 0.68), (2, 0.10), (4, 0.09), (8, 0.08), (16, 0.03), (32, 0.015),
                                        (64, 0.005))
MIN_DURATION_S = 60.0
MAX_DURATION_S = 7 * 86400.0


def generate(jobs: int, *, seed: int, tenants: int = 10, users_per_tenant: int = 5, gpus_per_node: int = 8,
             cluster_gpus: int = 128, load: float = 0.9) -> list[TraceJob]:
    """`jobs` jobs; arrival rate chosen so the offered GPU load is about `load` × cluster_gpus. Deterministic
    for a given seed. Raises ValueError for non-positive sizes."""
    if jobs < 0 or tenants < 1 or users_per_tenant < 1 or gpus_per_node < 1 or cluster_gpus < 1 or load <= 0:
        raise ValueError("jobs must be >= 0 and tenants, users, GPUs and load positive")
    rng = random.Random(seed)
    sizes, weights = zip(*SIZES, strict=True)
    tenant_w = [1.0 / (k + 1) for k in range(tenants)]
    # Log-normal durations: median 30 min, sigma 1.8 → most under a few hours, a tail into days.
    mu, sigma = math.log(1800.0), 1.8
    mean_gpus = sum(s * w for s, w in SIZES)
    mean_duration = math.exp(mu + sigma * sigma / 2)
    rate = load * cluster_gpus / (mean_gpus * mean_duration)  # jobs per second
    t = 0.0
    out: list[TraceJob] = []
    for k in range(jobs):
        t += rng.expovariate(rate)
        gpus = rng.choices(sizes, weights)[0]
        per_node = min(gpus, gpus_per_node)
        nodes = max(1, gpus // per_node)
        duration = min(MAX_DURATION_S, max(MIN_DURATION_S, rng.lognormvariate(mu, sigma)))
        tenant = rng.choices(range(tenants), tenant_w)[0]
        user = rng.randrange(users_per_tenant)
        roll = rng.random()
        queue = "urgent" if roll < 0.04 else "batch" if (roll < 0.24 or gpus >= 32) else "normal"
        # Users over-declare: limit 1.2–3 × the true duration, rounded up to the hour; a fifth declare none.
        limit = None if rng.random() < 0.2 else math.ceil(duration * rng.uniform(1.2, 3.0) / 3600) * 3600.0
        out.append(TraceJob(id=f"t{k:06d}", submit_s=round(t, 1), tenant=f"tenant{tenant:02d}",
                            user=f"tenant{tenant:02d}-u{user}", queue=queue, gpus_per_node=per_node, nodes=nodes,
                            duration_s=round(duration, 1), runtime_limit_s=limit))
    return out
