"""Crash safety: kill -9 a real writer process during heavy appends, five times; after each restart the
ledger verifies and every append the writer acknowledged is present with the hash it was given."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger.keys import load_or_create_signer
from ledger.store import open_store
from ledger.verify import verify_store

ROUNDS = 5
ACKS_PER_ROUND = 400
WRITER = Path(__file__).with_name("ledger_crash_writer.py")
REPO = Path(__file__).resolve().parents[2]


def run_and_kill(url: str, keys: Path) -> dict[int, str]:
    """Start the writer, let it acknowledge ACKS_PER_ROUND appends, SIGKILL it; return every ack it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), url, str(keys), "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    acks: dict[int, str] = {}
    buf = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    try:
        while len(acks) < ACKS_PER_ROUND:
            assert time.monotonic() < deadline, "writer made no progress"
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            if sel.select(timeout=1):
                chunk = os.read(proc.stdout.fileno(), 65536)
                buf += chunk
                *lines, buf = buf.split(b"\n")
                acks.update((int(s), h.decode()) for s, h in (line.split() for line in lines))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        sel.close()
    # Lines the writer printed before it died are acknowledgements too.
    rest = buf + proc.stdout.read()
    for line in rest.split(b"\n"):
        if line.count(b" ") == 1 and len(line.split()[1]) == 64:
            s, h = line.split()
            acks[int(s)] = h.decode()
    proc.stdout.close()
    if proc.stderr:
        proc.stderr.close()
    return acks


def test_kill_9_in_a_loop_loses_no_acknowledged_append(store_url: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    verifier = load_or_create_signer(keys, "jobgate.local/ledger").verifier()
    acked: dict[int, str] = {}
    for round_ in range(ROUNDS):
        new = run_and_kill(store_url, keys)
        assert len(new) >= ACKS_PER_ROUND
        assert not set(new) & set(acked), "a seq was handed out twice"
        acked.update(new)
        verdict = verify_store(store_url, verifier)
        assert verdict.ok, f"round {round_}: {verdict.message}"
        store = open_store(store_url, create=False)
        try:
            stored = {seq: h for seq, h, _ in store.iter_entries(0)}
        finally:
            store.close()
        missing = {s: h for s, h in acked.items() if stored.get(s) != h}
        assert not missing, f"round {round_}: acknowledged appends lost or changed: {sorted(missing)[:5]}"
        assert verdict.size == len(stored) >= len(acked)
