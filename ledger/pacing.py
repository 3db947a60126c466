"""When the group-commit writer should hold a batch open for the callers it just woke (ledger/service.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pacing:
    """The group-commit rule: after a commit, take what is queued, or first wait for its callers?

    Taking what is queued keeps the disk busy: the callers of the batch just committed are woken
    during the next commit and go into the one after. But callers that append in a loop then split into
    two groups that take turns, so a batch holds only half of them. Waking them first and waiting for
    them to append again puts everyone in the next commit, for the time they all take to come back,
    once per cycle instead of overlapped with it: with N callers, N/(N x gap + cycle) entries a second
    instead of (N/2)/cycle. So:

    1. wait iff (k + q) x gap <= cycle x SHARE, for the k callers just woken and the q entries queued:
       gap is the usual time between two returning callers' enqueues, cycle the usual time from taking
       a batch to its durable commit;
    2. for at most min(2 x k x gap, cycle), ending as soon as k more entries are queued.

    A slow fsync (a long cycle) makes waiting pay; callers that do not come back at once (each on its
    own schedule) make gap long, and the rule stops waiting for them.

    Callers that each append on their own schedule (requests arriving at a steady rate) are another case:
    a fast commit then takes them one or two at a time, and the commit's fixed costs (statement, fsync,
    signed checkpoint, wake-ups) are paid per entry. At 10,000 appends/s that took both cores, and a
    saturated machine delays fsyncs (the kernel's I/O completion waits for a CPU) by 5-10 ms. So, second
    rule (`linger_for`): with fewer than LINGER_BATCH entries queued and entries arriving at most
    LINGER_MAX / 2 apart (the writer's measure of the arrival rate, `arrival_gap`), wait for the rest of a
    LINGER_BATCH, at most LINGER_MAX. The writer asks only when entries came in while it committed (never
    right after an idle spell), so a caller on its own never waits for others that are not coming.
    Pure: the writer thread feeds it what it measures.
    """

    gap: float = 25e-6  # seconds; a first guess until returns are measured
    cycle: float = 0.0  # seconds; 0 until a batch has been committed
    arrival_gap: float = 1.0  # seconds between entries as the writer takes them; a first guess that never lingers
    SHARE = 0.75  # below 1 (the break-even) for a margin
    WEIGHT = 0.2  # of each new measurement in the moving averages
    MIN_SAMPLE = 4
    LINGER_BATCH = 8  # entries that share a commit's fixed costs well enough
    LINGER_MAX = 300e-6  # seconds an entry may wait for others: a few tenths of a millisecond on its latency

    def saw_returns(self, seconds: float, n: int, *, held: bool) -> None:
        """n entries were enqueued within `seconds` of waking the last batch's callers (a batch held
        open for them, whatever it got, always counts; otherwise only a sample of MIN_SAMPLE)."""
        if held or n >= self.MIN_SAMPLE:
            self.gap += self.WEIGHT * (seconds / max(n, 1) - self.gap)

    def saw_cycle(self, seconds: float) -> None:
        """A batch was durable this long after it was taken."""
        self.cycle = seconds if not self.cycle else self.cycle + self.WEIGHT * (seconds - self.cycle)

    def saw_take(self, seconds: float, n: int) -> None:
        """The writer took n entries, `seconds` after it last took any (idle spells included, so that
        arrival_gap is the rate entries come at, not how fast a burst of them came)."""
        if n > 0:
            self.arrival_gap += self.WEIGHT * (seconds / n - self.arrival_gap)

    def linger_for(self, queued: int) -> float:
        """Seconds to wait for more entries before committing the `queued` ones; 0 means commit now."""
        missing = self.LINGER_BATCH - queued
        # Worth it only if at least two more are due within LINGER_MAX: one would barely pay for the wait.
        if queued <= 0 or missing <= 0 or 2 * self.arrival_gap > self.LINGER_MAX:
            return 0.0
        return min(missing * self.arrival_gap, self.LINGER_MAX)

    def wait_for(self, k: int, queued: int) -> float:
        """Seconds to wait for the k callers just woken to append again; 0 means do not wait."""
        if k <= 0 or (k + queued) * self.gap > self.cycle * self.SHARE:
            return 0.0
        return min(2 * k * self.gap, self.cycle)
