"""Red team: an id typed into the CLI is one path segment of the route the command names, whatever it holds.

The ids went into the URL as they were: httpx resolves `..` and `.` segments, and a `?` or `#` starts the query or
fragment, so `jobgate emergency-stop show ../../v1/ledger/entries` read the ledger, and `jobgate job stop
x/../J` stopped job J. Each command here runs against a real gateway (uvicorn on a socket) and must get the
404 of the route it names, or the router's own 404, and change nothing (the route's 404 is a refused attempt in
the ledger, naming the id as typed).
"""

from __future__ import annotations

import pytest
from cli_testkit import jobgate
from gateway_testkit import Api, job_spec, ledger_entries

# The CLI only speaks HTTP; which database is behind the app is covered by the API tests.
pytestmark = pytest.mark.parametrize("settings", ["sqlite"], indirect=True)


# (who, command, ...): "{job}" is a real job of alice's that no command here may touch.
CASES = [
    ("audrey", "emergency-stop", "show", "../../v1/ledger/entries"),
    ("audrey", "emergency-stop", "show", ".."),
    ("audrey", "emergency-stop", "show", "x?limit=1"),
    ("alice", "job", "show", "../jobs/{job}"),
    ("alice", "job", "show", "x#"),
    ("alice", "job", "stop", "x/../{job}", "--reason", "not this one"),
    ("alice", "job", "stop", "{job}?", "--reason", "not this one"),
    ("dave", "approve", "../jobs/{job}/stop?x="),
    ("dave", "reject", "../jobs/{job}/stop#", "--reason", "no"),
    ("alice", "token", "revoke", "./x", "--reason", "r"),
    ("erin", "break-glass", "revoke", "../../v1/jobs/{job}/stop?"),
    ("erin", "quota", "set", "../quotas/vision", "--gpus", "1", "--reason", "r"),
    ("alice", "job", "why", "{job}/.."),
    ("audrey", "notifications", "--ack", "../notifications"),
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c[1:]) for c in CASES])
def test_an_id_reaches_only_the_route_its_command_names(api: Api, url: str, case: tuple[str, ...]) -> None:
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    state, before = api.get(f"/v1/jobs/{job}", "alice").json()["state"], ledger_entries(api)
    who, group, *rest = case
    code, out = jobgate(url, api, who, group, *(a.replace("{job}", job) for a in rest))
    lines = out.strip().splitlines()
    assert code == 1, out
    assert lines[-1].startswith("Error: 404 "), out
    assert api.get(f"/v1/jobs/{job}", "alice").json()["state"] == state
    after = ledger_entries(api)
    assert after[: len(before)] == before
    # Nothing but the refusal of the id as typed, on the route the command names (the router's own 404 has none).
    assert [(e["kind"], e["body"]["actor"]["id"]) for e in after[len(before):]] in ([], [("refusal", who)]), after
    assert not [e for e in after[len(before):] if job in e["body"]["asked"].get("path_params", {}).values()]


def test_an_unknown_id_gets_its_routes_own_404(api: Api, url: str) -> None:
    """An id with no slash in it reaches the route itself, which names the id it does not know."""
    code, out = jobgate(url, api, "audrey", "emergency-stop", "show", "..")
    assert code == 1 and "Error: 404 " in out and "no endpoint answers" not in out, out
    code, out = jobgate(url, api, "alice", "job", "show", "j?x#y")
    assert code == 1 and "Error: 404 " in out and "j?x#y" in out, out
    # A control character pasted from a log line: httpx refused to build the URL; quoted, it is just an unknown id.
    code, out = jobgate(url, api, "audrey", "emergency-stop", "show", "es-1\tx")
    assert code == 1 and "Error: 404 " in out and "no endpoint answers" not in out, out


def test_ids_that_need_no_quoting_still_reach_their_routes(api: Api, url: str) -> None:
    """Quoting changes nothing for a real id, nor for a route named with a colon (`/v1/roles:revoke`)."""
    job = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    code, out = jobgate(url, api, "alice", "job", "show", job)
    assert code == 0 and job in out, out
    code, out = jobgate(
        url, api, "erin", "role", "revoke", "bob", "researcher", "--project", "vision", "--reason", "left the team"
    )
    assert code == 0 and "revoked: bob researcher in vision" in out, out
