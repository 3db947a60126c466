"""The workload inventory (C1, R5): grouping, launcher and responsible party, scope filters, blind spots."""

from __future__ import annotations

from gateway_testkit import Api, job_spec


def submit(api: Api, who: str, **spec: object) -> str:
    r = api.post("/v1/jobs", who, json=job_spec(**spec), headers={"X-Jobgate-Trigger": "ci/nightly#42"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_workloads_group_jobs_and_list_blind_spots(api: Api) -> None:
    """C1, R5 and C4 (tracking is not stopping): tracked workloads declared not stoppable are blind spots."""
    a = submit(api, "alice", workload="sweep-7", environment="staging", dependencies=["dataset:imagenet"],
               downstream=["eval-board"], labels={"team": "x"})
    b = submit(api, "ci-bot", workload="sweep-7", environment="staging", labels={"team": "x"})
    solo = submit(api, "bob", environment="production", stoppable=False)
    ghost = submit(api, "bob", trackable=False)
    inv = api.get("/v1/inventory", "carol").json()
    by_name = {w["workload"]: w for w in inv["workloads"]}
    sweep = by_name["sweep-7"]
    assert sorted(j["id"] for j in sweep["jobs"]) == sorted([a, b])
    assert sweep["environments"] == ["staging"] and sweep["named"] is True
    assert sweep["dependencies"] == ["dataset:imagenet"] and sweep["downstream"] == ["eval-board"]
    assert {"id": "ci-bot", "kind": "service", "trigger": "ci/nightly#42", "responsible": "alice"} in sweep["launchers"]
    assert sweep["responsible"] == ["alice"] and sweep["trackable"] and sweep["stoppable"]
    assert by_name[solo]["stoppable"] is False and by_name[solo]["named"] is False
    assert inv["blind_spots"] == [{"workload": solo, "environments": ["production"], "responsible": ["bob"],
                                   "jobs": [solo], "why": inv["blind_spots"][0]["why"]}]
    assert inv["untracked"] == [ghost]

    scoped = api.get("/v1/inventory", "carol", params={"environment": "staging", "label": "team:x"}).json()
    assert [w["workload"] for w in scoped["workloads"]] == ["sweep-7"]
    assert api.get("/v1/inventory", "carol", params={"label": "team"}).status_code == 422
    # Another tenant sees none of it.
    assert api.get("/v1/inventory", "mallory").json()["workloads"] == []
