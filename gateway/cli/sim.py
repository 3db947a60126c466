"""`jobgate sim`: replay a job trace through the scheduler core in virtual time, compare two configs, plot;
`jobgate sim generate`: a seeded synthetic trace. Runs offline: no gateway needed."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import click
import yaml

from gateway.cli.client import emit_json, fail
from scheduler.config import config_from_mapping
from scheduler.errors import SchedulerError
from scheduler.model import QUEUES
from scheduler.sim import SimCluster, SimReport, TraceJob, quotas_from_mapping, simulate
from scheduler.tracegen import generate

COLUMNS = ("id", "submit_s", "tenant", "user", "queue", "gpus", "nodes", "duration_s", "runtime_limit_s")
_SIM_KEYS = {"cluster", "quotas", "tick_s", "grace_s", "scheduler"}


def read_trace(path: Path) -> list[TraceJob]:
    """CSV with the COLUMNS header (`gpus` = GPUs per node; empty runtime_limit_s = none declared)."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c != "id" and c not in (reader.fieldnames or [])]
            if missing:
                fail(f"{path}: missing columns {', '.join(missing)} (expected {','.join(COLUMNS)})")
            jobs = []
            for line, row in enumerate(reader, start=2):
                try:
                    limit = row["runtime_limit_s"].strip()
                    job = TraceJob(id=row.get("id") or f"row{line}", submit_s=float(row["submit_s"]),
                                   tenant=row["tenant"], user=row["user"], queue=row["queue"],
                                   gpus_per_node=int(row["gpus"]), nodes=int(row["nodes"]),
                                   duration_s=float(row["duration_s"]), runtime_limit_s=float(limit) if limit else None)
                except (ValueError, TypeError, AttributeError) as e:
                    fail(f"{path}:{line}: {e}")
                if job.queue not in QUEUES or job.gpus_per_node < 1 or job.nodes < 1 or job.duration_s < 0:
                    fail(f"{path}:{line}: bad queue, GPUs, nodes or duration")
                jobs.append(job)
            return jobs
    except OSError as e:
        fail(f"cannot read trace {path}: {e.strerror}")


def write_trace(path: Path, jobs: list[TraceJob]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for j in jobs:
            w.writerow([j.id, j.submit_s, j.tenant, j.user, j.queue, j.gpus_per_node, j.nodes, j.duration_s,
                        "" if j.runtime_limit_s is None else j.runtime_limit_s])


def read_config(path: Path | None) -> dict[str, Any]:
    """YAML: scheduler settings (top level or under `scheduler:`), plus `cluster`, `quotas`, `tick_s`, `grace_s`."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        fail(f"cannot read config {path}: {e}")
    if not isinstance(data, dict):
        fail(f"{path}: must be a mapping")
    return data


def run(trace: list[TraceJob], data: dict[str, Any], label: str) -> SimReport:
    sched = data.get("scheduler", {k: v for k, v in data.items() if k not in _SIM_KEYS})
    cluster = data.get("cluster") or {}
    try:
        config = config_from_mapping(sched)
        quotas = quotas_from_mapping(data.get("quotas"))
        return simulate(trace, cluster=SimCluster(int(cluster.get("nodes", 16)), int(cluster.get("gpus_per_node", 8))),
                        config=config, quotas=quotas, tick_s=float(data.get("tick_s", 60)),
                        grace_s=float(data.get("grace_s", 30)))
    except SchedulerError as e:
        fail(f"{label}: {e.diagnostics()}")
    except (TypeError, ValueError) as e:
        fail(f"{label}: {e}")


def _require_matplotlib() -> None:
    """Checked before the replay, which takes a while, so a missing plotting library does not throw it away."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("--plot needs matplotlib, which `make run` does not install: .venv/bin/pip install -e '.[sim]'"
             " (or drop --plot)")


