"""What-if replay: worker processes give the serial report exactly, identical inputs are decided once (and
only truly identical ones), progress is reported, and small replays stay in process."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.decisions.policy import RoleBinding
from gateway.decisions.policy.testing import expand_input, load_bindings
from gateway.decisions.policy.whatif import CHUNK, SERIAL_BELOW, Recorded, records_from_entries, replay, worker_count

POLICIES = Path(__file__).resolve().parents[4] / "policies"

# Recorded under the current set: alice stops her own job (allow), bob stops alice's (needs 1 approval),
# mallory stops alice's (deny), carol views it (allow).
MIX = [
    ({"action": "job.stop", "actor": "alice"}, "allow", 0),
    ({"action": "job.stop", "actor": "bob", "reason": "hung"}, "needs_approval", 1),
    ({"action": "job.stop", "actor": "mallory"}, "deny", 0),
    ({"action": "job.view", "actor": "carol"}, "allow", 0),
]


def _entries(n: int) -> list[bytes]:
    """n decision entries as the ledger stores them, each input distinct (its own job id)."""
    out = []
    for i in range(n):
        compact, effect, approvals = MIX[i % len(MIX)]
        request = expand_input({**compact, "targets": [{"id": f"j-{i}", "creator": "alice"}]})
        entry = {"seq": i, "time": f"2026-11-29T10:00:{i % 60:02d}.000000Z", "kind": "decision",
                 "body": {"input": request, "decision": {"effect": effect, "rules": [],
                                                          "approvals_required": {"count": approvals}}}}
        out.append(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())
    return out


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Researchers may no longer stop their own jobs; a job-level stop needs two confirmations."""
    target = tmp_path_factory.mktemp("candidate") / "policies"
    shutil.copytree(POLICIES, target)
    matrix = target / "matrix.csv"
    matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))
    data = target / "data.json"
    data.write_text(data.read_text().replace('"confirmations": {"job": 1,', '"confirmations": {"job": 2,'))
    return target


def _report(candidate: Path, records: list[Recorded], workers: int | None, **kw: Any) -> dict[str, Any]:
    report = replay(candidate, records, load_bindings(POLICIES), bindings_source="fixture", workers=workers, **kw)
    out = report.to_json()
    del out["seconds"], out["per_second"]
    return out


def test_workers_give_the_serial_report(candidate: Path) -> None:
    records = list(records_from_entries(_entries(2 * CHUNK + 37)))
    serial = _report(candidate, records, workers=1)
    pooled = _report(candidate, records, workers=2)
    assert pooled == serial
    seqs = [f["seq"] for f in serial["flips"]]
    assert seqs == sorted(seqs)  # ledger order
    assert serial["counts"] == {"allow→deny": len(records) // 4 + 1, "approvals 1→2": len(records) // 4}


def test_progress_reaches_the_total(candidate: Path) -> None:
    records = list(records_from_entries(_entries(CHUNK + 10)))
    seen: list[tuple[int, int]] = []
    _report(candidate, records, workers=2, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(CHUNK, CHUNK + 10), (CHUNK + 10, CHUNK + 10)]


def test_identical_inputs_are_decided_once() -> None:
    raw = _entries(4)
    records = list(records_from_entries(raw + raw[:2]))
    report = replay(POLICIES, records, load_bindings(POLICIES), bindings_source="fixture", workers=1)
    assert (report.replayed, report.unique_inputs, len(report.flips)) == (6, 4, 0)


def test_inputs_equal_only_as_bytes_are_not_merged() -> None:
    # The fast encoder writes NaN as null: an input with NaN and one with null must each be decided.
    base = expand_input({"action": "job.view", "actor": "carol", "targets": [{"creator": "alice"}]})
    with_null = {**base, "params": {"x": None}}
    with_nan = {**base, "params": {"x": math.nan}}
    records = [Recorded(i, "t", doc, "allow", 0, ()) for i, doc in enumerate([with_null, with_nan])]
    report = replay(POLICIES, records, [RoleBinding("carol", "researcher", "vision")], bindings_source="x",
                    workers=1)
    assert report.unique_inputs == 2


def test_worker_count() -> None:
    assert worker_count(None, SERIAL_BELOW - 1, cpus=2) == 1  # small replays stay in process
    assert worker_count(None, SERIAL_BELOW, cpus=2) == 2
    assert worker_count(4, CHUNK + 1) == 2  # never more workers than slices
    assert worker_count(3, 0) == 1
