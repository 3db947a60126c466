"""The group-commit rule (Pacing): when the writer holds a batch open for the callers it just woke."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from ledger.keys import NoteSigner
from ledger.pacing import Pacing
from ledger.service import Ledger
from ledger.store import Row, SqliteStore


@pytest.mark.parametrize(
    ("gap_us", "cycle_us", "woken", "queued", "wait_us"),
    [
        (20, 2500, 32, 32, 1280),  # slow commits, callers back within a fraction of one: wait for all
        (20, 2500, 64, 0, 2500),  # ... at most one cycle
        (20, 800, 32, 32, 0),  # fast commits: 64 returns take longer than 3/4 of a cycle
        (100, 800, 6, 6, 0),  # callers on their own schedule (an offered rate): never worth it
        (20, 0, 4, 0, 0),  # nothing committed yet
        (20, 2500, 0, 10, 0),  # nobody was woken
    ],
    ids=["slow-disk", "capped-by-cycle", "fast-disk", "open-loop", "no-cycle-yet", "none-woken"],
)
def test_wait_for(gap_us: int, cycle_us: int, woken: int, queued: int, wait_us: int) -> None:
    pacing = Pacing(gap=gap_us * 1e-6, cycle=cycle_us * 1e-6)
    assert pacing.wait_for(woken, queued) == pytest.approx(wait_us * 1e-6)


def test_estimates_follow_what_the_writer_sees() -> None:
    pacing = Pacing()
    pacing.saw_cycle(0.002)
    assert pacing.cycle == 0.002  # the first measurement, then a moving average
    pacing.saw_cycle(0.001)
    assert pacing.cycle == pytest.approx(0.0018)
    pacing.saw_returns(0.0003, 2, held=False)  # too few to go by
    assert pacing.gap == 25e-6
    for _ in range(30):
        pacing.saw_returns(0.0003, 30, held=False)
    assert pacing.gap == pytest.approx(10e-6, rel=0.01)
    pacing.saw_returns(0.0016, 0, held=True)  # held open, nobody came: waiting stops paying
    assert pacing.wait_for(30, 30) == 0.0


class SlowStore(SqliteStore):
    """A real SQLite store whose commits take 10 ms, like a disk with a slow fsync."""

    def write_batch(
        self,
        rows: Sequence[Row],
        blobs: Mapping[str, bytes],
        checkpoint: tuple[int, str],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        def slow() -> None:
            if before_commit is not None:
                before_commit()
            time.sleep(0.01)

        super().write_batch(rows, blobs, checkpoint, slow)


def test_callers_appending_in_a_loop_share_slow_commits(tmp_path: Path, signer: NoteSigner) -> None:
    led = Ledger.from_store(SlowStore(tmp_path / "ledger.db"), signer=signer)
    sizes: list[int] = []

    def run(t: int) -> None:
        for i in range(30):
            led.append("k", {"t": t, "i": i})

    threads = [threading.Thread(target=run, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    sizes = [n for n, count in sorted(led.stats.batch_sizes.items()) for _ in range(count)]
    led.close()
    # Taking only what is queued, they would split into two groups of about 8 taking turns.
    assert led.stats.held_open > 0
    assert sum(sizes) / len(sizes) > 12, led.stats.batch_sizes


@pytest.mark.parametrize(
    ("arrival_gap_us", "queued", "linger_us"),
    [
        (100, 1, 300),  # 10,000 entries/s: wait for the rest of a batch, at most LINGER_MAX
        (20, 2, 120),  # faster: just long enough for the six missing
        (100, 8, 0),  # a batch's worth is queued already
        (100, 0, 0),  # nothing to commit
        (200, 1, 0),  # 5,000/s: fewer than two more expected within LINGER_MAX
        (500, 1, 0),  # 2,000/s (a busy gateway's rate), or a caller on its own
    ],
    ids=["steady-rate", "fast-rate", "batch-full", "empty", "too-few-expected", "sparse"],
)
def test_linger_for(arrival_gap_us: int, queued: int, linger_us: int) -> None:
    pacing = Pacing(arrival_gap=arrival_gap_us * 1e-6)
    assert pacing.linger_for(queued) == pytest.approx(linger_us * 1e-6)


def test_the_arrival_rate_is_what_the_writer_takes_over_time() -> None:
    pacing = Pacing()
    assert pacing.linger_for(1) == 0.0  # nothing measured yet: never linger
    for _ in range(100):
        pacing.saw_take(0.0004, 4)  # four entries every 0.4 ms
    assert pacing.arrival_gap == pytest.approx(100e-6, rel=0.01)
    assert pacing.linger_for(1) == pytest.approx(Pacing.LINGER_MAX)
    pacing.saw_take(0.01, 0)  # took nothing: no measurement
    assert pacing.arrival_gap == pytest.approx(100e-6, rel=0.01)


def test_entries_arriving_on_their_own_share_a_commit(tmp_path: Path, signer: NoteSigner) -> None:
    """Callers each on their own schedule are not woken by the writer, so holding a batch open for returning
    callers does not gather them; lingering does, and every entry is still written, in order, once."""
    led = Ledger.open(f"sqlite:///{tmp_path}/ledger.db", signer=signer)
    led.pacing.LINGER_MAX = 0.05  # this ledger's pacing only (the class keeps its constant)
    led.pacing.arrival_gap = 1e-6
    led.pacing.saw_take = lambda seconds, n: None  # keep the rate as set
    seqs: list[int] = []
    lock = threading.Lock()

    def run(t: int) -> None:
        for i in range(40):
            seq = led.append("k", {"t": t, "i": i}).seq
            with lock:
                seqs.append(seq)
            time.sleep(0.001)  # its own schedule, not the writer's

    threads = [threading.Thread(target=run, args=(t,)) for t in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stats = led.stats
    led.close()
    assert sorted(seqs) == list(range(32 * 40))
    assert stats.lingered > 0


def test_a_caller_on_its_own_never_waits_for_a_linger(tmp_path: Path, signer: NoteSigner) -> None:
    """One caller appending now and then: the writer is idle each time its entry comes in, so the entry does
    not wait for others that are not coming (nor, appending in a loop, while the writer holds the batch
    open for that very caller)."""
    led = Ledger.open(f"sqlite:///{tmp_path}/ledger.db", signer=signer)
    led.pacing.arrival_gap = 1e-6  # even if the rate looked high
    led.pacing.saw_take = lambda seconds, n: None
    for i in range(100):
        led.append("k", {"i": i})
        time.sleep(0.0003 if i % 2 else 0)
    stats = led.stats
    led.close()
    assert stats.lingered == 0
