"""Red-team tests of the policy guard rails: limits from policy data, reloads, break-glass, what-if (H2, F2,
F3, M1, M2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_testkit import Api, assert_problem, job_spec, redis_server, start_api
from test_policy_reload_api import ledger

from gateway.settings import Settings


def set_limit(policy_dir: Path, name: str, value: object) -> None:
    path = policy_dir / "data.json"
    data = json.loads(path.read_text())
    data["limits"][name] = value
    path.write_text(json.dumps(data, indent=2))


def test_a_reloaded_calls_per_minute_limit_is_the_one_enforced(papi: Api, policy_dir: Path) -> None:
    set_limit(policy_dir, "calls_per_minute_per_principal", 2)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    job_id = papi.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    codes = [
        papi.post("/v1/jobs:stop", "bob", json={"ids": [job_id], "reason": "poke", "dry_run": False}).status_code
        for _ in range(3)
    ]
    r = papi.post("/v1/jobs:stop", "bob", json={"ids": [job_id], "reason": "poke"})
    assert r.status_code == 429 and "may make 2 mutating calls per minute" in r.json()["detail"], (codes, r.text)


def test_a_lowered_limit_counts_the_calls_already_made_this_minute(papi: Api, policy_dir: Path) -> None:
    """A changed number used to start a window of its own: lowering the limit in an incident gave the runaway
    script it was meant to slow a fresh minute's budget at once."""
    set_limit(policy_dir, "calls_per_minute_per_principal", 5)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    ids = [papi.post("/v1/jobs", "alice", json=job_spec()).json()["id"] for _ in range(4)]
    for job_id in ids[:3]:
        assert papi.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "runaway"}).status_code == 202
    set_limit(policy_dir, "calls_per_minute_per_principal", 3)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    r = papi.post(f"/v1/jobs/{ids[3]}/stop", "alice", json={"reason": "runaway"})
    assert r.status_code == 429 and "may make 3 mutating calls per minute" in r.json()["detail"], r.text


@pytest.mark.parametrize("value", ["sixty", True, -1, 1.5, None], ids=["text", "bool", "negative", "float", "null"])
def test_a_calls_per_minute_limit_that_is_not_a_count_is_refused_at_reload(
    papi: Api, policy_dir: Path, value: object
) -> None:
    old = papi.get("/v1/policy", "sam").json()["policy_hash"]
    set_limit(policy_dir, "calls_per_minute_per_project", value)
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert any(e.startswith("data.json:") and "calls_per_minute_per_project" in e for e in r.json()["errors"])
    assert papi.get("/v1/policy", "sam").json()["policy_hash"] == old


# -- rate limits against the emergency brake ----------------------------------------------------------------


def test_an_emergency_stop_is_not_refused_because_others_used_up_the_projects_calls(
    papi: Api, policy_dir: Path
) -> None:
    set_limit(policy_dir, "calls_per_minute_per_project", 3)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    ids = [papi.post("/v1/jobs", "alice", json=job_spec()).json()["id"] for _ in range(4)]
    for job_id in ids[:3]:  # a runaway script of alice's spends the project's calls
        assert papi.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "runaway"}).status_code == 202
    assert papi.post(f"/v1/jobs/{ids[3]}/stop", "alice", json={"reason": "runaway"}).status_code == 429
    body = {"scope": {"kind": "job", "value": ids[3]}, "trigger": "safety", "reason": "contain the runaway"}
    r = papi.post("/v1/emergency-stops", "dave", json=body)
    assert r.status_code == 201, r.text


def test_the_systems_auto_offline_reclaim_is_not_rate_limited(papi: Api, policy_dir: Path) -> None:
    from datetime import timedelta

    from gateway.jobs import runtime_limits
    from gateway.store.models import Job

    set_limit(policy_dir, "calls_per_minute_per_principal", 2)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    ids = [papi.post("/v1/jobs", "alice", json=job_spec(auto_offline=True)).json()["id"] for _ in range(3)]
    gw = papi.gateway
    with gw.db.transaction() as s:
        for job_id in ids:
            s.get(Job, job_id).valid_until = gw.clock() - timedelta(seconds=1)
    with gw.transaction() as s:
        assert sorted(runtime_limits.auto_offline(gw, s, gw.clock())) == sorted(ids)


