"""A ledger writer process for the crash tests: many threads append; each prints `<seq> <hash>` once durable.

Usage: python ledger_crash_writer.py STORE_URL KEYS_DIR THREADS [TAG]
A line on stdout is an acknowledgement: it is written only after Ledger.append() returned. Each entry's body
names its writer (TAG), thread and count, so a test can tell that every append is in the ledger exactly once.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ledger.keys import load_or_create_signer
from ledger.service import Ledger


def main() -> None:
    url, keys_dir, threads = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    tag = sys.argv[4] if len(sys.argv) > 4 else "w"
    led = Ledger.open(url, signer=load_or_create_signer(keys_dir, "jobgate.local/ledger"))
    out = sys.stdout
    lock = threading.Lock()

    def work(t: int) -> None:
        i = 0
        while True:
            blobs = {"evidence": f"{tag} t{t} i{i}".encode() * 50} if i % 10 == 0 else None
            r = led.append("decision", {"writer": tag, "thread": t, "i": i, "pad": "x" * 200}, blobs=blobs)
            with lock:
                out.write(f"{r.seq} {r.hash}\n")
                out.flush()
            i += 1

    for t in range(threads):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
