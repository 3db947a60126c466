"""A 422 says what is wrong in words: a field that must match a pattern says which characters it takes (not the
regular expression), and the CLI names its own options (`--runtime-limit`), not the API's fields behind them."""

from __future__ import annotations

from typing import Any

from cli_testkit import Canned, run
from gateway_testkit import Api, job_spec

from gateway.errors import PATTERN_WORDS
from gateway.schemas import NAME_PATTERN


def patterns(node: Any) -> set[str]:
    """Every `pattern` in an OpenAPI document (request bodies and parameters alike)."""
    if isinstance(node, dict):
        found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        return found.union(*(patterns(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(patterns(v) for v in node))
    return set()


def test_every_pattern_a_request_must_match_is_said_in_words(api: Api) -> None:
    used = patterns(api.client.get("/openapi.json").json())
    assert NAME_PATTERN in used
    assert used <= PATTERN_WORDS.keys(), used - PATTERN_WORDS.keys()


def test_a_mistyped_name_is_refused_in_words(api: Api) -> None:
    r = api.post("/v1/jobs", "alice", json=job_spec(name="-resnet"))
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "name", "message": PATTERN_WORDS[NAME_PATTERN]}]
    assert "^[" not in r.json()["detail"]


def test_the_cli_names_its_options_not_the_api_fields(api: Api, canned: Canned) -> None:
    # The gateway's own answer to what the command below sends, replayed to the CLI.
    r = api.post("/v1/jobs", "alice", json=job_spec(runtime_limit_seconds=-5, labels={"team": "v" * 300}))
    assert r.status_code == 422, r.text
    canned.answers[("POST", "/v1/jobs")] = (422, r.json())
    code, out = run(canned, "job", "submit", "--name", "t", "--project", "vision", "--runtime-limit", "-5",
                    "--label", "team=" + "v" * 300, "--", "python", "train.py")
    assert code == 1
    assert "--runtime-limit: Input should be greater than 0" in out, out
    assert "--label team: String should have at most 256 characters" in out, out
    assert "runtime_limit_seconds" not in out and "labels" not in out
