"""An auditor's round trip on the running system: save a checkpoint, let work happen, export a bundle
from the live data dir, and verify it offline against the saved checkpoint with only the public key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from e2e_testkit import JOBGATE, System

pytestmark = pytest.mark.e2e


def test_auditor_exports_and_verifies_offline(demo_system: System, tmp_path: Path) -> None:
    import subprocess

    audrey = demo_system.client("audrey")
    r = audrey.get("/v1/ledger/checkpoint")
    assert r.status_code == 200 and r.headers["Jobgate-Ledger-Retention"] == "forever"
    saved = tmp_path / "saved.checkpoint"
    saved.write_text(r.text)
    # Work happens: every submission is a decision in the ledger.
    alice = demo_system.client("alice")
    for i in range(3):
        spec = {"name": f"e2e-audit-{i}", "project": "vision", "gpus_per_node": 1, "nodes": 1,
                "command": ["python3", "-c", "print(1)"]}  # fmt: skip
        assert alice.post("/v1/jobs", json=spec).status_code == 201, "submit"
    # The auditor takes only the public key and a bundle exported from the live data dir.
    key = tmp_path / "ledger.vkey"
    shutil.copy(demo_system.data_dir / "keys" / "ledger.vkey", key)
    bundle = tmp_path / "audit.bundle"
    export = demo_system.cli("audrey", "ledger", "export", "--data-dir", str(demo_system.data_dir),
                             "--out", str(bundle), "--json")  # fmt: skip
    summary = json.loads(export.stdout)
    assert summary["entries"] == summary["tree_size"] > 3
    offline = subprocess.run(
        [*JOBGATE, "ledger", "verify", "--bundle", str(bundle), "--public-key", str(key),
         "--trusted-checkpoint", str(saved)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert offline.stdout.startswith("OK: ") and "trusted checkpoint" in offline.stdout
    # A range bundle of just the recent entries is provably part of the same signed tree.
    part = tmp_path / "recent.bundle"
    demo_system.cli("audrey", "ledger", "export", "--data-dir", str(demo_system.data_dir), "--out", str(part),
                    "--from-seq", str(summary["tree_size"] - 3), "--to-seq", str(summary["tree_size"] - 1))  # fmt: skip
    ok = demo_system.cli("audrey", "ledger", "verify", "--bundle", str(part), "--public-key", str(key))
    assert ok.stdout.startswith("OK: 3 entries")
