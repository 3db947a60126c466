"""Red team: the forensics bundle (F4) as the auditor reads it: what it freezes and what it claims."""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway_testkit import Api
from stop_helpers import FakeAgent, running_job, stopped_evidence

from gateway.store.models import Job

CKPT = [{"path": "checkpoints/step-100.ckpt", "size": 4096, "mtime": 1700000000.25, "sha256": "ab" * 32}]


def section(api: Api, job_id: str, name: str) -> Any:
    """Export the job's forensics bundle as the auditor and return one frozen section's data."""
    r = api.post("/v1/forensics/exports", "audrey", json={"job_id": job_id})
    assert r.status_code == 200, r.text
    lines = r.content.decode().splitlines()
    entries = [json.loads(line.split(" ", 2)[2]) for line in lines[1:] if line[:1].isdigit()]
    blobs = {b["blob"]: base64.b64decode(b["data"]) for b in [json.loads(x) for x in lines if x.startswith('{"blob"')]}
    entry = [e for e in entries if e["kind"] == "forensics" and e["body"]["section"] == name][-1]  # this export's
    return json.loads(blobs[entry["blobs"][name].removeprefix("sha256:")])


def test_integrity_does_not_cry_tamper_for_a_paused_job_later_cancelled_in_the_queue(api: Api,
                                                                                     agent: FakeAgent) -> None:
    """A paused job's evidence is ledgered; resumed and then stopped while still queued, its business-DB evidence
    becomes a note with no ledgered blob. The integrity section compared the DB evidence with the last ledgered
    evidence blob and said db_matches_ledger: false, an accusation of tampering in the frozen record; and the
    checkpoint the paused run wrote (with its write time) was no longer listed at all."""
    job_id, _ = running_job(api, agent)
    assert api.post(f"/v1/jobs/{job_id}/pause", "alice", json={"reason": "make room"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))
    assert api.post(f"/v1/jobs/{job_id}/resume", "alice", json={"reason": "back"}).status_code == 200
    r = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "not needed after all"})
    assert r.status_code in (200, 202), r.text
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stopped"
    integrity = section(api, job_id, "checkpoint_integrity")[job_id]
    assert integrity["db_matches_ledger"] is not False, integrity
    (ckpt,) = integrity["checkpoints"]
    assert (ckpt["path"], ckpt["sha256"], ckpt["size"]) == (CKPT[0]["path"], CKPT[0]["sha256"], 4096)
    assert ckpt["mtime"] == 1700000000.25 and ckpt["written_at"].startswith("2023-11-14T22:13:20.25")


def _stopped(api: Api, agent: FakeAgent, checkpoints: list[dict[str, Any]]) -> str:
    job_id, _ = running_job(api, agent)
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done with it"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=checkpoints))
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stopped"
    return job_id


def test_integrity_still_catches_a_checkpoint_record_changed_in_the_business_db(api: Api, agent: FakeAgent) -> None:
    job_id = _stopped(api, agent, CKPT)
    assert section(api, job_id, "checkpoint_integrity")[job_id]["db_matches_ledger"] is True
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        (node,) = job.evidence["nodes"]
        forged = [{**CKPT[0], "sha256": "cd" * 32}]
        job.evidence = {**job.evidence, "nodes": {node: {**job.evidence["nodes"][node], "checkpoints": forged}}}
    integrity = section(api, job_id, "checkpoint_integrity")[job_id]
    assert integrity["db_matches_ledger"] is False
    assert {(c["sha256"], c["in_ledger"], c["in_db"]) for c in integrity["checkpoints"]} == {
        ("ab" * 32, True, False), ("cd" * 32, False, True)}


def test_odd_checkpoint_records_from_a_node_do_not_break_the_export(api: Api, agent: FakeAgent) -> None:
    job_id = _stopped(api, agent, [{"path": ["a", "b"], "mtime": "yesterday", "size": None}, {"mtime": 1e300}])
    listed = section(api, job_id, "checkpoint_integrity")[job_id]["checkpoints"]
    assert [c["written_at"] for c in listed] == [None, None]
