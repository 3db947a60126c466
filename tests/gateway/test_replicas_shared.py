"""Two replicas on one PostgreSQL business DB and one PostgreSQL ledger see the same state (issue 28): a token
revoked, a role granted or revoked, a console session, a command queued and the policy set in force, through one
replica, hold on the other; a replica whose files are another policy set refuses to decide.

Both gateways run in this process (two apps, each with its own engine, caches, bus, listener and part in the
leader election), sharing only the databases and the data dir's keys, as two `jobgate up` processes on one data
dir would. One pair serves every
case (module scope); each case leaves the pair as it found it.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, assert_problem, job_spec
from sqlalchemy import select

from gateway.app import create_app
from gateway.console.sessions import COOKIE
from gateway.decisions.obligations import RECEIPT_TIMEOUT, sweep_timed_out_receipts
from gateway.demo import prepare_demo
from gateway.housekeeping import HousekeepingLoop
from gateway.identity.tokens import hash_token
from gateway.native.commands import enqueue
from gateway.settings import REPO_POLICIES, Settings
from gateway.store.replica_tables import ConsoleSessionRow
from gateway.store.service_tables import Notification

pytestmark = pytest.mark.integration  # real PostgreSQL, two gateways and their listeners

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SIGNAL_S = 10.0  # generous: a signal arrives in milliseconds; this only keeps a lost one from hanging the test


@dataclass
class Pair:
    a: Api
    b: Api
    dir_a: Path
    dir_b: Path


def _database(server: str, prefix: str) -> tuple[str, str]:
    import psycopg

    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, urlunsplit(urlsplit(server)._replace(path="/" + name))


@pytest.fixture(scope="module")
def pair(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    import psycopg

    root = tmp_path_factory.mktemp("replicas")
    (biz, biz_url), (led, led_url) = _database(pg_server_url, "jobgate_biz"), _database(pg_server_url, "jobgate_led")
    dir_a, dir_b = root / "policies-a", root / "policies-b"
    shutil.copytree(REPO_POLICIES, dir_a)
    shutil.copytree(REPO_POLICIES, dir_b)
    base = Settings(data_dir=root / "data", database_url=biz_url, ledger_url=led_url, policy_watch_interval_s=0,
                    auth_cache_s=3600)  # an hour: only the signal can take a revoked token out of the cache
    prepare_demo(base)
    tokens = json.loads((base.data_dir / "demo-tokens.json").read_text())
    sa, sb = base.model_copy(update={"policies_dir": dir_a}), base.model_copy(update={"policies_dir": dir_b})
    with TestClient(create_app(sa, run_scheduler=False)) as ca, TestClient(create_app(sb, run_scheduler=False)) as cb:
        a, b = Api(ca, tokens, sa), Api(cb, tokens, sb)
        assert a.gateway.signals.wait_connected(SIGNAL_S) and b.gateway.signals.wait_connected(SIGNAL_S)
        yield Pair(a, b, dir_a, dir_b)
    for name in (biz, led):
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def csrf_of(page: Any) -> str:
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def _until(check: object, what: str) -> None:
    """Wait for a signal's effect: `check()` true within SIGNAL_S."""
    import time

    end = time.monotonic() + SIGNAL_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_a_token_revoked_through_one_replica_stops_working_on_the_other(pair: Pair) -> None:
    made = pair.a.post("/v1/tokens", "bob", json={"purpose": "replica test", "projects": ["vision"],
                                                   "actions": ["*"], "expires_in_days": 1})
    assert made.status_code == 201, made.text
    bearer = {"Authorization": f"Bearer {made.json()['token']}"}
    assert pair.b.client.get("/v1/jobs", headers=bearer).status_code == 200  # now in b's cache, for an hour
    r = pair.a.post(f"/v1/tokens/{made.json()['id']}/revoke", "bob", json={"reason": "left on a laptop"})
    assert r.status_code == 200, r.text
    _until(lambda: pair.b.client.get("/v1/jobs", headers=bearer).status_code == 401,
           "the revocation through a never reached b's auth cache")
    scrape = pair.b.get("/metrics").text  # what an operator watches: b hears a, and heard this
    assert "jobgate_replica_signals_connected 1.0" in scrape
    received = next(line for line in scrape.splitlines() if line.startswith("jobgate_replica_signals_received_total"))
    assert float(received.split()[-1]) >= 1