def plot(reports: dict[str, SimReport], out: Path) -> None:
    _require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for label, r in reports.items():
        hours = [t / 3600 for t, _, _ in r.series]
        ax1.plot(hours, [u * 100 for _, u, _ in r.series], label=label, linewidth=0.8)
        ax2.plot(hours, [q for _, _, q in r.series], label=label, linewidth=0.8)
    ax1.set_ylabel("GPU utilisation %")
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("hours since the first submission")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _summary(label: str, r: SimReport) -> list[str]:
    lines = [f"== {label}: {r.finished}/{r.jobs} jobs finished in {r.makespan_s / 3600:.1f} h virtual, "
             f"{r.cycles} cycles",
             f"  utilisation {r.utilisation:.1%}, preemptions {r.preemptions}, GPU-hours lost "
             f"{r.gpu_hours_lost:.1f}, Jain fairness {r.jain_fairness:.3f}",
             f"  completion time mean {r.completion_s['mean']:.0f} s, p95 {r.completion_s['p95']:.0f} s"]
    for key, s in r.wait_s.items():
        lines.append(f"  wait {key:<18} n={s['n']:<6g} mean {s['mean']:>9.0f} s  p95 {s['p95']:>9.0f} s")
    return lines


@click.group("sim", invoke_without_command=True)
@click.option("--trace", "trace_path", type=click.Path(path_type=Path), help="CSV trace to replay.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Scheduler YAML (default: the built-in settings): scheduler settings such as "
                   "`fairshare_weight: 0` or `aging_per_hour: {batch: 5}` (at the top level or under `scheduler:`), "
                   "plus `cluster: {nodes: 16, gpus_per_node: 8}`, `quotas`, `tick_s`, `grace_s`. An unknown key "
                   "is refused with the list of known ones.")
@click.option("--compare", "compare_path", type=click.Path(path_type=Path), help="A second YAML, side by side.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write a PNG of utilisation and queue.")
@click.option("--json", "as_json", is_flag=True, help="Print the report(s) as JSON.")
@click.pass_context
def sim_group(ctx: click.Context, trace_path: Path | None, config_path: Path | None, compare_path: Path | None,
              plot_path: Path | None, as_json: bool) -> None:
    """Replay a trace through the real scheduler core in virtual time and report utilisation, waits per queue
    and tenant, completion times, preemptions, GPU-hours lost and Jain's fairness index.

    Example: jobgate sim generate --jobs 5000 --seed 1 --out t.csv && jobgate sim --trace t.csv --config a.yaml
    --compare b.yaml --plot out.png
    """
    if ctx.invoked_subcommand is not None:
        return
    if trace_path is None:
        fail("--trace is required (or use `jobgate sim generate`)")
    if plot_path is not None:
        _require_matplotlib()
    trace = read_trace(trace_path)
    reports = {str(config_path or "defaults"): run(trace, read_config(config_path), str(config_path or "defaults"))}
    if compare_path is not None:
        reports[str(compare_path)] = run(trace, read_config(compare_path), str(compare_path))
    if plot_path is not None:
        plot(reports, plot_path)
    if as_json:
        emit_json({label: r.as_dict() for label, r in reports.items()})
        return
    for label, r in reports.items():
        click.echo("\n".join(_summary(label, r)))
    if plot_path is not None:
        click.echo(f"plot written to {plot_path}")


@sim_group.command("generate")
@click.option("--jobs", type=click.IntRange(min=0), required=True, help="How many jobs.")
@click.option("--seed", type=int, required=True, help="Same seed, same trace.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="CSV file to write.")
@click.option("--tenants", type=click.IntRange(min=1), default=10, show_default=True, help="Tenants submitting.")
@click.option("--cluster-gpus", type=click.IntRange(min=1), default=128, show_default=True,
              help="Arrival rate is set for this many GPUs at --load.")
@click.option("--load", type=click.FloatRange(min=0.01), default=0.9, show_default=True,
              help="Offered GPU load as a fraction of --cluster-gpus.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def sim_generate(jobs: int, seed: int, out: Path, tenants: int, cluster_gpus: int, load: float, as_json: bool) -> None:
    """Write a seeded synthetic trace: many 1-GPU jobs, a heavy tail of 8-64-GPU gangs, minutes to days."""
    trace = generate(jobs, seed=seed, tenants=tenants, cluster_gpus=cluster_gpus, load=load)
    try:
        write_trace(out, trace)
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror}")
    summary = {"jobs": len(trace), "out": str(out), "span_h": round(trace[-1].submit_s / 3600, 2) if trace else 0,
               "gpus_over_8": sum(1 for j in trace if j.gpus_per_node * j.nodes > 8)}
    emit_json(summary) if as_json else click.echo(json.dumps(summary))
