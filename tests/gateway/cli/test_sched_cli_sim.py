"""`jobgate sim` and `jobgate sim generate` as a user runs them: real subprocesses, real files, a real PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOBGATE = [sys.executable, "-m", "gateway.cli"]


def jobgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOBGATE, *args], capture_output=True, text=True, timeout=300)


def test_generate_replay_compare_and_plot(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    r = jobgate("sim", "generate", "--jobs", "400", "--seed", "5", "--out", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == 400
    first = trace.read_text()
    jobgate("sim", "generate", "--jobs", "400", "--seed", "5", "--out", str(trace))
    assert trace.read_text() == first  # seeded
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("aging_per_hour: {normal: 10}\ncluster: {nodes: 8, gpus_per_node: 8}\n")
    b.write_text("scheduler:\n  aging_per_hour: {normal: 100}\ncluster: {nodes: 16}\n"
                 "quotas:\n  tenants:\n    tenant00: {gpus: 16, borrow_limit: null}\n")
    png = tmp_path / "out.png"
    r = jobgate("sim", "--trace", str(trace), "--config", str(a), "--compare", str(b), "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert set(report) == {str(a), str(b)}
    for rep in report.values():
        assert rep["jobs"] == 400 and 0 < rep["utilisation"] <= 1
        assert {"queue:normal", "all"} <= set(rep["wait_s"]) and "jain_fairness" in rep
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = jobgate("sim", "--trace", str(trace), "--config", str(a))
    assert text.returncode == 0 and "utilisation" in text.stdout and "wait queue:normal" in text.stdout


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("submit_s,tenant,user,queue,gpus,nodes,duration_s,runtime_limit_s\n0,a,u,vip,1,1,60,\n")
    good_cfg = tmp_path / "ok.yaml"
    good_cfg.write_text("{}\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text("agin_per_hour: {normal: 1}\n")
    cases = [
        (["sim"], "--trace is required"),
        (["sim", "--trace", str(tmp_path / "missing.csv")], "cannot read trace"),
        (["sim", "--trace", str(bad_csv)], "bad.csv:2: bad queue"),
        (["sim", "--trace", str(bad_csv), "--config", str(typo)], "bad.csv:2"),
        (["sim", "generate", "--jobs", "-1", "--seed", "1", "--out", str(tmp_path / "x.csv")], "-1"),
    ]
    for args, message in cases:
        r = jobgate(*args)
        assert r.returncode != 0, args
        assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    ok_csv = tmp_path / "ok.csv"
    ok_csv.write_text("submit_s,tenant,user,queue,gpus,nodes,duration_s,runtime_limit_s\n0,a,u,normal,1,1,60,\n")
    r = jobgate("sim", "--trace", str(ok_csv), "--config", str(typo))
    assert r.returncode == 1 and "agin_per_hour" in r.stderr and len(r.stderr.strip().splitlines()) == 1
