"""Red team: the audit fields the action matrix asks of each entry (A5, A6, A8, H3), read as the auditor."""

from __future__ import annotations

from typing import Any

from gateway_testkit import Api, job_spec

from gateway.store.models import Job


def _entries(api: Api, **filters: str) -> list[dict[str, Any]]:
    """Full entries the auditor finds through the API, oldest first."""
    found = api.get("/v1/audit/entries", "audrey", params=filters).json()["entries"]
    return [api.get(f"/v1/audit/entries/{e['seq']}", "audrey").json()["entry"] for e in reversed(found)]


def test_stopping_a_job_a_pipeline_started_records_the_pipeline_and_its_submitter(api: Api) -> None:
    """A8: the entry that decides the stop of a service account's job must say which pipeline run started it
    and which person submitted it through that account, beside the stop call's own source. The decision named
    the target's creator (the service account) only; its trigger and responsible person were in the submission
    entry alone, so an auditor reading the stop could not tell which pipeline run it cut short."""
    job_id = api.post("/v1/jobs", "ci-bot", json=job_spec(), headers={"X-Jobgate-Trigger": "ci/nightly#7"}).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.placement = "running", [{"node": "demo-node-1", "gpus": [0, 1]}]
    r = api.post(f"/v1/jobs/{job_id}/stop", "dave", json={"reason": "runaway pipeline"})
    assert r.status_code == 202, r.text
    decisions = [e["body"] for e in _entries(api, job=job_id, kind="decision")]
    (stop,) = [d for d in decisions if d["input"]["action"] == "job.stop"]
    assert stop["decision"]["rules"] == ["A8.service_job"]
    (target,) = stop["input"]["targets"]
    assert (target["creator"], target["creator_kind"]) == ("ci-bot", "service")
    assert target["submitted_via"] == {"trigger": "ci/nightly#7", "responsible": "alice"}
    assert stop["source"]["script"] is True and stop["actor"]["real_identity"] == "dave"


def test_a_pause_records_the_checkpoint_retention_and_the_resume_priority_rule(api: Api) -> None:
    """A5: the entry of a pause must state how long the checkpoint it keeps is retained and which version of the
    resume-priority algorithm the job will come back under. The pause decision carried neither: the retention
    was ledgered only once the node's evidence came back (never, if it did not), and the rule only at resume."""
    from gateway.jobs import lifecycle

    job_id = api.post("/v1/jobs", "alice", json=job_spec(labels={"retention": "important"})).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.placement = "running", [{"node": "demo-node-1", "gpus": [0, 1]}]
    r = api.post(f"/v1/jobs/{job_id}/pause", "dave", json={"reason": "node maintenance"})
    assert r.status_code == 202, r.text
    decisions = [e["body"] for e in _entries(api, job=job_id, kind="decision")]
    (pause,) = [d for d in decisions if d["input"]["action"] == "job.pause"]
    params = pause["input"]["params"]
    assert params["resume_priority_rule"] == lifecycle.RESUME_PRIORITY_RULE
    assert params["checkpoint_retention"] == {
        "tier": "important", "keep": f"{lifecycle.retention.important_days(api.gateway)} days after the job stops"}
