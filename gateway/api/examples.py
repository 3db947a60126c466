"""An example request body for every operation that changes something, as /docs shows it ("Try it out" starts
from it) and as a client would send it: values the route accepts, in the demo organisation's words.

Kept in one table, keyed by the operation, rather than on the models, because one model serves several
operations (a reason to pause is not a reason to delete). openapi_doc.document puts each one into its
operation; tests/gateway/api/test_openapi_docs.py checks that every mutating operation with a body has one and
that the route accepts it.
"""

from __future__ import annotations

from typing import Any

JOB_ID = "j-0193f2a4c1e5d2b8f4a1"  # the shape of a job id: time-ordered, random, never reused (R1)

EXAMPLES: dict[str, Any] = {
    "POST /v1/jobs": {
        "name": "resnet50-lr0.1", "project": "vision", "queue": "normal", "gpus_per_node": 2, "nodes": 1,
        "command": ["python3", "train.py", "--lr", "0.1"], "runtime_limit_seconds": 14400,
        "labels": {"sweep": "lr"}, "workload": "lr-sweep"},
    "POST /v1/jobs/{job_id}/stop": {"reason": "done for today; checkpoint is written", "ticket": "OPS-118"},
    "DELETE /v1/jobs/{job_id}": {"reason": "results copied out; free the artifact storage"},
    "POST /v1/jobs/{job_id}/pause": {"reason": "fix the data loader, then resume"},
    "POST /v1/jobs/{job_id}/resume": {"reason": "data loader fixed"},
    "POST /v1/jobs/{job_id}/undelete": {"reason": "deleted the wrong job; its checkpoints are still needed"},
    "POST /v1/jobs/{job_id}/confirm-stopped": {"reason": "node 7 powered off by hand; no process left",
                                               "ticket": "INC-4242"},
    "POST /v1/jobs/{job_id}/priority": {"priority": 100, "reason": "giving way to the urgent evaluation"},
    "POST /v1/jobs/{job_id}/renew": {"progress": "epoch 7 of 10, loss still falling",
                                     "expected_remaining_seconds": 5400},
    "POST /v1/jobs:stop": {"selector": {"project": "vision", "labels": {"sweep": "lr"}},
                           "reason": "bad learning-rate grid", "dry_run": True},
    "POST /v1/jobs:reprioritize": {"ids": [JOB_ID], "priority": 42, "reason": "deadline tomorrow"},
    "POST /v1/approvals/{approval_id}/approve": {"comment": "checkpointed; fine to stop"},
    "POST /v1/approvals/{approval_id}/reject": {"reason": "the job finishes within the hour"},
    "POST /v1/emergency-stops": {
        "scope": {"kind": "environment", "value": "staging"}, "trigger": "security",
        "reason": "leaked credentials in the staging image", "grace_seconds": 0, "ticket": "SEC-77"},
    "POST /v1/emergency-stops/{emergency_id}/lift": {"reason": "credentials rotated, image rebuilt"},
    "POST /v1/break-glass": {
        "projects": ["vision"], "actions": ["job.stop"], "duration_minutes": 30, "max_uses": 3,
        "reason": "node 7 wedged; stopping its jobs by hand", "ticket": "INC-4242"},
    "POST /v1/tokens": {"principal": "sweep-bot", "purpose": "lr sweep", "projects": ["vision"],
                        "actions": ["job.submit"], "expires_in_days": 30},
    "POST /v1/tokens/{token_id}/revoke": {"reason": "the sweep is over"},
    "POST /v1/nodes": {"id": "gpu-node-17", "gpus": 8},
    "POST /v1/service-accounts": {"name": "sweep-bot", "project": "vision",
                                  "description": "nightly hyper-parameter sweep"},
    "PUT /v1/quotas/{project}": {"gpus": 16, "borrow_limit": 4, "reason": "two more nodes for the vision team",
                                 "effective_from": "2026-12-01T00:00:00Z", "effective_until": "2027-03-01T00:00:00Z"},
    "POST /v1/mounts": {"name": "imagenet", "kind": "dataset", "path": "/datasets/imagenet",
                        "projects": ["vision"]},
    "POST /v1/roles": {"principal": "bob", "role": "queue_admin", "project": "vision",
                       "reason": "carol on leave for two weeks"},
    "POST /v1/roles:revoke": {"principal": "bob", "role": "queue_admin", "project": "vision",
                              "reason": "carol is back"},
    "POST /v1/forensics/exports": {"job_id": JOB_ID},
    # The node agents' own channel (the agent sends these; shown for who writes another agent).
    "POST /v1/agents/{node_id}/heartbeat": {"gpus": 8, "running": [], "version": "0.1.0"},
    "POST /v1/agents/{node_id}/reports": {"reports": [{
        "job_id": JOB_ID, "nonce": "c1f0e2", "event": "stopped", "at": 1796000000.0, "pid": 41213,
        "evidence": {"exit_code": 0, "graceful": True}}]},
}
