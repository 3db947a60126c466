"""Who may append to a ledger. SQLite: one process, and a second writer is refused when it opens, not by failing
every append later. PostgreSQL: any number of processes, each batch numbered under the head row (ledger_head),
each process reading what the others appended; a head that disagrees with the entries is refused at open."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ledger.errors import KeyMismatch, LedgerCorrupted, LedgerUnavailable, StoreError
from ledger.keys import NoteSigner
from ledger.merkle import verify_consistency, verify_inclusion
from ledger.note import open_checkpoint
from ledger.service import Ledger
from ledger.store import open_store
from ledger.verify import verify_store


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def test_a_second_sqlite_writer_is_refused_and_readers_are_not(sqlite_url: str, signer: NoteSigner) -> None:
    first = Ledger.open(sqlite_url, signer=signer)
    first.append("k", {"i": 0})
    with pytest.raises(StoreError, match="already being written by another process"):
        Ledger.open(sqlite_url, signer=signer)
    reader = open_store(sqlite_url, create=False)  # auditors and the CLI read beside the writer
    assert reader.count() == 1
    reader.close()
    assert first.append("k", {"i": 1}).seq == 1  # the refused one disturbed nothing
    first.close()
    second = Ledger.open(sqlite_url, signer=signer)  # closed: the next writer may open it
    assert second.append("k", {"i": 2}).seq == 2
    second.close()
    verdict = verify_store(sqlite_url, signer.verifier())
    assert verdict.ok and verdict.size == 3, verdict.message


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ledger.keys import load_or_create_signer
    from ledger.service import Ledger
    led = Ledger.open(sys.argv[1], signer=load_or_create_signer(Path(sys.argv[2]), "jobgate.local/ledger"))
    led.append("k", {"from": "holder"})
    print("open", flush=True)
    time.sleep(60)
""")


def test_the_sqlite_claim_dies_with_the_process_that_held_it(sqlite_url: str, signer: NoteSigner,
                                                              tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, sqlite_url, str(tmp_path / "keys")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="already being written"):
            Ledger.open(sqlite_url, signer=signer)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up in the holder: the kernel lets go
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    led = Ledger.open(sqlite_url, signer=signer)
    assert led.append("k", {"from": "next"}).seq == 1
    led.close()


# -- PostgreSQL: many appenders ---------------------------------------------------------------------------------


@pytest.fixture
def two(pg_url: str, signer: NoteSigner) -> Iterator[tuple[Ledger, Ledger]]:
    """Two appenders on one PostgreSQL ledger, as two replicas hold them (two Ledgers here: the same code path)."""
    a = Ledger.open(pg_url, signer=signer)
    b = Ledger.open(pg_url, signer=signer)
    yield a, b
    a.close()
    b.close()


@pytest.mark.integration
def test_postgresql_appenders_side_by_side_read_each_others_entries(
    two: tuple[Ledger, Ledger], pg_url: str, signer: NoteSigner
) -> None:
    a, b = two
    first = [a.append("k", {"by": "a", "i": i}).seq for i in range(5)]
    assert first == list(range(5))
    # b appended nothing, and reads them all: size, entries, root, the checkpoint a signed, proofs against it.
    assert b.size() == 5 and [e.value["body"]["i"] for e in b.entries(0, 10)] == list(range(5))
    assert b.root() == a.root() and b.entry(4).hash == a.entry(4).hash
    cp = open_checkpoint(b.latest_checkpoint(), signer.verifier())
    assert (cp.size, cp.root) == (5, a.root())
    p = b.inclusion_proof(3)
    assert verify_inclusion(3, 5, p.leaf_hash, p.hashes, cp.root)
    # b, behind a by a batch, reads it back before adding its own: one chain, one tree.
    a.append("k", {"by": "a", "i": 5})
    r = b.append("k", {"by": "b"})
    assert r.seq == 6 and b.entry(6).value["prev"] == a.entry(5).hash
    assert a.size() == b.size() == 7 and a.root() == b.root()
    c = a.consistency_proof(5)
    assert verify_consistency(5, 7, c.hashes, cp.root, b.root())
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 7, v.message


