"""Red team: a tampered bundle or store must be named by its first bad seq and the right reason, and no value an
attacker writes into the store may crash the verifier (issue 3, item 6)."""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from ledger_bundle_kit import (
    TAMPER_VARIANTS,
    Bundle,
    Line,
    delete,
    edit,
    export,
    insert,
    lines_of,
    make_data_dir,
    set_lines,
    verify,
)

JOBGATE = str(Path(".venv/bin/jobgate").resolve())


@pytest.fixture(scope="module")
def dd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("r3") / "var"
    make_data_dir(d)  # 40 entries, blobs at seqs 3, 17, 30, a checkpoint per entry
    return d


def _rewrite(b: Bundle, i: int) -> None:
    """What an attacker with the DB does: change entry i, re-hash it, re-link every later prev."""
    seq, _, raw = b.entry(i)
    raw = raw.replace(b'"alice"', b'"mallory"')
    b.set_entry(i, seq, hashlib.sha256(raw).hexdigest().encode(), raw)
    for j in range(i + 1, len(b.entries)):
        s, _, r = b.entry(j)
        old_prev = json.loads(r)["prev"].encode()
        r = r.replace(old_prev, b.entry(j - 1)[1])
        b.set_entry(j, s, hashlib.sha256(r).hexdigest().encode(), r)


def test_an_entry_rewritten_in_a_partial_bundle_is_named_not_the_checkpoint_before_the_range(
    dd: Path, tmp_path: Path
) -> None:
    """The checkpoint just before the range was checked first, against a root rebuilt from the edited entries,
    and took the blame (no seq); the checkpoints inside the range, which pin the entry down, were never reached."""
    b = Bundle.read(export(dd, tmp_path / "p.bundle", "--from-seq", "10", "--to-seq", "19"))
    _rewrite(b, 5)  # seq 15
    code, out, _ = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey", "--json")
    v = json.loads(out)
    assert code == 1
    assert v["first_bad_seq"] == 15 and v["problem"] == "modified" and v["start"] == 10, v["message"]


def test_two_swapped_lines_are_reported_reordered(dd: Path, tmp_path: Path) -> None:
    b = Bundle.read(export(dd, tmp_path / "f.bundle"))
    b.entries[7], b.entries[8] = b.entries[8], b.entries[7]
    code, out, _ = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey")
    assert code == 1 and out.startswith("FAIL: seq 7 reordered"), out


def test_a_repeated_line_is_reported_inserted(dd: Path, tmp_path: Path) -> None:
    b = Bundle.read(export(dd, tmp_path / "f.bundle"))
    b.entries.insert(8, b.entries[7])
    b.header["to_seq"] = 40
    code, out, _ = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey")
    assert code == 1 and out.startswith("FAIL: seq 8 inserted"), out


def test_the_verdict_names_the_first_bad_seq_when_a_later_blob_is_bad_too(dd: Path, tmp_path: Path) -> None:
    b = Bundle.read(export(dd, tmp_path / "f.bundle"))
    _rewrite(b, 5)
    raw = base64.b64decode(b.blobs[0]["data"])  # type: ignore[arg-type]
    b.blobs[0]["data"] = base64.b64encode(raw[:-1] + b"X").decode()
    code, out, _ = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey", "--json")
    v = json.loads(out)
    assert code == 1 and v["first_bad_seq"] == 5, v["message"]


@pytest.mark.parametrize("table", ["ledger_entries", "ledger_blobs"])
def test_a_number_in_a_blob_column_is_a_verdict_not_a_traceback(dd: Path, tmp_path: Path, table: str) -> None:
    d = tmp_path / "copy"
    shutil.copytree(dd, d)
    con = sqlite3.connect(d / "ledger.db")
    con.execute(f"DROP TRIGGER {table}_no_update")  # the attacker owns the file
    where = "WHERE seq = 5" if table == "ledger_entries" else ""
    con.execute(f"UPDATE {table} SET data = 9000000000000000000 {where}")
    con.commit()
    con.close()
    r = subprocess.run([JOBGATE, "ledger", "verify", "--data-dir", str(d)], capture_output=True, text=True)
    assert "Traceback" not in r.stderr and r.returncode == 1, r.stderr
    assert ("seq 5 modified" if table == "ledger_entries" else "blob_mismatch") in r.stdout, r.stdout