def test_a_role_granted_or_revoked_through_one_replica_decides_on_the_other(pair: Pair) -> None:
    """mallory is a researcher in speech only: a role in vision granted through a lets her submit there through
    b at its next decision, and revoked through a stops her there again."""
    binding = {"principal": "mallory", "role": "researcher", "project": "vision", "reason": "joins vision"}
    assert pair.b.post("/v1/jobs", "mallory", json=job_spec()).status_code == 403
    assert pair.a.post("/v1/roles", "erin", json=binding).status_code == 201
    assert pair.b.post("/v1/jobs", "mallory", json=job_spec()).status_code == 201
    assert pair.a.post("/v1/roles:revoke", "erin", json=binding).status_code == 200
    assert pair.b.post("/v1/jobs", "mallory", json=job_spec()).status_code == 403


def test_a_console_session_signed_in_through_one_replica_holds_on_the_other_until_signed_out(pair: Pair) -> None:
    browser_a = TestClient(pair.a.client.app, base_url="http://testserver")
    r = browser_a.post("/ui/login", data={"token": pair.a.tokens["carol"], "csrf": csrf_of(browser_a.get("/ui/login"))},
                       follow_redirects=False)
    assert r.status_code == 303, r.text
    secret = browser_a.cookies[COOKIE]
    with pair.a.gateway.transaction(immediate=False) as session:  # what both replicas read: the secret's hash only
        stored = session.scalars(select(ConsoleSessionRow.id_hash)).all()
    assert hash_token(secret) in stored and secret not in stored
    browser_b = TestClient(pair.b.client.app, base_url="http://testserver", cookies=dict(browser_a.cookies))
    page = browser_b.get("/ui/", follow_redirects=False)
    assert page.status_code == 200 and 'id="me">carol<' in page.text
    assert browser_b.post("/ui/logout", data={"csrf": csrf_of(page)}, follow_redirects=False).status_code == 303
    assert browser_a.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"


def test_a_command_queued_through_one_replica_wakes_the_long_polls_of_the_other(pair: Pair) -> None:
    node = "demo-node-2"
    seen = pair.b.gateway.bus.version(node)
    gw = pair.a.gateway
    with gw.transaction() as session:
        enqueue(gw, session, node, "no-such-job", "stop", {"grace_s": 1})
    assert pair.b.gateway.bus.wait(node, seen, timeout=SIGNAL_S), "b's long polls on the node slept on"
    assert pair.b.gateway.bus.version(node) != seen


def test_a_replica_on_another_policy_hash_refuses_to_decide(pair: Pair) -> None:
    """A reload through a makes a's set the one in force; b, whose files are the old set, refuses every decision
    (503, nothing decided) rather than decide under a stale hash, until its files are that set: then it loads
    them and decides under the same hash as a."""
    guards = pair.dir_a / "guards.rego"
    guards.write_text(guards.read_text().replace("# H1:", "# H1 (reviewed on a):", 1))
    r = pair.a.post("/v1/policy/reload", "sam")
    assert r.status_code == 200, r.text
    new_hash = r.json()["policy_hash"]
    old_hash = pair.b.gateway.policy.policy_hash
    assert new_hash != old_hash

    refused = pair.b.post("/v1/jobs", "alice", json=job_spec())
    problem = assert_problem(refused, 503, "policy-out-of-step", new_hash[:12])
    assert str(pair.dir_b) in problem["detail"], problem
    assert pair.b.gateway.policy.policy_hash == old_hash

    shutil.copy(guards, pair.dir_b / "guards.rego")  # b's files now hold the set in force
    job = pair.b.post("/v1/jobs", "alice", json=job_spec())
    assert job.status_code == 201, job.text
    assert pair.b.gateway.policy.policy_hash == new_hash
    stop = pair.b.post(f"/v1/jobs/{job.json()['id']}/stop", "mallory", json={"reason": "not hers"})
    assert stop.status_code == 403 and stop.json()["policy_hash"] == new_hash, stop.text