# -- break-glass ------------------------------------------------------------------------------------------

GRANT = {
    "projects": ["vision"],
    "actions": ["job.stop", "job.view"],
    "duration_minutes": 30,
    "max_uses": 2,
    "reason": "node 7 wedged, stopping jobs by hand",
    "ticket": "INC-4242",
}


def grant(api: Api, **overrides: object) -> dict:
    r = api.post("/v1/break-glass", "dave", json={**GRANT, **overrides})
    assert r.status_code == 201, r.text
    return dict(r.json())


def with_credential(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def uses_in_ledger(api: Api, grant_id: str) -> list[dict]:
    """Every call made with the grant's credential, as the ledger shows it."""
    return [
        e["body"]
        for e in ledger(api)
        if e["kind"] == "break_glass" and e["body"].get("grant_id") == grant_id and e["body"].get("result") == "used"
    ]


def test_every_call_with_a_break_glass_credential_is_in_the_ledger_even_a_read(api: Api) -> None:
    g = grant(api)
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    r = api.client.get(f"/v1/jobs/{job_id}", headers=with_credential(g["credential"]))
    assert r.status_code == 200, r.text
    shown = next(x for x in api.get("/v1/break-glass", "dave").json()["grants"] if x["id"] == g["id"])
    assert shown["uses"] == 1
    used = uses_in_ledger(api, g["id"])
    assert [(b["use"], b["holder"], b["bypass"]) for b in used] == [(1, "dave", True)], used


def test_a_refused_call_still_spends_a_use_and_is_ledgered(api: Api) -> None:
    g = grant(api, max_uses=1)
    job_id = api.post("/v1/jobs", "mallory", json=job_spec(project="speech")).json()["id"]
    r = api.client.post(
        f"/v1/jobs/{job_id}/stop", json={"reason": "outside scope"}, headers=with_credential(g["credential"])
    )
    assert r.status_code == 403, r.text
    assert len(uses_in_ledger(api, g["id"])) == 1
    mine = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    r = api.client.post(
        f"/v1/jobs/{mine}/stop", json={"reason": "second try"}, headers=with_credential(g["credential"])
    )
    assert r.status_code == 401, r.text


def test_concurrent_calls_never_use_a_credential_more_often_than_allowed(api: Api) -> None:
    from concurrent.futures import ThreadPoolExecutor

    g = grant(api, max_uses=2)
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]

    def call(_: int) -> int:
        return api.client.get(f"/v1/jobs/{job_id}", headers=with_credential(g["credential"])).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(call, range(16)))
    assert codes == [200, 200] + [401] * 14, codes
    assert len(uses_in_ledger(api, g["id"])) == 2


# -- what-if against the real path ------------------------------------------------------------------------


def test_whatif_under_the_active_set_flips_nothing_a_break_glass_call_decided(api: Api) -> None:
    from gateway.decisions.policy.whatif import records_from_entries, replay
    from gateway.decisions.policy_sync import load_bindings
    from gateway.store.models import Job

    g = grant(api)
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.placement = "running", [{"node": "demo-node-1", "gpus": [0, 1]}]
    r = api.client.post(f"/v1/jobs/{job_id}/stop", json={"reason": "wedged"}, headers=with_credential(g["credential"]))
    assert r.status_code == 202 and r.json()["decision"]["effect"] == "allow", r.text
    with api.gateway.db.transaction() as s:
        bindings = load_bindings(s)
    report = replay(
        api.settings.policies_dir, records_from_entries(ledger(api)), bindings, bindings_source="test", workers=1
    )
    assert report.replayed >= 2
    assert report.flips == [], [f.to_json() for f in report.flips]


# -- data.json values the Rego rules read -----------------------------------------------------------------


