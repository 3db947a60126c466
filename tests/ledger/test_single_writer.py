"""One writer per ledger: a second one is refused when it opens, not by failing every append later."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ledger.errors import StoreError
from ledger.keys import NoteSigner
from ledger.service import Ledger
from ledger.store import open_store
from ledger.verify import verify_store


def test_a_second_writer_is_refused_and_readers_are_not(store_url: str, signer: NoteSigner) -> None:
    first = Ledger.open(store_url, signer=signer)
    first.append("k", {"i": 0})
    with pytest.raises(StoreError, match="already being written by another process"):
        Ledger.open(store_url, signer=signer)
    reader = open_store(store_url, create=False)  # auditors and the CLI read beside the writer
    assert reader.count() == 1
    reader.close()
    assert first.append("k", {"i": 1}).seq == 1  # the refused one disturbed nothing
    first.close()
    second = Ledger.open(store_url, signer=signer)  # closed: the next writer may open it
    assert second.append("k", {"i": 2}).seq == 2
    second.close()
    verdict = verify_store(store_url, signer.verifier())
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


def test_the_claim_dies_with_the_process_that_held_it(store_url: str, signer: NoteSigner, tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store_url, str(tmp_path / "keys")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="already being written"):
            Ledger.open(store_url, signer=signer)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up in the holder: the kernel (or server) lets go
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    deadline = time.monotonic() + 30  # PostgreSQL ends the dead client's session when it notices
    while True:
        try:
            led = Ledger.open(store_url, signer=signer)
            break
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert led.append("k", {"from": "next"}).seq == 1
    led.close()
