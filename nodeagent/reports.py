"""Reports sized so the gateway can always take them.

A report waits in the outbox until the gateway acknowledges it, oldest first; one the gateway can never
take would hold back every report behind it. Stop and delete evidence lists files, and a job decides how
many files it writes, so a report's lists are cut to fit a byte budget (saying how many entries were left
out) and batches are sized in bytes as well as in reports. The gateway takes up to 16 MiB per call from a
node agent (gateway/api/body_limit.py); these budgets stay well inside it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_REPORT_BYTES = 4 << 20
MAX_BATCH_BYTES = 8 << 20
MAX_BATCH_REPORTS = 100


def size_of(report: dict[str, Any]) -> int:
    return len(json.dumps(report, separators=(",", ":")))


def bounded(report: dict[str, Any], limit: int = MAX_REPORT_BYTES) -> dict[str, Any]:
    """The report itself if it fits in `limit` bytes; otherwise a copy whose longest evidence lists are
    halved until it does, with `evidence.truncated` giving each cut list's full length."""
    evidence = report.get("evidence")
    if size_of(report) <= limit or not isinstance(evidence, dict):
        return report
    evidence = dict(evidence)
    truncated: dict[str, int] = {}
    out = {**report, "evidence": evidence}
    while size_of(out) > limit:
        lists = [k for k, v in evidence.items() if isinstance(v, list) and v]
        if not lists:
            break  # nothing left to cut; the gateway's refusal will say why
        longest = max(lists, key=lambda k: size_of({"v": evidence[k]}))
        truncated.setdefault(longest, len(evidence[longest]))
        evidence[longest] = evidence[longest][: len(evidence[longest]) // 2]
        evidence["truncated"] = truncated
    return out


def next_batch(pending: list[dict[str, Any]], max_reports: int = MAX_BATCH_REPORTS,
               max_bytes: int = MAX_BATCH_BYTES) -> list[dict[str, Any]]:
    """The oldest reports that fit in one call: at least one, at most `max_reports` and `max_bytes`."""
    batch: list[dict[str, Any]] = []
    total = 0
    for report in pending[:max_reports]:
        total += size_of(report) + 1
        if batch and total > max_bytes:
            break
        batch.append(report)
    return batch