def set_data(policy_dir: Path, path: tuple[str, ...], value: object) -> None:
    file = policy_dir / "data.json"
    data = json.loads(file.read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is _MISSING:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    file.write_text(json.dumps(data, indent=2))


_MISSING = object()


def test_an_emergency_approval_count_given_as_text_does_not_let_a_workload_stop_run_alone(
    papi: Api, policy_dir: Path
) -> None:
    set_data(policy_dir, ("emergency", "approvals", "workload"), "1")
    papi.post("/v1/policy/reload", "sam")
    for _ in range(2):
        papi.post("/v1/jobs", "alice", json=job_spec(workload="sweep-7"))
    body = {"scope": {"kind": "workload", "value": "sweep-7"}, "trigger": "safety", "reason": "bad sweep"}
    r = papi.post("/v1/emergency-stops", "dave", json=body)
    assert r.status_code in (202, 403), r.text


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("emergency", "max_targets"), "5000"),
        (("emergency", "max_targets"), _MISSING),
        (("emergency", "approvals", "workload"), "1"),
        (("emergency", "approvals", "scope"), True),
        (("emergency", "approvals"), _MISSING),
    ],
    ids=["ceiling-text", "ceiling-missing", "workload-text", "scope-bool", "approvals-missing"],
)
def test_emergency_numbers_that_are_not_counts_are_refused_at_reload(
    papi: Api, policy_dir: Path, path: tuple[str, ...], value: object
) -> None:
    old = papi.get("/v1/policy", "sam").json()["policy_hash"]
    set_data(policy_dir, path, value)
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert any(e.startswith("data.json:") and "emergency." in e for e in r.json()["errors"]), r.json()["errors"]
    assert papi.get("/v1/policy", "sam").json()["policy_hash"] == old


def test_a_bad_nested_number_is_reported_on_its_own_line(tmp_path: Path) -> None:
    from gateway.decisions.policy.loader import parse_data
    from gateway.settings import REPO_POLICIES

    data = json.loads((REPO_POLICIES / "data.json").read_text())
    data["emergency"]["approvals"]["workload"] = "1"
    text = json.dumps(data, indent=2)
    (problem,) = parse_data(text)[1]
    assert text.splitlines()[problem.line - 1].strip().startswith('"workload": "1"'), problem


# -- reloads of files that cannot be read -----------------------------------------------------------------


def _bad_bytes(policy_dir: Path) -> str:
    (policy_dir / "guards.rego").write_bytes((policy_dir / "guards.rego").read_bytes() + b"\n# caf\xe9\n")
    return "guards.rego"


def _bad_bytes_in_data(policy_dir: Path) -> str:
    (policy_dir / "data.json").write_bytes(b'{"about": "\xff"}')
    return "data.json"


def _directory_named_rego(policy_dir: Path) -> str:
    (policy_dir / "extra.rego").mkdir()
    (policy_dir / "extra.rego" / "notes.txt").write_text("a reviewer's notes\n")  # the set's hash changes
    return "extra.rego"


@pytest.mark.parametrize(
    "spoil",
    [_bad_bytes, _bad_bytes_in_data, _directory_named_rego],
    ids=["latin1-rego", "latin1-data", "dir-named-rego"],
)
def test_a_policy_file_that_cannot_be_read_is_refused_with_its_name_and_ledgered(
    papi: Api, policy_dir: Path, spoil: object
) -> None:
    old = papi.get("/v1/policy", "sam").json()["policy_hash"]
    name = spoil(policy_dir)  # type: ignore[operator]
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert any(e.startswith(f"{name}:") for e in r.json()["errors"]), r.json()["errors"]
    assert papi.get("/v1/policy", "sam").json()["policy_hash"] == old
    assert [e["body"]["result"] for e in ledger(papi) if e["kind"] == "policy"] == ["loaded", "refused"]


