"""Console sign-in, session cookie, CSRF and sign-out, in process."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from console_testkit import Console, csrf_of, submit
from sqlalchemy import update

from gateway.console.sessions import COOKIE, IDLE, PER_TOKEN, SessionStore
from gateway.identity.tokens import hash_token
from gateway.store.db import Database
from gateway.store.models import Token
from gateway.store.schema import create_schema


def test_session_cookie_is_httponly_samesite_strict_and_not_the_token(console: Console) -> None:
    c = console.browser()
    form = c.get("/ui/login")
    login_cookie = form.headers["set-cookie"]
    assert "HttpOnly" in login_cookie and "samesite=strict" in login_cookie.lower()
    r = c.post("/ui/login", data={"token": console.tokens["alice"], "csrf": csrf_of(form)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(COOKIE + "="))
    attrs = [a.strip().lower() for a in cookie.split(";")]
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/ui" in attrs
    value = cookie.split(";")[0].split("=", 1)[1]
    token = console.tokens["alice"]
    assert token not in cookie and hash_token(token) not in cookie and len(value) >= 40
    assert 'id="me">alice<' in c.get("/ui/").text


def test_sign_in_refuses_bad_tokens_machines_and_forms_from_elsewhere(console: Console) -> None:
    c = console.browser()
    r = c.post("/ui/login", data={"token": "jg_" + "x" * 40, "csrf": csrf_of(c.get("/ui/login"))})
    assert r.status_code == 401 and "Not signed in" in r.text and COOKIE not in c.cookies
    r = c.post("/ui/login", data={"token": "not a token", "csrf": csrf_of(c.get("/ui/login"))})
    assert r.status_code == 401 and "jg_" in r.text
    # A service account acts for a pipeline run, not a person at a browser.
    r = c.post("/ui/login", data={"token": console.tokens["ci-bot"], "csrf": csrf_of(c.get("/ui/login"))})
    assert r.status_code == 401 and "only people" in r.text
    # Login CSRF: a form posted from another site has no matching nonce cookie.
    other = console.browser()
    r = other.post("/ui/login", data={"token": console.tokens["alice"], "csrf": "forged"}, follow_redirects=False)
    assert r.status_code == 403 and COOKIE not in other.cookies


def test_anonymous_requests_go_to_sign_in(console: Console) -> None:
    c = console.browser()
    for path in ("/ui/", "/ui/approvals", "/ui/admin", "/ui/ledger", "/ui/ledger/0"):
        r = c.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", path
    r = c.post("/ui/approvals/apr-x/approve", data={"csrf": "x"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"


def test_post_without_csrf_token_is_refused_and_changes_nothing(console: Console) -> None:
    job = submit(console)
    c, csrf = console.sign_in("alice")
    size = console.gateway.ledger.size()
    for data in ({"reason": "no token"}, {"reason": "wrong token", "csrf": "x" + csrf}):
        r = c.post(f"/ui/jobs/{job}/stop", data=data, follow_redirects=False)
        assert r.status_code == 403 and "CSRF" in r.text
    # Nothing was even decided; the refused attempt is in the ledger, the second counted into the first.
    refused = [json.loads(e.raw) for e in console.gateway.ledger.entries(size, 100)]
    assert [(e["kind"], e["body"]["actor"]["id"], e["body"]["asked"]["route"]) for e in refused] == [
        ("refusal", "alice", "/ui/jobs/{job_id}/stop")]
    assert "CSRF" in refused[0]["body"]["refusal"]["detail"] and "asked" in refused[0]["body"]
    size = console.gateway.ledger.size()
    assert console.api("GET", f"/v1/jobs/{job}", "alice").json()["state"] == "pending"
    # With the token the same form works, through the decision pipeline (ledgered).
    r = c.post(f"/ui/jobs/{job}/stop", data={"reason": "done for today", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert console.api("GET", f"/v1/jobs/{job}", "alice").json()["state"] == "stopped"
    assert console.gateway.ledger.size() > size


def test_another_sessions_csrf_token_does_not_work(console: Console) -> None:
    job = submit(console)
    alice, _ = console.sign_in("alice")
    _, bobs = console.sign_in("bob")
    r = alice.post(f"/ui/jobs/{job}/stop", data={"reason": "crossed", "csrf": bobs})
    assert r.status_code == 403


def test_sign_out_ends_the_session_server_side(console: Console) -> None:
    c, csrf = console.sign_in("alice")
    stolen = c.cookies[COOKIE]
    assert c.post("/ui/logout", data={}, follow_redirects=False).status_code == 403  # CSRF on sign-out too
    r = c.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert COOKIE not in c.cookies
    # The old cookie value is worth nothing now.
    replay = console.browser()
    replay.cookies.set(COOKIE, stolen, path="/ui")
    assert replay.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"


def test_revoked_or_expired_token_ends_the_session(console: Console) -> None:
    c, _ = console.sign_in("alice")
    assert c.get("/ui/", follow_redirects=False).status_code == 200
    gw = console.gateway
    with gw.transaction() as session:
        session.execute(update(Token).where(Token.token_hash == hash_token(console.tokens["alice"]))
                        .values(revoked_at=gw.clock()))
    assert c.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"
    b, _ = console.sign_in("bob")
    with gw.transaction() as session:
        session.execute(update(Token).where(Token.token_hash == hash_token(console.tokens["bob"]))
                        .values(expires_at=gw.clock() - timedelta(seconds=1)))
    assert b.get("/ui/approvals", follow_redirects=False).headers["location"] == "/ui/login"


def test_sessions_are_bounded_per_token_and_idle_ones_are_swept(tmp_path: Path) -> None:
    """Signing in over and over with one token grew the store: only a session's own cookie removed it."""
    db = Database(f"sqlite:///{tmp_path / 'business.db'}")
    create_schema(db.engine)
    store = SessionStore(db.transaction)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = store.create("hash-a", "alice", t0)
    later = [store.create("hash-a", "alice", t0 + timedelta(seconds=i)) for i in range(1, 40)]
    other = store.create("hash-b", "bob", t0 + timedelta(seconds=41))
    assert len(store) == PER_TOKEN + 1  # alice's newest PER_TOKEN, and bob's
    assert store.get(first.id, t0 + timedelta(seconds=42)) is None  # the least recently used went first
    assert store.get(later[-1].id, t0 + timedelta(seconds=42)) is not None
    store.create("hash-c", "carol", t0 + IDLE + timedelta(minutes=5))  # everyone else idle since
    assert len(store) == 1 and store.get(other.id, t0 + IDLE + timedelta(minutes=5)) is None
    db.close()
