"""The authentication cache (F1): revocations here apply at once, elsewhere within its stated lifetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway_testkit import Api, assert_problem, job_spec
from sqlalchemy import select

from gateway.identity.token_cache import TokenCache, TokenFacts
from gateway.identity.tokens import hash_token
from gateway.store.models import Token


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FACTS = TokenFacts(token_id="tok-1", projects=("*",), actions=("*",), expires_at=datetime.now(UTC),
                   revoked_at=None, principal_id="alice", kind="person", responsible=None, disabled=False)


def test_entries_live_for_the_stated_seconds_and_can_be_forgotten() -> None:
    clock = FakeClock()
    cache = TokenCache(5, clock=clock)
    cache.put("h", FACTS, cache.generation())
    clock.now += 4.9
    assert cache.get("h") is FACTS
    clock.now += 0.1
    assert cache.get("h") is None
    cache.put("h", FACTS, cache.generation())
    cache.forget("h")
    assert cache.get("h") is None


def test_a_zero_lifetime_turns_the_cache_off() -> None:
    cache = TokenCache(0)
    cache.put("h", FACTS, cache.generation())
    assert cache.get("h") is None


def test_facts_read_before_a_revocation_are_not_put_back_after_it_forgot_them() -> None:
    """A request that read the token's row while its revocation was in flight (PostgreSQL lets it) put the stale
    'not revoked' facts into the cache after the revocation's forget(): the token worked on for the cache's
    lifetime, though a revocation here is documented to apply at once."""
    cache = TokenCache(5)
    before = cache.generation()  # the request starts loading the row
    cache.forget("h")  # the revocation commits and forgets the token
    cache.put("h", FACTS, before)  # the request's stale facts arrive
    assert cache.get("h") is None
    cache.put("h", FACTS, cache.generation())  # a load that began after it is kept
    assert cache.get("h") is FACTS


def test_a_revocation_made_elsewhere_applies_once_the_cached_facts_age_out(api: Api) -> None:
    clock = FakeClock()
    api.gateway.token_cache = TokenCache(5, clock=clock)
    assert api.get("/v1/jobs", "alice").status_code == 200
    # Another replica (or an operator) revokes the token straight in the shared database.
    with api.gateway.db.transaction() as s:
        s.scalars(select(Token).where(Token.token_hash == hash_token(api.tokens["alice"]))).one().revoked_at = (
            datetime.now(UTC))
    assert api.get("/v1/jobs", "alice").status_code == 200  # within the stated 5 s
    clock.now += 5
    assert_problem(api.get("/v1/jobs", "alice"), 401, "unauthenticated", "revoked")


def test_expiry_is_exact_even_while_the_token_is_cached(api: Api) -> None:
    api.gateway.token_cache = TokenCache(3600)
    assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    with api.gateway.db.transaction(immediate=False) as s:
        expires = s.scalars(select(Token).where(Token.token_hash == hash_token(api.tokens["alice"]))).one().expires_at
    api.gateway.clock = lambda: expires + timedelta(seconds=1)
    assert_problem(api.post("/v1/jobs", "alice", json=job_spec()), 401, "unauthenticated", "expired")