@pytest.mark.parametrize(
    "case",
    [
        '{name: odd input, row: A1, input: "oops", expect: {effect: allow}}',
        "{name: odd target, row: A1, input: {action: job.view, actor: alice, targets: [7]}, expect: {effect: deny}}",
        "{name: odd copies, row: A1, input: {action: job.view, actor: alice, targets: [{copies: many}]},"
        " expect: {effect: deny}}",
        "{name: odd expect, row: A1, input: {action: job.view, actor: alice}, expect: allow}",
        "{name: odd rules, row: A1, input: {action: job.view, actor: alice}, expect: {effect: deny, rules: 5}}",
        "{name: [a, list], row: A1, input: {action: job.view, actor: alice}, expect: {effect: deny}}",
        "{name: odd approvals, row: A1, input: {action: job.view, actor: alice, approvals: [1]},"
        " expect: {effect: deny}}",
    ],
    ids=["input", "target", "copies", "expect", "rules", "name", "approvals"],
)
def test_a_malformed_table_case_refuses_the_set_with_its_file(papi: Api, policy_dir: Path, case: str) -> None:
    (policy_dir / "tests" / "extra.yaml").write_text(f"- {case}\n")
    r = papi.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert any(e.startswith("tests/extra.yaml:") for e in r.json()["errors"]), r.json()["errors"]


# -- batches naming a job that already ended ----------------------------------------------------------------


def _one_pending_one_stopped(api: Api) -> tuple[str, str]:
    pending = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    ended = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    assert api.post(f"/v1/jobs/{ended}/stop", "alice", json={"reason": "done"}).status_code == 202
    return pending, ended


@pytest.mark.parametrize(
    ("route", "extra"), [("/v1/jobs:stop", {}), ("/v1/jobs:reprioritize", {"priority": 77})], ids=["stop", "priority"]
)
def test_a_batch_naming_an_ended_job_is_refused_before_it_is_decided_and_claims_nothing(
    api: Api, route: str, extra: dict
) -> None:
    pending, ended = _one_pending_one_stopped(api)
    before = len(ledger(api))
    r = api.post(route, "alice", json={"ids": [pending, ended], "reason": "cleanup", **extra})
    assert r.status_code == 409 and ended in r.json()["detail"], r.text
    after = ledger(api)[before:]
    # No decision claiming the batch (an allow without an outcome): only the refused attempt.
    assert [e["kind"] for e in after] == ["refusal"], [(e["kind"], e["body"].get("result")) for e in after]
    assert api.get(f"/v1/jobs/{pending}", "alice").json()["state"] == "pending"
    dry = api.post(route, "alice", json={"ids": [pending, ended], "reason": "cleanup", "dry_run": True, **extra})
    assert dry.status_code == 409, dry.text  # the dry run says what the real call would


def test_calls_racing_from_threads_never_pass_the_per_minute_limit(papi: Api, policy_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    set_limit(policy_dir, "calls_per_minute_per_principal", 5)
    assert papi.post("/v1/policy/reload", "sam").status_code == 200
    job_id = papi.post("/v1/jobs", "alice", json=job_spec()).json()["id"]

    def call(_: int) -> str:
        r = papi.post(f"/v1/jobs/{job_id}/priority", "bob", json={"priority": 3, "reason": "race"})
        return "rate" if "H2.rate_limit" in r.json().get("rules", []) else str(r.status_code)

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(call, range(20)))
    assert outcomes.count("rate") == 15, outcomes


def test_rate_limit_counts_that_cannot_be_read_refuse_the_call_in_the_ledger(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: Redis is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(data_dir=tmp_path, rate_limit_storage=f"redis://127.0.0.1:{port}", policy_watch_interval_s=0)
    for api in start_api(settings):
        job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        r = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
        # Not the caller's doing, and gone once Redis is back: a 503, not a 403 that says "never".
        assert_problem(r, 503, "rate-limit-unavailable", "counts are unavailable")
        assert r.json()["rules"] == ["H2.rate_limit"]
        decision = next(e for e in ledger(api) if e["seq"] == r.json()["ledger_seq"])["body"]["decision"]
        assert decision["effect"] == "deny"
        assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "pending"


# -- jobgate up with a policy set or a limit storage it cannot use ------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"JOBGATE_RATE_LIMIT_STORAGE": "bogus://x"}, "rate limit storage"),
        ({"JOBGATE_POLICIES_DIR": "{broken}"}, "guards.rego:"),
    ],
    ids=["storage", "policies"],
)
def test_up_refuses_in_one_line_what_it_cannot_start_with(tmp_path: Path, env: dict[str, str], says: str) -> None:
    import shutil

    from click.testing import CliRunner

    from gateway.cli.main import cli
    from gateway.settings import REPO_POLICIES

    broken = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, broken)
    (broken / "guards.rego").write_text((broken / "guards.rego").read_text() + "\nbroken if {\n")
    env = {k: v.format(broken=broken) for k, v in env.items()}
    result = CliRunner().invoke(cli, ["up", "--data-dir", str(tmp_path / "var"), "--port", str(_free_port())], env=env)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and says in errors[0], result.output


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as (url, _):
        yield url


