"""The API answers what its OpenAPI document says (schemathesis over /openapi.json): no answer is a server error,
carries a status code its operation does not document, or breaks the schema documented for it.

Every operation is called with generated requests, valid and invalid, as a few of the demo cast (a researcher,
another tenant, on-call, the auditor, a node agent), with ids that exist (jobs in each state a route acts on)
and ids that do not; and with a few requests written out that reach the answers generation seldom does: a
second person asked for (202), an external-rights job, a ledger that cannot be written (503).

Bounded to about a minute of CPU on the 2-core machine: EXAMPLES per operation, no deadline per example (wall
time is not asserted), a fixed seed and derandomized generation, so every run sends the same requests; no
Hypothesis database is written. Schemathesis is driven through its Python API (its pytest plugin does not run
under pytest 9).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from gateway_testkit import Api, job_spec, path_objects
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings
from gateway.store.models import Job, Project
from ledger.errors import StoreError

pytestmark = pytest.mark.integration

EXAMPLES = 20  # generated requests per operation
PERSONAS = ("alice", "mallory", "dave", "audrey", "node")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CONFIG = SchemathesisConfig.from_dict({
    "seed": 31,
    "generation": {"deterministic": True, "database": "none"},
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
})
REASON = {"reason": "checking the documented answers"}


@dataclass(frozen=True)
class Served:
    api: Api
    objects: dict[str, str]  # real objects by name (path_objects' names, and jobs by state)
    schema: Any

    def candidates(self, param: str) -> list[str]:
        """The real objects a path parameter may name: every job for job_id."""
        if param == "job_id":
            return [v for k, v in self.objects.items() if k == "job_id" or k.startswith("job ")]
        return [self.objects[param]] if param in self.objects else []


def _jobs_by_state(api: Api, workload: str) -> dict[str, str]:
    """Jobs of alice's in `workload`, one in each state a route acts on, and the same for jobs whose rights
    holder is another organisation's (R3: a second person for more): `job STATE [external]`."""
    with api.gateway.db.transaction() as s:
        if s.get(Project, "partner") is None:
            s.add(Project(id="partner", organisation="other-org", description="an external rights holder"))
    jobs = {}
    for rights_holder in ("vision", "partner"):
        for state in ("running", "stopped", "paused", "stop_failed", "pending"):
            job_id = api.post("/v1/jobs", "alice", json=job_spec(workload=workload,
                                                                 rights_holder=rights_holder)).json()["id"]
            with api.gateway.db.transaction() as s:
                s.get(Job, job_id).state = state
            jobs[f"job {state}" + (" external" if rights_holder == "partner" else "")] = job_id
    return jobs


def _real_objects(api: Api) -> dict[str, str]:
    """gateway_testkit.path_objects (`job_id` running, with a stop awaiting approval) and _jobs_by_state."""
    return {**path_objects(api), "seq": "5", **_jobs_by_state(api, "generated")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One demo gateway for every operation (SQLite: which store is behind the API is the other tests'
    business), run by schemathesis' own ASGI client, which starts its lifespan once and keeps it until
    shutdown_lifespans(); a node agent's token among the cast."""
    data_dir = tmp_path_factory.mktemp("openapi")
    settings = Settings(data_dir=data_dir)
    prepare_demo(settings)
    tokens = json.loads((data_dir / "demo-tokens.json").read_text())
    tokens["node"] = (data_dir / "agents" / "demo-node-1" / "state" / "token").read_text().strip()
    app = create_app(settings, run_scheduler=False)
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
        with asgi.get_client(app) as client:
            api = Api(client, tokens, settings)  # type: ignore[arg-type]  # a requests.Session, not a TestClient
            yield Served(api, _real_objects(api), schema)
    finally:
        asgi.shutdown_lifespans()


# Every operation of the document, read from an app that is built but not started (no gateway behind it).
OPERATIONS = [(method.upper(), path) for path, ops in create_app(Settings()).openapi()["paths"].items()
              for method in ops]


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_generated_requests_get_documented_answers(served: Served, method: str, path: str) -> None:
    operation = served.schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases, persona=st.sampled_from(PERSONAS), real_ids=st.booleans(), data=st.data())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    def answers_as_documented(case: Any, persona: str, real_ids: bool, data: st.DataObject) -> None:
        if real_ids and case.path_parameters:
            case.path_parameters = {
                k: data.draw(st.sampled_from(served.candidates(k)), label=k) if served.candidates(k) else v
                for k, v in case.path_parameters.items()}
        case.call_and_validate(headers=served.api.headers(persona), checks=CHECKS)

    answers_as_documented()


