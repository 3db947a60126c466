"""Helpers for bundle tests: a data dir with a ledger, the CLI runner, a bundle line editor, and the ways an
attacker who owns the entries (not the signing key) rewrites them, the same on a store and in a bundle."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from ledger.cli import ledger_group
from ledger.entry import ZERO_HASH, encode, prepare, tail_bytes
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


# -- rewriting entries: (seq, hex hash, entry bytes), a store row's columns or a bundle line's parts ----------

Line = tuple[int, bytes, bytes]


def lines_of(b: Bundle) -> list[Line]:
    return [b.entry(i) for i in range(len(b.entries))]


def set_lines(b: Bundle, rows: list[Line]) -> None:
    """Write rows back as b's entry lines. The header is left as it was: Bundle.write fixes only the trailer's
    counts, so a variant that adds or drops lines leaves the header's range and the trailer's count apart."""
    b.entries = [b"%d %s %s" % r for r in rows]


def _sha(raw: bytes) -> bytes:
    return hashlib.sha256(raw).hexdigest().encode()


def _retail(raw: bytes, seq: int, prev: bytes) -> bytes:
    """raw with another seq and prev (its time kept): the canonical tail is ,"prev":"..","seq":n,"time":".."}."""
    return raw[: raw.rindex(b',"prev":"')] + tail_bytes(seq, raw[-29:-2], prev)


def relink(rows: list[Line], i: int, end: int | None = None) -> None:
    """Renumber rows i.. (up to end) to follow row i - 1 and re-chain them, stored hashes recomputed: the chain
    alone then shows nothing there."""
    for j in range(i, len(rows) if end is None else end):
        seq, prev = (rows[j - 1][0] + 1, rows[j - 1][1]) if j else (0, ZERO_HASH.encode())
        raw = _retail(rows[j][2], seq, prev)
        rows[j] = (seq, _sha(raw), raw)


def edit(rows: list[Line], i: int) -> None:
    """Change entry i's body and recompute its stored hash; the next entry's prev still holds the hash it had."""
    seq, _, raw = rows[i]
    bad = raw.replace(b'"alice"', b'"mallory"')
    assert bad != raw
    rows[i] = (seq, _sha(bad), bad)


def edit_prev(rows: list[Line], i: int) -> None:
    """Change entry i's prev (stored hash recomputed): the entry before it is intact."""
    seq, _, raw = rows[i]
    bad = _retail(raw, seq, b"ab" * 32)
    rows[i] = (seq, _sha(bad), bad)


def insert(rows: list[Line], i: int, k: int = 1) -> None:
    """Put k forged entries in at seq i, chained to the entry before; the entries after move down k seqs (the seq
    column or line prefix renumbered), their bytes untouched."""
    forged: list[Line] = []
    seq, prev = rows[i - 1][0] + 1, rows[i - 1][1]
    for n in range(k):
        raw = encode(prepare("decision", {"forged": n}, None), seq + n, "2025-01-02T03:04:06.000000Z", prev.decode())
        forged.append((seq + n, _sha(raw), raw))
        prev = forged[-1][1]
    rows[i:] = [*forged, *((s + k, h, r) for s, h, r in rows[i:])]


def delete(rows: list[Line], i: int) -> None:
    """Remove entry i, renumber the rest and re-chain them."""
    del rows[i]
    relink(rows, i)


# Each rewrite of a ledger of at least 12 entries signed one checkpoint per entry, with the problem and the seq
# the verifier must name: the entry changed, put in, or the first renumbered one.
TAMPER_VARIANTS: list[tuple[str, Callable[[list[Line]], object], str, int]] = [
    ("edited-rehashed", lambda r: edit(r, 5), "modified", 5),
    ("prev-rehashed", lambda r: edit_prev(r, 6), "modified", 6),
    ("edited-relinked", lambda r: (edit(r, 5), relink(r, 6)), "modified", 5),
    # Re-chained only up to 8: the chain breaks at 9, which points at 8, but the roots show 5 changed already.
    ("edited-relinked-part-way", lambda r: (edit(r, 5), relink(r, 6, 9)), "modified", 5),
    ("inserted", lambda r: insert(r, 5), "inserted", 5),
    ("inserted-two", lambda r: insert(r, 5, 2), "inserted", 5),
    ("inserted-relinked", lambda r: (insert(r, 5), relink(r, 6)), "inserted", 5),
    ("deleted-relinked", lambda r: delete(r, 6), "missing", 6),
]
