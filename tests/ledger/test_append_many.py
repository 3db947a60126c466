"""Ledger.append_many: several entries, in order, for the price of one durable commit."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from test_service import FlakyStore

from ledger.errors import InvalidEntry, LedgerUnavailable
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.verify import verify_store


@pytest.fixture
def ledger(store_url: str, signer: NoteSigner, clock: Callable[[], datetime]) -> Iterator[Ledger]:
    led = Ledger.open(store_url, signer=signer, clock=clock)
    yield led
    led.close()


def test_entries_land_in_order_in_one_group_commit(ledger: Ledger, store_url: str, signer: NoteSigner) -> None:
    ledger.append("k", {"i": -1})
    batches = ledger.stats.batches
    results = ledger.append_many(
        [("decision", {"i": 0}, None), ("transition", {"i": 1}, {"ev": b"x" * 100}), ("outcome", {"i": 2}, None)]
    )
    assert [r.seq for r in results] == [1, 2, 3]
    assert ledger.stats.batches == batches + 1  # one transaction, one fsync, one checkpoint
    assert [ledger.entry(s).value["kind"] for s in (1, 2, 3)] == ["decision", "transition", "outcome"]
    assert ledger.entry(2).value["blobs"]["ev"] == results[1].blobs["ev"]
    assert ledger.append_many([]) == []
    verdict = verify_store(store_url, signer.verifier())
    assert verdict.ok and verdict.size == 4, verdict.message


def test_one_invalid_entry_queues_none_of_them(ledger: Ledger) -> None:
    with pytest.raises(InvalidEntry):
        ledger.append_many([("k", {"i": 0}, None), ("k", {"bad": float("nan")}, None)])
    with pytest.raises(InvalidEntry):
        ledger.append_many([("k", {"i": 0}, None), ("ledger.key_rotation", {}, None)])
    assert ledger.size() == 0


def test_mixed_with_single_appends_from_other_threads(ledger: Ledger, store_url: str, signer: NoteSigner) -> None:
    def single(n: int) -> None:
        for i in range(20):
            ledger.append("single", {"t": n, "i": i})

    def many(n: int) -> None:
        for i in range(10):
            seqs = [r.seq for r in ledger.append_many([("many", {"t": n, "i": i, "j": j}, None) for j in range(3)])]
            assert seqs == sorted(seqs) and len(set(seqs)) == 3

    threads = [threading.Thread(target=single, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=many, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert ledger.size() == 4 * 20 + 4 * 10 * 3
    verdict = verify_store(store_url, signer.verifier())
    assert verdict.ok, verdict.message


def test_a_failed_write_fails_the_call_and_the_ledger_stays_whole(tmp_path: Path, signer: NoteSigner) -> None:
    store = FlakyStore(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    led.append("k", {"i": 0})
    store.fail_before = True
    with pytest.raises(LedgerUnavailable):
        led.append_many([("k", {"i": 1}, None), ("k", {"i": 2}, None)])
    assert led.size() == 1
    store.fail_before = False
    assert [r.seq for r in led.append_many([("k", {"i": 3}, None), ("k", {"i": 4}, None)])] == [1, 2]
    led.close()
    verdict = verify_store(f"sqlite:///{tmp_path}/ledger.db", signer.verifier())
    assert verdict.ok and verdict.size == 3, verdict.message
