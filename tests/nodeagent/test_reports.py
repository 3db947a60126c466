"""Reports fit what the gateway takes: evidence lists cut to a byte budget, batches sized in bytes."""

from __future__ import annotations

from typing import Any

from nodeagent.reports import bounded, next_batch, size_of


def stopped(files: int, log_lines: int = 20) -> dict[str, Any]:
    artifacts = [{"path": f"checkpoints/shard-{i:07d}.pt", "size": 1 << 30, "mtime": 1.5e9, "sha256": "ab" * 32}
                 for i in range(files)]
    return {"job_id": "train-1", "nonce": "n", "event": "stopped", "at": 1.7e9, "pid": 42, "detail": "",
            "evidence": {"outcome": "graceful", "exit_code": 0, "process_group_gone": True,
                         "checkpoints": artifacts[-3:], "artifacts": artifacts, "log_tail": ["x" * 100] * log_lines}}


def test_a_report_that_fits_is_left_as_it_is() -> None:
    report = stopped(100)
    assert bounded(report, 1 << 20) is report


def test_a_job_with_more_files_than_fit_gets_a_report_that_fits_and_says_how_many_were_left_out() -> None:
    report = stopped(50_000)  # about 7 MB of file records
    cut = bounded(report, 1 << 20)
    assert size_of(cut) <= 1 << 20 < size_of(report)
    ev = cut["evidence"]
    assert ev["truncated"] == {"artifacts": 50_000}
    kept = len(ev["artifacts"])
    assert 0 < kept < 50_000 and ev["artifacts"] == report["evidence"]["artifacts"][:kept]
    # What decides the stop's outcome is kept whole, and the caller's report is not changed.
    assert (ev["outcome"], ev["exit_code"], ev["process_group_gone"]) == ("graceful", 0, True)
    assert len(ev["checkpoints"]) == 3
    assert len(report["evidence"]["artifacts"]) == 50_000 and "truncated" not in report["evidence"]


def test_batches_hold_at_least_one_report_and_stay_within_the_byte_and_count_budgets() -> None:
    small, large = stopped(1), stopped(2_000)
    assert len(next_batch([small] * 500)) == 100
    budget = 2 * size_of(large) + 10
    assert next_batch([large, large, large, small], max_bytes=budget) == [large, large]
    assert next_batch([large, small], max_bytes=10) == [large]  # one report always goes, or it would never
    assert next_batch([]) == []