@pytest.mark.integration
def test_postgresql_appenders_in_threads_get_gapless_seqs_and_one_chain(
    two: tuple[Ledger, Ledger], pg_url: str, signer: NoteSigner
) -> None:
    got: dict[tuple[int, int], int] = {}
    lock = threading.Lock()

    def run(led: Ledger, who: int, t: int) -> None:
        for i in range(25):
            seq = led.append("k", {"who": who, "t": t, "i": i}).seq
            with lock:
                got[(who, t * 100 + i)] = seq

    threads = [threading.Thread(target=run, args=(led, who, t)) for who, led in enumerate(two) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(got.values()) == list(range(400))  # each seq told once, none skipped
    a, b = two
    for (who, ti), seq in list(got.items())[::37]:
        assert b.entry(seq).value["body"] == {"who": who, "t": ti // 100, "i": ti % 100}
    assert a.stats.batches + b.stats.batches < 400  # group commit still groups
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 400 and v.checkpoints == a.stats.batches + b.stats.batches, v.message


def _clock_at(start: datetime) -> Callable[[], datetime]:
    t = [start]

    def now() -> datetime:
        t[0] += timedelta(microseconds=1)
        return t[0]

    return now


@pytest.mark.integration
def test_an_appender_whose_clock_is_behind_never_stamps_an_entry_earlier_than_the_last(
    pg_url: str, signer: NoteSigner
) -> None:
    ahead = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
    with (Ledger.open(pg_url, signer=signer, clock=_clock_at(ahead)) as a,
          Ledger.open(pg_url, signer=signer, clock=_clock_at(ahead - timedelta(seconds=3))) as b):
        ra = a.append("k", {"by": "a"})
        rb = b.append("k", {"by": "b"})
        assert rb.time == ra.time == b.entry(1).value["time"]  # b's clock said 3 s earlier
        assert a.append("k", {"by": "a"}).time > rb.time
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 3, v.message


@pytest.mark.integration
def test_a_process_with_another_key_refuses_to_append(pg_url: str, signer: NoteSigner) -> None:
    other = NoteSigner.generate(signer.name)
    with Ledger.open(pg_url, signer=signer) as a, Ledger.open(pg_url, signer=other) as b:  # empty: no key yet
        a.append("k", {"i": 0})  # announces a's key in the head
        with pytest.raises(LedgerUnavailable, match=r"head announces signing key .* this process signs with") as e:
            b.append("k", {"i": 1})
        assert "\n" not in str(e.value)
        assert a.append("k", {"i": 2}).seq == 1
    with pytest.raises(KeyMismatch):
        Ledger.open(pg_url, signer=other)
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 2, v.message


def _owner_sql(pg_url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


@pytest.mark.integration
def test_a_ledger_from_before_the_head_gets_one_computed_by_processes_opening_it_at_once(
    pg_url: str, signer: NoteSigner
) -> None:
    with Ledger.open(pg_url, signer=signer) as led:
        for i in range(13):
            led.append("k", {"i": i}, blobs={"b": b"blob %d" % i} if i % 5 == 0 else None)
        root = led.root()
    _owner_sql(pg_url, "DROP TABLE ledger_head")  # what a ledger written before the head looks like
    opened: list[Ledger] = []
    start = threading.Barrier(3)

    def open_one() -> None:
        start.wait()
        opened.append(Ledger.open(pg_url, signer=signer))

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(opened) == 3
    try:
        assert all(led.size() == 13 and led.root() == root for led in opened)
        assert [led.append("k", {"after": n}).seq for n, led in enumerate(opened)] == [13, 14, 15]
    finally:
        for led in opened:
            led.close()
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 16, v.message


TAMPERED_HEADS = [
    ("behind", "UPDATE ledger_head SET next_seq = next_seq - 1",
     "it counts 4 entries but the store holds 5 (the head is behind)"),
    ("ahead", "UPDATE ledger_head SET next_seq = next_seq + 2",
     "it counts 7 entries but the store holds 5 (entries are missing)"),
    ("last-hash", "UPDATE ledger_head SET last_hash = repeat('ab', 32)", "its last hash is not the hash of seq 4"),
    ("frontier", "UPDATE ledger_head SET frontier = sha256(frontier) || substr(frontier, 33)",
     "its Merkle frontier is not that of the 5 entries"),
    ("last-time", "UPDATE ledger_head SET last_time = '2020-01-01T00:00:00.000000Z'",
     "its last time is not the time of seq 4"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("statement", "problem"), [t[1:] for t in TAMPERED_HEADS], ids=[t[0] for t in TAMPERED_HEADS])
def test_a_head_that_disagrees_with_the_entries_is_refused_at_open(
    pg_url: str, signer: NoteSigner, statement: str, problem: str
) -> None:
    with Ledger.open(pg_url, signer=signer) as led:
        for i in range(5):
            led.append("k", {"i": i})
    _owner_sql(pg_url, statement)  # the gateway role may UPDATE the head: no trigger stands in the way
    with pytest.raises(LedgerCorrupted) as e:
        Ledger.open(pg_url, signer=signer)
    assert str(e.value) == f"the ledger's head row (ledger_head) disagrees with its entries: {problem}"
    assert verify_store(pg_url, signer.verifier()).ok  # the entries themselves are intact


@pytest.mark.integration
def test_a_head_changed_under_a_running_appender_stops_its_appends_not_history(pg_url: str, signer: NoteSigner) -> None:
    """Behind: the batch would collide with stored seqs. Changed while the process holds as many entries: it will
    not build on it. Either way nothing is written, and the ledger still verifies."""
    with Ledger.open(pg_url, signer=signer) as led:
        for i in range(5):
            led.append("k", {"i": i})
        for statement in ("UPDATE ledger_head SET next_seq = next_seq - 1",
                          f"UPDATE ledger_head SET next_seq = 5, last_hash = '{hashlib.sha256(b'x').hexdigest()}'"):
            _owner_sql(pg_url, statement)
            with pytest.raises(LedgerUnavailable, match="ledger_head"):
                led.append("k", {"bad": True})
    v = verify_store(pg_url, signer.verifier())
    assert v.ok and v.size == 5, v.message
