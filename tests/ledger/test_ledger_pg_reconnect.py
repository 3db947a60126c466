"""A PostgreSQL ledger whose server dropped its connections (a restart, a failover) is written again once it
answers: the write that met the loss fails closed, the next one reconnects, and appenders that lost their
sessions go on numbering from the head row, gapless."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from ledger_bundle_kit import ORIGIN

from ledger.errors import LedgerUnavailable
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.verify import verify_store

pytestmark = pytest.mark.integration


def drop_connections(pg_url: str) -> int:
    """What a server restart does to the ledger's sessions: terminate every one on its database."""
    import psycopg

    name = urlparse(pg_url).path.lstrip("/")
    with psycopg.connect(pg_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        row = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                           " WHERE datname = %s AND pid <> pg_backend_pid()", (name,)).fetchone()
    return int(row[0]) if row else 0


def test_writer_reconnects_after_the_server_drops_it(pg_url: str) -> None:
    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(pg_url, signer=signer) as led:
        led.append("decision", {"i": 0})
        assert drop_connections(pg_url) >= 2
        with pytest.raises(LedgerUnavailable):  # the write that met the loss: refused, never half-written
            led.append("decision", {"lost": True})
        assert led.append("decision", {"i": 1}).seq == 1
        assert led.entry(1).value["body"] == {"i": 1}
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 2, v.message


def test_appenders_that_lost_their_sessions_go_on_from_the_head(pg_url: str) -> None:
    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(pg_url, signer=signer) as led, Ledger.open(pg_url, signer=signer) as other:
        led.append("decision", {"i": 0})
        other.append("decision", {"i": 1})
        assert drop_connections(pg_url) >= 4
        for appender in (led, other):
            with pytest.raises(LedgerUnavailable):  # met the loss
                appender.append("decision", {"lost": True})
        assert other.append("decision", {"by": "other"}).seq == 2
        assert led.append("decision", {"by": "first"}).seq == 3
        assert led.size() == other.size() == 4 and led.root() == other.root()
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 4, v.message
