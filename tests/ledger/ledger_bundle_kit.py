"""Helpers for bundle tests: a data dir with a ledger, the CLI runner, and a bundle line editor."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from ledger.cli import ledger_group
from ledger.keys import NoteSigner, load_or_create_signer
from ledger.service import Ledger

ORIGIN = "jobgate.local/ledger"
N = 40
BLOB_SEQS = (3, 17, 30)


def make_data_dir(path: Path, n: int = N, *, batch_sizes: bool = False) -> NoteSigner:
    """A data dir with n entries (blobs at BLOB_SEQS), one checkpoint per entry."""
    signer = load_or_create_signer(path / "keys", ORIGIN)
    with Ledger.open(f"sqlite:///{path}/ledger.db", signer=signer) as led:
        for i in range(n):
            blobs = {"snapshot": f"queue snapshot {i}".encode() * 5} if i in BLOB_SEQS else None
            led.append("decision", {"i": i, "actor": "alice", "action": "job.stop"}, blobs=blobs)
    return signer


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(ledger_group, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def export(data_dir: Path, out: Path, *extra: str) -> Path:
    code, _, err = run("export", "--data-dir", str(data_dir), "--out", str(out), *extra)
    assert code == 0, err
    return out


def verify(bundle: Path, key: Path, *extra: str) -> tuple[int, str, str]:
    return run("verify", "--bundle", str(bundle), "--public-key", str(key), *extra)


@dataclass
class Bundle:
    """A bundle split into its sections, editable and writable back."""

    header: dict[str, object]
    entries: list[bytes]
    blobs: list[dict[str, object]]
    checkpoints: list[dict[str, object]]
    trailer: dict[str, object]

    @classmethod
    def read(cls, path: Path) -> Bundle:
        lines = path.read_bytes().split(b"\n")[:-1]
        trailer = json.loads(lines[-1])
        n, b, c = int(trailer["entries"]), int(trailer["blobs"]), int(trailer["checkpoints"])
        body = lines[1:-1]
        return cls(
            json.loads(lines[0]),
            body[:n],
            [json.loads(x) for x in body[n : n + b]],
            [json.loads(x) for x in body[n + b : n + b + c]],
            trailer,
        )

    def write(self, path: Path) -> Path:
        self.trailer.update(entries=len(self.entries), blobs=len(self.blobs), checkpoints=len(self.checkpoints))
        head = json.dumps(self.header).encode() + b"\n"
        body = sum(len(e) + 1 for e in self.entries)
        self.trailer["entries_bytes"] = [len(head), len(head) + body]
        out = [head[:-1], *self.entries]
        out += [json.dumps(x).encode() for x in self.blobs + self.checkpoints]
        out.append(json.dumps(self.trailer).encode())
        path.write_bytes(b"\n".join(out) + b"\n")
        return path

    def entry(self, i: int) -> tuple[int, bytes, bytes]:
        seq, h, raw = self.entries[i].split(b" ", 2)
        return int(seq), h, raw

    def set_entry(self, i: int, seq: int, h: bytes, raw: bytes) -> None:
        self.entries[i] = b"%d %s %s" % (seq, h, raw)

    def edit(self, fn: Callable[[Bundle], None], path: Path) -> Path:
        fn(self)
        return self.write(path)
