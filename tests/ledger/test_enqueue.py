"""Ledger.enqueue: durability later (a decision whose outcomes cite it, one wait for all); the seq at once with one
writer (SQLite), once the batch commits on a ledger sequenced in its database (PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from test_service import FlakyStore, GatedPgStore, GatedStore

from ledger.errors import InvalidEntry, LedgerUnavailable
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.verify import verify_store


@pytest.fixture
def ledger(store_url: str, signer: NoteSigner, clock: Callable[[], datetime]) -> Iterator[Ledger]:
    led = Ledger.open(store_url, signer=signer, clock=clock)
    yield led
    led.close()


def test_the_seq_is_known_when_queued_and_kept_once_durable(ledger: Ledger, store_url: str, signer: NoteSigner) -> None:
    ledger.append("k", {"i": 0})
    decision = ledger.enqueue("decision", {"i": 1})
    assert decision.seq == 1
    outcome = ledger.append("outcome", {"decision_seq": decision.seq})
    assert outcome.seq == 2
    result = decision.wait()
    assert result.seq == 1 and decision.wait() is result
    assert ledger.entry(2).value["body"]["decision_seq"] == 1
    assert ledger.entry(1).value["kind"] == "decision"
    with pytest.raises(InvalidEntry):
        ledger.enqueue("ledger.key_rotation", {})
    verdict = verify_store(store_url, signer.verifier())
    assert verdict.ok and verdict.size == 3, verdict.message


def test_a_ticket_nobody_waits_for_holds_up_no_one(ledger: Ledger) -> None:
    # Callers of one batch are woken one after another, each passing the wake-up on; a ticket whose holder
    # never waits must not break that chain.
    forgotten = [ledger.enqueue("forgotten", {"i": i}) for i in range(5)]
    done: list[int] = []

    def appender(n: int) -> None:
        for i in range(20):
            done.append(ledger.append("k", {"t": n, "i": i}).seq)
            ledger.enqueue("forgotten", {"t": n, "i": i})

    threads = [threading.Thread(target=appender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(done) == 160
    assert ledger.size() >= 5 + 160 + 150  # the forgotten ones queued before the last appends returned
    assert [ledger.entry(t.seq).value["body"]["i"] for t in forgotten] == list(range(5))


def held_store(path: Path) -> GatedStore:
    """A store whose first write waits until the test opens the gate, so that entries queue up behind it."""
    store = GatedStore(path)
    store.gate.clear()
    return store


def test_entries_queued_behind_a_failed_write_fail_with_it(tmp_path: Path, signer: NoteSigner) -> None:
    store = held_store(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    store.fail_before = True
    decision = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)  # the writer holds the decision's batch
    outcome = led.enqueue("outcome", {"decision_seq": decision.seq})
    assert outcome.seq == decision.seq + 1
    store.gate.set()
    with pytest.raises(LedgerUnavailable):
        decision.wait()
    with pytest.raises(LedgerUnavailable):  # it cited a seq that now belongs to nothing
        outcome.wait()
    store.fail_before = False
    assert led.enqueue("decision", {"i": 1}).seq == 0  # numbering starts again at the store's size
    assert led.append("outcome", {"i": 2}).seq == 1
    led.close()
    verdict = verify_store(f"sqlite:///{tmp_path}/ledger.db", signer.verifier())
    assert verdict.ok and verdict.size == 2, verdict.message


def test_entries_queued_after_an_in_flight_ticket_are_written_after_it(tmp_path: Path, signer: NoteSigner) -> None:
    store = held_store(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    decision = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)  # not durable yet: the writer holds its batch
    outcomes = led.enqueue_many([("outcome", {"decision_seq": decision.seq}, None)] * 2, after=[decision])
    assert [t.seq for t in outcomes] == [1, 2]
    store.gate.set()
    assert [t.wait().seq for t in outcomes] == [1, 2] and decision.wait().seq == 0
    led.close()
    verdict = verify_store(f"sqlite:///{tmp_path}/ledger.db", signer.verifier())
    assert verdict.ok and verdict.size == 3, verdict.message


def test_entries_queued_after_a_ticket_whose_write_then_fails_fail_with_it(tmp_path: Path, signer: NoteSigner) -> None:
    store = held_store(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    store.fail_before = True
    decision = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)
    (outcome,) = led.enqueue_many([("outcome", {"decision_seq": decision.seq}, None)], after=[decision])
    store.gate.set()
    for ticket in (decision, outcome):
        with pytest.raises(LedgerUnavailable):
            ticket.wait()
    led.close()
    assert verify_store(f"sqlite:///{tmp_path}/ledger.db", signer.verifier()).size == 0


def test_entries_citing_a_ticket_that_was_not_written_are_refused(tmp_path: Path, signer: NoteSigner) -> None:
    store = FlakyStore(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    written = led.enqueue("decision", {"i": 0})
    written.wait()
    store.fail_before = True
    failed = led.enqueue("decision", {"i": 1})
    with pytest.raises(LedgerUnavailable):
        failed.wait()
    store.fail_before = False
    # Numbering started again at 1: an outcome citing seq 1 would now cite whatever comes next.
    with pytest.raises(LedgerUnavailable, match="entry 1, which these follow, was not written"):
        led.enqueue_many([("outcome", {"decision_seq": failed.seq}, None)], after=[failed])
    # A ticket written before the failure may still be cited.
    (ok,) = led.enqueue_many([("outcome", {"decision_seq": written.seq}, None)], after=[written])
    assert ok.wait().seq == 1
    led.close()
    verdict = verify_store(f"sqlite:///{tmp_path}/ledger.db", signer.verifier())
    assert verdict.ok and verdict.size == 2, verdict.message


def test_a_done_callback_runs_in_the_writer_once_the_entry_is_durable(tmp_path: Path, signer: NoteSigner) -> None:
    store = held_store(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    ticket = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)  # the writer holds the entry's batch at the gate
    seen: list[tuple[str, int]] = []
    called = threading.Event()

    def on_done() -> None:
        seen.append((threading.current_thread().name, led.size()))
        called.set()

    ticket.add_done_callback(on_done)
    assert not called.wait(0.2)  # not written yet
    store.gate.set()
    assert called.wait(30)
    assert seen == [("ledger-writer", 1)]  # durable when told
    assert ticket.wait().seq == 0  # and wait() no longer blocks
    # A callback given to a ticket already settled runs at once, in the caller's thread.
    late: list[str] = []
    ticket.add_done_callback(lambda: late.append(threading.current_thread().name))
    assert late == [threading.current_thread().name]
    led.close()


def test_a_done_callback_runs_when_the_write_fails(tmp_path: Path, signer: NoteSigner) -> None:
    store = held_store(tmp_path / "ledger.db")
    led = Ledger.from_store(store, signer=signer)
    store.fail_before = True
    ticket = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)
    called = threading.Event()
    ticket.add_done_callback(called.set)
    store.gate.set()
    assert called.wait(30)
    with pytest.raises(LedgerUnavailable):
        ticket.wait()
    led.close()


def test_a_failing_done_callback_is_logged_and_the_writer_goes_on(ledger: Ledger,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("the event loop is closed")

    ledger.enqueue("k", {"i": 0}).add_done_callback(broken)
    assert ledger.append("k", {"i": 1}).seq == 1  # the writer survived it
    ledger.close()
    assert "done callback failed" in caplog.text


@pytest.fixture
def held_pg(pg_url: str, signer: NoteSigner) -> Iterator[tuple[Ledger, GatedPgStore]]:
    store = GatedPgStore(pg_url)
    store.gate.clear()
    led = Ledger.from_store(store, signer=signer)
    yield led, store
    store.gate.set()
    led.close()


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # the test inspects what the caller got
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    return th, out


@pytest.mark.integration
def test_on_postgresql_the_seq_is_known_once_the_batch_commits(held_pg: tuple[Ledger, GatedPgStore], pg_url: str,
                                                               signer: NoteSigner) -> None:
    led, store = held_pg
    decision = led.enqueue("decision", {"i": 0})  # returns at once, its batch held at the gate
    assert store.writing.wait(timeout=30)
    # Queued behind the decision without waiting for it: written after it, or not at all.
    outcomes = led.enqueue_many([("outcome", {"of": "decision"}, None)] * 2, after=[decision])
    reader, told = _in_thread(lambda: decision.seq)
    reader.join(0.2)
    assert reader.is_alive() and not told  # the seq is not handed out before the batch commits
    store.gate.set()
    reader.join(30)
    assert told == [0] and decision.wait().seq == 0
    assert [t.seq for t in outcomes] == [1, 2] and [t.wait().seq for t in outcomes] == [1, 2]
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 3, v.message


@pytest.mark.integration
def test_on_postgresql_a_failed_batch_fails_its_seq_and_what_follows_it(held_pg: tuple[Ledger, GatedPgStore],
                                                                       pg_url: str, signer: NoteSigner) -> None:
    led, store = held_pg
    store.fail_before = True
    decision = led.enqueue("decision", {"i": 0})
    assert store.writing.wait(timeout=30)
    (outcome,) = led.enqueue_many([("outcome", {"of": "decision"}, None)], after=[decision])
    store.gate.set()
    with pytest.raises(LedgerUnavailable, match="disk full"):
        decision.seq  # noqa: B018 (reading it is the test)
    for ticket in (decision, outcome):  # and again, and through wait(): the same answer, never a hang
        with pytest.raises(LedgerUnavailable):
            ticket.wait()
        with pytest.raises(LedgerUnavailable):
            ticket.seq  # noqa: B018
    called = threading.Event()
    decision.add_done_callback(called.set)  # settled (failed) already: runs at once
    assert called.is_set()
    store.fail_before = False
    with pytest.raises(LedgerUnavailable, match="an entry these follow was not written"):
        led.enqueue_many([("outcome", {"of": "decision"}, None)], after=[decision])
    assert led.append("decision", {"i": 1}).seq == 0  # nothing was written: gapless from 0
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 1, v.message