def test_replicas_sharing_redis_count_a_principals_calls_together(redis_url: str) -> None:
    from gateway.decisions.ratelimit import RateLimiter

    numbers = {"calls_per_minute_per_principal": 3, "calls_per_minute_per_project": 100}
    one, other = RateLimiter(redis_url, numbers), RateLimiter(redis_url, numbers)  # two gateway replicas
    breaches = [limiter.hit("bob", ["vision"]) for limiter in (one, other, one, other)]
    assert breaches[:3] == [None, None, None] and breaches[3] is not None, breaches
    assert "principal bob may make 3 mutating calls per minute" in breaches[3].sentence()


def test_replicas_sharing_redis_count_the_minutes_calls_under_a_lowered_limit(redis_url: str) -> None:
    from gateway.decisions.ratelimit import RateLimiter

    numbers = {"calls_per_minute_per_principal": 5, "calls_per_minute_per_project": 100}
    one, other = RateLimiter(redis_url, numbers), RateLimiter(redis_url, numbers)
    assert [limiter.hit("bob", ["vision"]) for limiter in (one, other, one)] == [None, None, None]
    for limiter in (one, other):  # the reload reaches every replica
        limiter.configure({**numbers, "calls_per_minute_per_principal": 3})
    breach = other.hit("bob", ["vision"])
    assert breach is not None and "may make 3 mutating calls per minute" in breach.sentence()


# -- H2: a cross-project batch needs one approval more than the same batch in one project -------------------


def test_a_cross_project_batch_needs_one_approval_more_than_a_one_project_batch(api: Api) -> None:
    vision = [api.post("/v1/jobs", "alice", json=job_spec()).json()["id"] for _ in range(3)]
    speech = api.post("/v1/jobs", "mallory", json=job_spec(project="speech")).json()["id"]

    def required(ids: list[str]) -> int:
        r = api.post("/v1/jobs:stop", "dave", json={"ids": ids, "reason": "drain", "dry_run": True})
        assert r.status_code == 202 and r.json()["decision"]["effect"] == "needs_approval", r.text
        return int(r.json()["decision"]["approvals_required"]["count"])

    assert required([vision[0], speech]) == required(vision[:2]) + 1
    assert required([*vision[:2], speech]) == required(vision) + 1


def test_a_batch_stop_naming_a_paused_job_is_refused_before_it_is_decided(api: Api) -> None:
    """A paused job is no more stoppable by a batch than by its own route (409): decided first, the batch was
    ledgered as allowed and then failed on that job, an allow without an outcome."""
    pending = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    paused = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    assert api.post(f"/v1/jobs/{paused}/pause", "alice", json={"reason": "later"}).status_code == 202
    assert api.get(f"/v1/jobs/{paused}", "alice").json()["state"] == "paused"
    before = len(ledger(api))
    r = api.post("/v1/jobs:stop", "alice", json={"ids": [pending, paused], "reason": "cleanup"})
    assert r.status_code == 409 and paused in r.json()["detail"], r.text
    after = ledger(api)[before:]
    # No decision claiming the batch (an allow without an outcome): only the refused attempt.
    assert [e["kind"] for e in after] == ["refusal"], [(e["kind"], e["body"].get("result")) for e in after]
    assert api.get(f"/v1/jobs/{pending}", "alice").json()["state"] == "pending"
