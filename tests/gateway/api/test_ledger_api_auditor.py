"""The auditor (audrey) reads entries, checkpoints and proofs over the API and checks them; researchers cannot."""

from __future__ import annotations

import base64
import hashlib

import pytest
from gateway_testkit import Api, job_spec

from ledger.keys import load_verifier
from ledger.merkle import verify_consistency, verify_inclusion
from ledger.note import Checkpoint, open_checkpoint

ROUTES = [
    "/v1/ledger/entries",
    "/v1/ledger/checkpoint",
    "/v1/ledger/proof/inclusion?seq=0",
    "/v1/ledger/proof/consistency?old=1",
]


def signed_checkpoint(api: Api) -> Checkpoint:
    r = api.get("/v1/ledger/checkpoint", "audrey")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert r.headers["Jobgate-Ledger-Retention"] == api.settings.ledger_retention
    # The auditor's trust anchor is the exported public key, not anything the API says.
    return open_checkpoint(r.text, load_verifier(api.settings.keys_dir / "ledger.vkey"))


def submit(api: Api, n: int) -> None:
    for _ in range(n):
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201


def test_auditor_reads_entries_and_checks_their_hashes(api: Api) -> None:
    submit(api, 3)
    r = api.get("/v1/ledger/entries", "audrey", params={"limit": 1000})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["retention"] == "forever" and r.headers["Jobgate-Ledger-Retention"] == "forever"
    assert body["size"] >= 3 and len(body["entries"]) == body["size"]
    prev = "0" * 64
    for e in body["entries"]:
        raw = e["raw"].encode()
        assert hashlib.sha256(raw).hexdigest() == e["hash"]
        assert e["entry"]["prev"] == prev and e["entry"]["seq"] == e["seq"]
        prev = e["hash"]
    decisions = [e["entry"] for e in body["entries"] if e["entry"]["kind"] == "decision"]
    assert any(d["body"]["actor"]["id"] == "alice" for d in decisions)


def test_auditor_verifies_inclusion_proofs_against_the_signed_root(api: Api) -> None:
    submit(api, 4)
    cp = signed_checkpoint(api)
    entries = api.get("/v1/ledger/entries", "audrey", params={"limit": 1000}).json()["entries"]
    assert cp.size == len(entries)
    for e in entries:
        r = api.get("/v1/ledger/proof/inclusion", "audrey", params={"seq": e["seq"], "size": cp.size})
        assert r.status_code == 200, r.text
        p = r.json()
        assert set(p) == {"leaf_index", "tree_size", "leaf_hash", "hashes"}
        leaf = base64.b64decode(p["leaf_hash"])
        assert leaf == hashlib.sha256(b"\x00" + e["raw"].encode()).digest()
        hashes = [base64.b64decode(h) for h in p["hashes"]]
        assert verify_inclusion(p["leaf_index"], p["tree_size"], leaf, hashes, cp.root)
        assert not verify_inclusion(p["leaf_index"], p["tree_size"], bytes(32), hashes, cp.root)


def test_auditor_checks_consistency_between_two_saved_checkpoints(api: Api) -> None:
    submit(api, 2)
    old = signed_checkpoint(api)
    submit(api, 3)
    new = signed_checkpoint(api)
    assert new.size > old.size
    r = api.get("/v1/ledger/proof/consistency", "audrey", params={"old": old.size, "new": new.size})
    assert r.status_code == 200, r.text
    p = r.json()
    assert (p["old_size"], p["new_size"]) == (old.size, new.size)
    hashes = [base64.b64decode(h) for h in p["hashes"]]
    assert verify_consistency(old.size, new.size, hashes, old.root, new.root)
    assert not verify_consistency(old.size, new.size, hashes, bytes(32), new.root)


@pytest.mark.parametrize("who", ["alice", "bob", "mallory", "carol"])
@pytest.mark.parametrize("path", ROUTES, ids=["entries", "checkpoint", "inclusion", "consistency"])
def test_researchers_and_queue_admins_are_refused(api: Api, who: str, path: str) -> None:
    submit(api, 1)
    r = api.get(path, who)
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "raw" not in r.text and "—" not in r.text


@pytest.mark.parametrize("path", ROUTES, ids=["entries", "checkpoint", "inclusion", "consistency"])
def test_anonymous_is_refused(api: Api, path: str) -> None:
    assert api.get(path).status_code == 401


@pytest.mark.parametrize(
    "params",
    [
        ("/v1/ledger/proof/inclusion", {"seq": 99}),
        ("/v1/ledger/proof/inclusion", {"seq": 0, "size": 99}),
        ("/v1/ledger/proof/inclusion", {"seq": 2, "size": 1}),
        ("/v1/ledger/proof/inclusion", {"seq": -1}),
        ("/v1/ledger/proof/consistency", {"old": 99}),
        ("/v1/ledger/proof/consistency", {"old": 2, "new": 1}),
        ("/v1/ledger/proof/consistency", {"old": 0}),
        ("/v1/ledger/entries", {"limit": 0}),
    ],
    ids=["seq-beyond", "size-beyond", "size-below-seq", "seq-negative", "old-beyond", "old-gt-new", "old-zero",
         "limit-zero"],
)
def test_out_of_range_sizes_are_problem_json(api: Api, params: tuple[str, dict[str, int]]) -> None:
    submit(api, 2)
    path, q = params
    r = api.get(path, "audrey", params=q)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
