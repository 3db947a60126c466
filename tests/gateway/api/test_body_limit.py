"""Request bodies have a ceiling (1 MiB; 16 MiB for node agents), enforced before and while they are read."""

from __future__ import annotations

import json
from collections.abc import Iterator

from gateway_testkit import Api, assert_problem, job_spec

from gateway.api.body_limit import MAX_AGENT_BODY_BYTES, MAX_BODY_BYTES


def over(limit: int) -> bytes:
    """A well-formed job spec padded past `limit` bytes."""
    spec = job_spec(env={"PAD": "x" * 32768})
    spec["command"] = ["true", *(["y" * 32768] * (limit // 32768 + 1))]
    return json.dumps(spec).encode()


def chunks(body: bytes, size: int = 65536) -> Iterator[bytes]:
    """Sent without a Content-Length (chunked), so the gateway can only count."""
    for i in range(0, len(body), size):
        yield body[i:i + size]


def test_a_declared_length_over_the_ceiling_is_refused_before_anything_is_read(api: Api) -> None:
    r = api.client.post("/v1/jobs", content=over(MAX_BODY_BYTES), headers={"Content-Type": "application/json"})
    assert_problem(r, 413, "body-too-large", f"larger than {MAX_BODY_BYTES:,} bytes")
    assert api.get("/v1/jobs", "alice").json()["jobs"] == []


def test_a_chunked_body_is_counted_and_refused_at_the_ceiling_and_nothing_is_submitted(api: Api) -> None:
    r = api.client.post("/v1/jobs", content=chunks(over(MAX_BODY_BYTES)),
                        headers=api.headers("alice", **{"Content-Type": "application/json"}))
    assert "content-length" not in r.request.headers
    assert_problem(r, 413, "body-too-large", f"larger than {MAX_BODY_BYTES:,} bytes")
    assert api.get("/v1/jobs", "alice").json()["jobs"] == []


def test_node_agents_may_send_more_for_stop_evidence_but_not_without_bound(api: Api) -> None:
    token = (api.settings.data_dir / "agents" / "demo-node-1" / "state" / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def heartbeat(pad: int) -> bytes:
        running = [{"job_id": f"j-{i}", "pad": "x" * pad} for i in range(1000)]
        return json.dumps({"gpus": 8, "running": running}).encode()

    big = heartbeat(2 * MAX_BODY_BYTES // 1000)
    assert MAX_BODY_BYTES < len(big) < MAX_AGENT_BODY_BYTES
    r = api.client.post("/v1/agents/demo-node-1/heartbeat", content=big, headers=headers)
    assert r.status_code == 200, r.text
    r = api.client.post("/v1/agents/demo-node-1/heartbeat", content=heartbeat(MAX_AGENT_BODY_BYTES // 1000),
                        headers=headers)
    assert_problem(r, 413, "body-too-large", f"larger than {MAX_AGENT_BODY_BYTES:,} bytes")