def test_a_receipt_timed_out_is_ledgered_once_when_two_replicas_sweep_at_once(pair: Pair) -> None:
    a, b = pair.a.gateway, pair.b.gateway
    note = "n" + secrets.token_hex(8)
    with a.transaction() as session:
        session.add(Notification(id=note, principal="alice", kind="job_action", body={"job_id": None},
                                 created_at=a.clock() - RECEIPT_TIMEOUT * 2, receipt_required=True))
    with a.transaction() as on_a:
        assert sweep_timed_out_receipts(a, on_a) == 1
        with b.transaction() as on_b:  # while a's sweep has not committed
            assert sweep_timed_out_receipts(b, on_b) == 0
    with b.transaction() as on_b:
        assert sweep_timed_out_receipts(b, on_b) == 0
    receipts = [e for e in _entries(pair.a) if e["kind"] == "receipt" and e["body"]["notification_id"] == note]
    assert len(receipts) == 1, receipts


def _entries(api: Api) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while batch := api.get("/v1/ledger/entries", "audrey", params={"start": len(out), "limit": 1000}).json()["entries"]:
        out += [e["entry"] for e in batch]
    return out


def test_a_listener_cut_off_reconnects_and_forgets_what_it_may_have_missed(pair: Pair) -> None:
    """A revocation made while b could not hear (here: straight in the database, which signals nobody) is not
    served from b's cache once b's listener is back, and signals reach b again."""
    import psycopg

    b = pair.b.gateway
    made = pair.a.post("/v1/tokens", "bob", json={"purpose": "listener test", "projects": ["vision"],
                                                   "actions": ["*"], "expires_in_days": 1}).json()
    bearer = {"Authorization": f"Bearer {made['token']}"}
    assert pair.b.client.get("/v1/jobs", headers=bearer).status_code == 200  # cached in b for an hour
    connects = b.signals.connects
    with psycopg.connect(b.signals.url, autocommit=True) as conn:
        conn.execute("UPDATE tokens SET revoked_at = now() WHERE id = %s", (made["id"],))
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                              (b.signals.application_name,)).fetchall()
    assert killed == [(True,)]
    _until(lambda: b.signals.connects > connects and b.signals.connected, "b's listener did not reconnect")
    assert pair.b.client.get("/v1/jobs", headers=bearer).status_code == 401
    test_a_command_queued_through_one_replica_wakes_the_long_polls_of_the_other(pair)  # and it hears a again


def test_a_follower_writes_the_counts_of_its_own_repeated_refusals(pair: Pair) -> None:
    """The counts live in the memory of the replica that answered; the leader's chores are not a follower's to run,
    but these are its own to write."""
    b = pair.b.gateway
    ask = {"principal": "alice", "purpose": "counted on b", "projects": ["vision"], "actions": ["job.view"],
           "expires_in_days": 1}
    first = pair.b.post("/v1/tokens", "mallory", json=ask).json()["ledger_seq"]
    assert pair.b.post("/v1/tokens", "mallory", json=ask).json()["ledger_seq"] == first  # counted, not written
    clock = b.clock
    b.clock = lambda: clock() + timedelta(seconds=b.settings.refusal_window_s + 1)  # the window has closed
    loop = HousekeepingLoop(b, interval_s=0.05, leads=lambda: False)
    loop.start()
    try:
        _until(lambda: any(e["body"].get("repeats_of") == first for e in _entries(pair.a) if e["kind"] == "refusal"),
               "the follower never wrote its count")
    finally:
        loop.stop()
        b.clock = clock
