"""Crash safety: kill -9 real writer processes during heavy appends; afterwards the ledger verifies and every
append a writer acknowledged is present, once, with the seq and hash it was given. One writer killed five times
in a row (both engines), and three writers appending side by side to one PostgreSQL ledger, one of them killed
mid-run."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.keys import load_or_create_signer
from ledger.store import open_store
from ledger.verify import verify_store

ROUNDS = 5
ACKS_PER_ROUND = 400
WRITER = Path(__file__).with_name("ledger_crash_writer.py")
REPO = Path(__file__).resolve().parents[2]
JOBGATE = Path(sys.executable).with_name("jobgate")


class Writer:
    """A ledger_crash_writer.py process and the acknowledgements (seq -> hash) it printed."""

    def __init__(self, url: str, keys: Path, threads: int = 16, tag: str = "w") -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, str(WRITER), url, str(keys), str(threads), tag],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdout is not None
        self.acks: dict[int, str] = {}
        self._buf = b""

    def take(self, chunk: bytes) -> None:
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        self.acks.update((int(s), h.decode()) for s, h in (line.split() for line in lines))

    def kill(self) -> None:
        """SIGKILL: no clean-up in the writer. The lines it printed before it died are acknowledgements too."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        rest = self._buf + self.proc.stdout.read()
        self._buf = b""
        for line in rest.split(b"\n"):
            if line.count(b" ") == 1 and len(line.split()[1]) == 64:
                s, h = line.split()
                self.acks[int(s)] = h.decode()
        self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()


def run_until(writers: list[Writer], done: object, seconds: float = 90) -> None:
    """Read the writers' acknowledgements until done() holds."""
    sel = selectors.DefaultSelector()
    for w in writers:
        assert w.proc.stdout is not None
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    deadline = time.monotonic() + seconds
    try:
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, "writers made no progress"
            for key, _ in sel.select(timeout=1):
                writer: Writer = key.data
                assert writer.proc.poll() is None, writer.proc.stderr.read().decode() if writer.proc.stderr else ""
                writer.take(os.read(key.fd, 65536))
    finally:
        sel.close()


def stored_entries(url: str) -> dict[int, tuple[str, bytes]]:
    store = open_store(url, create=False)
    try:
        return {seq: (h, raw) for seq, h, raw in store.iter_entries(0)}
    finally:
        store.close()


def test_kill_9_in_a_loop_loses_no_acknowledged_append(store_url: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    verifier = load_or_create_signer(keys, "jobgate.local/ledger").verifier()
    acked: dict[int, str] = {}
    for round_ in range(ROUNDS):
        w = Writer(store_url, keys)
        try:
            run_until([w], lambda: len(w.acks) >= ACKS_PER_ROUND)  # noqa: B023 (w is this round's)
        finally:
            w.kill()
        new = w.acks
        assert len(new) >= ACKS_PER_ROUND
        assert not set(new) & set(acked), "a seq was handed out twice"
        acked.update(new)
        verdict = verify_store(store_url, verifier)
        assert verdict.ok, f"round {round_}: {verdict.message}"
        stored = {seq: h for seq, (h, _) in stored_entries(store_url).items()}
        missing = {s: h for s, h in acked.items() if stored.get(s) != h}
        assert not missing, f"round {round_}: acknowledged appends lost or changed: {sorted(missing)[:5]}"
        assert verdict.size == len(stored) >= len(acked)


@pytest.mark.integration
def test_three_processes_appending_to_one_postgresql_ledger_one_killed_lose_nothing(pg_url: str,
                                                                                    tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    load_or_create_signer(keys, "jobgate.local/ledger")  # one key for all three, as replicas share keys/
    writers = [Writer(pg_url, keys, 16, tag) for tag in ("a", "b", "c")]
    try:
        run_until(writers, lambda: all(len(w.acks) >= 150 for w in writers))
        writers[0].kill()  # mid-run: its batch in flight, perhaps holding the head's row lock
        more = {w: len(w.acks) + 150 for w in writers[1:]}
        run_until(writers[1:], lambda: all(len(w.acks) >= n for w, n in more.items()))
    finally:
        for w in writers:
            if w.proc.returncode is None:
                w.kill()
    told: dict[int, tuple[str, str]] = {}
    for w, tag in zip(writers, "abc", strict=True):
        for seq, h in w.acks.items():
            assert seq not in told, f"seq {seq} was told to {told[seq][0]} and to {tag}"
            told[seq] = (tag, h)
    stored = stored_entries(pg_url)
    assert sorted(stored) == list(range(len(stored))), "seqs are not gapless"
    lost = {seq: tag for seq, (tag, h) in told.items() if stored.get(seq, ("", b""))[0] != h}
    assert not lost, f"acknowledged appends lost or changed: {sorted(lost.items())[:5]}"
    bodies = [json.loads(raw)["body"] for _, raw in stored.values()]
    appends = [(b["writer"], b["thread"], b["i"]) for b in bodies]
    assert len(set(appends)) == len(appends), "an append is in the ledger twice"
    assert all(json.loads(stored[seq][1])["body"]["writer"] == tag for seq, (tag, _) in told.items())
    r = subprocess.run([str(JOBGATE), "ledger", "verify", "--db", pg_url, "--public-key", str(keys / "ledger.vkey")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("OK: "), r.stdout + r.stderr
    assert f"{len(stored)} entries" in r.stdout