# (method, path, who, path parameters by object name, body, the status it reaches): the answers generated
# requests seldom reach, each checked against the document like the generated ones. Objects are made for them
# (_jobs_by_state); `approval` is the one the last 202 opened.
WRITTEN: list[tuple[str, str, str, dict[str, str], Any, int]] = [
    ("POST", "/v1/jobs", "alice", {}, job_spec(), 201),
    ("POST", "/v1/jobs/{job_id}/stop", "carol", {"job_id": "job pending"}, REASON, 202),
    ("POST", "/v1/approvals/{approval_id}/approve", "alice", {"approval_id": "approval"}, None, 200),
    ("POST", "/v1/jobs:stop", "alice", {}, {"ids": ["{job running}"], **REASON}, 202),
    ("POST", "/v1/jobs/{job_id}/priority", "carol", {"job_id": "job running external"}, {"priority": 900, **REASON},
     202),
    ("DELETE", "/v1/jobs/{job_id}", "alice", {"job_id": "job stopped"}, REASON, 202),
    ("POST", "/v1/jobs/{job_id}/resume", "alice", {"job_id": "job paused"}, None, 200),
    ("POST", "/v1/jobs/{job_id}/resume", "alice", {"job_id": "job paused external"}, None, 202),
    ("POST", "/v1/jobs/{job_id}/confirm-stopped", "dave", {"job_id": "job stop_failed"}, REASON, 200),
    ("POST", "/v1/jobs/{job_id}/confirm-stopped", "dave", {"job_id": "job stop_failed external"}, REASON, 202),
    ("POST", "/v1/emergency-stops", "dave", {},
     {"scope": {"kind": "job", "value": "{job running}"}, "trigger": "safety", **REASON}, 201),
    ("POST", "/v1/emergency-stops", "dave", {},
     {"scope": {"kind": "workload", "value": "written"}, "trigger": "safety", **REASON}, 202),
    ("PUT", "/v1/quotas/{project}", "erin", {"project": "project"}, {"gpus": 8, **REASON}, 202),
]


def _named(value: Any, objects: dict[str, str]) -> Any:
    """`{name}` in a body is the real object of that name."""
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return objects[value[1:-1]]
    if isinstance(value, dict):
        return {k: _named(v, objects) for k, v in value.items()}
    if isinstance(value, list):
        return [_named(v, objects) for v in value]
    return value


def test_written_requests_get_documented_answers(served: Served) -> None:
    """In this order: each request finds the state the ones before it left."""
    objects = {"project": "vision", **_jobs_by_state(served.api, "written")}
    wrong = []
    for method, path, who, params, body, status in WRITTEN:
        case = served.schema[path][method].Case(
            path_parameters={k: objects[name] for k, name in params.items()},
            **({"body": _named(body, objects)} if body is not None else {}))
        try:
            r = case.call_and_validate(headers=served.api.headers(who), checks=CHECKS)
        except FailureGroup as e:  # what schemathesis found, with a curl line to repeat it
            wrong.append(f"{method} {path} as {who}: {e}")
            continue
        if r.status_code != status:
            wrong.append(f"{method} {path} as {who}: {r.status_code}, not {status}: {r.text[:300]}")
        if r.status_code == 202 and "approval_id" in r.json():
            objects["approval"] = r.json()["approval_id"]
    assert not wrong, "\n".join(wrong)


def test_an_outage_gets_a_documented_answer(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger that cannot be written refuses a mutation with 503, which every operation documents."""
    def disk_full(*args: object, **kwargs: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(served.api.gateway.ledger._store, "write_batch", disk_full)
    case = served.schema["/v1/jobs"]["POST"].Case(body=job_spec())
    documented = [c for c in CHECKS if c is not not_a_server_error]  # a 503, as every operation says
    r = case.call_and_validate(headers=served.api.headers("alice"), checks=documented)
    assert r.status_code == 503, r.text