def test_a_trusted_checkpoint_inside_a_partial_range_needs_no_checkpoint_of_its_size_in_the_bundle(
    dd: Path, tmp_path: Path
) -> None:
    """The root at the trusted size was computed only where the bundle holds a checkpoint: KeyError otherwise."""
    notes = dict(sqlite3.connect(dd / "ledger.db").execute("SELECT size, note FROM ledger_checkpoints"))
    trusted = tmp_path / "cp15"
    trusted.write_text(notes[15])
    b = Bundle.read(export(dd, tmp_path / "p.bundle", "--from-seq", "10", "--to-seq", "19"))
    b.checkpoints = [c for c in b.checkpoints if c["checkpoint"] != 15]
    code, out, err = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey",
                            "--trusted-checkpoint", str(trusted))
    assert code == 0 and "consistent with trusted checkpoint at size 15" in out, out + err


@pytest.mark.parametrize(
    ("change", "problem", "seq"), [v[1:] for v in TAMPER_VARIANTS], ids=[v[0] for v in TAMPER_VARIANTS]
)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_rewritten_bundle_names_the_first_entry_changed_with_its_count_edited_too(
    dd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: str,
    change: Callable[[list[Line]], object], problem: str, seq: int,
) -> None:  # fmt: skip
    """The variants that add or drop lines leave the header's range as exported and the trailer's count fixed (the
    way the bundle kit writes), so header and trailer disagree: that was exit 2, unusable input, not a verdict."""
    b = Bundle.read(export(dd, tmp_path / "f.bundle"))
    rows = lines_of(b)
    change(rows)
    set_lines(b, rows)
    monkeypatch.setenv("JOBGATE_VERIFY_WORKERS", workers)
    code, out, err = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey", "--json")
    assert code == 1, out + err
    v = json.loads(out)
    assert (v["problem"], v["first_bad_seq"]) == (problem, seq), v["message"]


@pytest.mark.parametrize(
    ("change", "problem", "seq"),
    [
        (lambda r: edit(r, 5), "modified", 15),
        (lambda r: insert(r, 5), "inserted", 15),
        # The hashes after the range no longer fit its end: nothing tells a removal from an insertion.
        (lambda r: delete(r, 6), "modified", 16),
    ],
    ids=["edited-rehashed", "inserted", "deleted-relinked"],
)
def test_a_rewritten_partial_bundle_names_the_entry_from_the_roots_inside_its_range(
    dd: Path, tmp_path: Path, change: Callable[[list[Line]], object], problem: str, seq: int
) -> None:
    b = Bundle.read(export(dd, tmp_path / "p.bundle", "--from-seq", "10", "--to-seq", "19"))
    rows = lines_of(b)
    change(rows)
    set_lines(b, rows)
    code, out, _ = verify(b.write(tmp_path / "t.bundle"), dd / "keys/ledger.vkey", "--json")
    v = json.loads(out)
    assert code == 1 and (v["problem"], v["first_bad_seq"]) == (problem, seq), v["message"]


def test_a_trailer_count_edited_alone_is_still_a_corrupt_bundle(dd: Path, tmp_path: Path) -> None:
    """Every entry line verifies: only the unsigned count is off, so the file is unusable, not a tampered ledger."""
    path = export(dd, tmp_path / "f.bundle")
    lines = path.read_bytes().split(b"\n")
    trailer = json.loads(lines[-2])
    trailer["entries"] -= 1
    lines[-2] = json.dumps(trailer).encode()
    path.write_bytes(b"\n".join(lines))
    code, out, err = verify(path, dd / "keys/ledger.vkey")
    assert (code, out) == (2, ""), out + err
    assert err == "Error: bundle is corrupt: the header's range holds 40 entries, the trailer says 39\n", err
