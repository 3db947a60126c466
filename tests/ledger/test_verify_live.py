"""Verifying a ledger that a gateway is writing: the entries appended meanwhile are not reported as tampering.

The verifier read the checkpoints, then the entries; those appended in between were "inserted: not covered by
any signed checkpoint", on every run against a busy PostgreSQL ledger and one in three on SQLite."""

from __future__ import annotations

import threading
from pathlib import Path

from ledger_bundle_kit import ORIGIN, run

from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.verify import verify_store


def test_a_ledger_being_written_verifies(store_url: str) -> None:
    signer = NoteSigner.generate(ORIGIN)
    with Ledger.open(store_url, signer=signer) as led:
        for i in range(200):
            led.append("decision", {"i": i}, blobs={"s": b"snapshot %d" % i} if i % 50 == 0 else None)
        stop = threading.Event()

        def write() -> None:
            i = 0
            while not stop.is_set():
                led.append("decision", {"w": i})
                i += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:
            verdicts = [verify_store(store_url, signer.verifier()) for _ in range(20)]
        finally:
            stop.set()
            writer.join()
        sizes = [v.size for v in verdicts]
        assert all(v.ok for v in verdicts), [v.message for v in verdicts if not v.ok]
        assert sizes == sorted(sizes) and sizes[-1] > 200, sizes  # each run saw the ledger of its instant
        size = led.size()
    v = verify_store(store_url, signer.verifier())
    assert v.ok and v.size == size, v.message


def test_ledger_verify_cli_on_a_ledger_being_written(store_url: str, tmp_path: Path) -> None:
    signer = NoteSigner.generate(ORIGIN)
    key = tmp_path / "ledger.vkey"
    key.write_text(signer.vkey + "\n")
    with Ledger.open(store_url, signer=signer) as led:
        stop = threading.Event()

        def write() -> None:
            while not stop.is_set():
                led.append("decision", {"w": 1})

        led.append("decision", {"i": 0})
        writer = threading.Thread(target=write)
        writer.start()
        try:
            results = [run("verify", "--db", store_url, "--public-key", str(key)) for _ in range(3)]
        finally:
            stop.set()
            writer.join()
    for code, out, err in results:
        assert code == 0 and out.startswith("OK: "), out + err
