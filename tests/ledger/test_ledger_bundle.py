"""Export bundles verified offline: full and partial ranges, every tamper kind, trusted checkpoints."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from ledger_bundle_kit import BLOB_SEQS, ORIGIN, Bundle, N, export, make_data_dir, run, verify

from ledger.entry import encode, prepare
from ledger.keys import NoteSigner, load_or_create_signer
from ledger.service import Ledger


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "var"
    make_data_dir(d)
    return d


@pytest.fixture
def key(data_dir: Path) -> Path:
    return data_dir / "keys" / "ledger.vkey"


@pytest.fixture
def full(data_dir: Path, tmp_path: Path) -> Path:
    return export(data_dir, tmp_path / "full.bundle")


def test_full_bundle_verifies_with_one_summary_line(full: Path, key: Path) -> None:
    code, out, err = verify(full, key)
    assert code == 0, out + err
    assert out == f"OK: {N} entries, chain and tree intact, {N} checkpoints verified (origin {ORIGIN})\n"
    assert err == ""
    b = Bundle.read(full)
    assert b.header["format"] == "jobgate-ledger-bundle/1" and b.header["tree_size"] == N
    assert len(b.blobs) == len(BLOB_SEQS) and b.header["keys"] == [key.read_text().strip()]


def test_json_verdict(full: Path, key: Path) -> None:
    code, out, _ = verify(full, key, "--json")
    v = json.loads(out)
    assert code == 0 and v["ok"] and v["size"] == N and v["problem"] is None and v["checkpoints"] == N


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 9), (13, 29), (31, N - 1), (17, 17), (N - 1, N - 1), (1, N - 2), (32, 32)],
    ids=["prefix", "middle", "suffix", "single", "last", "inner", "aligned"],
)
def test_partial_bundle_is_proven_part_of_the_signed_tree(
    data_dir: Path, key: Path, tmp_path: Path, lo: int, hi: int
) -> None:
    bundle = export(data_dir, tmp_path / "part.bundle", "--from-seq", str(lo), "--to-seq", str(hi))
    code, out, err = verify(bundle, key)
    assert code == 0, out + err
    assert out.startswith(f"OK: {hi - lo + 1} entries")
    b = Bundle.read(bundle)
    assert len(b.entries) == hi - lo + 1
    assert len(b.blobs) == sum(lo <= s <= hi for s in BLOB_SEQS)


def test_partial_bundle_with_forged_left_hashes_fails(data_dir: Path, key: Path, tmp_path: Path) -> None:
    b = Bundle.read(export(data_dir, tmp_path / "p.bundle", "--from-seq", "13", "--to-seq", "29"))

    def forge(x: Bundle) -> None:
        left = list(x.trailer["left"])  # type: ignore[call-overload]
        left[0] = base64.b64encode(bytes(32)).decode()
        x.trailer["left"] = left

    code, out, _ = verify(b.edit(forge, tmp_path / "forged.bundle"), key)
    assert code == 1 and out.startswith("FAIL: ") and "modified" in out


# -- tampering: one edited bundle per failure kind -------------------------------------------------


def _modify_raw(b: Bundle) -> None:
    seq, h, raw = b.entry(7)
    b.set_entry(7, seq, h, raw.replace(b'"alice"', b'"alicf"'))


def _modify_and_rehash(b: Bundle) -> None:
    seq, _, raw = b.entry(7)
    bad = raw.replace(b'"alice"', b'"mallory"')
    b.set_entry(7, seq, hashlib.sha256(bad).hexdigest().encode(), bad)


def _drop(b: Bundle) -> None:
    del b.entries[9]
    b.header["to_seq"] = int(b.header["to_seq"]) - 1  # type: ignore[call-overload]


def _swap(b: Bundle) -> None:
    s4, h4, r4 = b.entry(4)
    s5, h5, r5 = b.entry(5)
    b.set_entry(4, s4, h5, r5)
    b.set_entry(5, s5, h4, r4)


def _insert(b: Bundle) -> None:
    _, h11, _ = b.entry(11)
    forged = encode(prepare("decision", {"forged": True}, None), 12, "2025-01-02T03:04:06.000000Z", h11.decode())
    rows = [b.entry(i) for i in range(len(b.entries))]
    new = [*rows[:12], (12, hashlib.sha256(forged).hexdigest().encode(), forged)]
    new += [(s + 1, h, r) for s, h, r in rows[12:]]
    b.entries = [b"%d %s %s" % r for r in new]
    b.header["to_seq"] = int(b.header["to_seq"]) + 1  # type: ignore[call-overload]


def _truncate_keep_checkpoints(b: Bundle) -> None:
    b.entries = b.entries[:30]
    b.header["to_seq"] = 29


def _flip_signature(b: Bundle) -> None:
    cp = b.checkpoints[5]
    text, _, line = str(cp["note"]).rpartition("\n\n")
    dash, name, b64 = line.rstrip("\n").split(" ")
    sig = bytearray(base64.b64decode(b64))
    sig[-1] ^= 1
    cp["note"] = f"{text}\n\n{dash} {name} {base64.b64encode(bytes(sig)).decode()}\n"


def _blob_of(b: Bundle, seq: int) -> int:
    want = f"queue snapshot {seq}".encode() * 5
    return next(i for i, x in enumerate(b.blobs) if base64.b64decode(str(x["data"])) == want)


def _change_blob(b: Bundle) -> None:
    b.blobs[_blob_of(b, BLOB_SEQS[1])]["data"] = base64.b64encode(b"another snapshot").decode()


def _drop_blob(b: Bundle) -> None:
    del b.blobs[_blob_of(b, BLOB_SEQS[0])]


@pytest.mark.parametrize(
    ("edit", "problem", "seq"),
    [
        (_modify_raw, "modified", 7),
        (_modify_and_rehash, "modified", 7),  # not 8, whose prev the recomputed hash breaks
        (_drop, "missing", 9),
        (_swap, "reordered", 4),
        (_insert, "inserted", 12),  # the forged entry itself, not the one pushed down after it
        (_truncate_keep_checkpoints, "truncated", 30),
        (_flip_signature, "bad_signature", None),
        (_change_blob, "blob_mismatch", BLOB_SEQS[1]),
        (_drop_blob, "blob_mismatch", BLOB_SEQS[0]),
    ],
    ids=["modified", "rehashed", "missing", "reordered", "inserted", "truncated", "bad-signature", "blob", "no-blob"],
)
def test_tampered_bundle_names_first_bad_seq(
    full: Path, key: Path, tmp_path: Path, edit: object, problem: str, seq: int | None
) -> None:
    bad = Bundle.read(full).edit(edit, tmp_path / "bad.bundle")  # type: ignore[arg-type]
    code, out, err = verify(bad, key, "--json")
    assert code == 1, out + err
    v = json.loads(out)
    assert (v["problem"], v["first_bad_seq"]) == (problem, seq), v["message"]
    code, out, _ = verify(bad, key)
    assert code == 1 and out.startswith("FAIL: ") and out.count("\n") == 1 and problem in out


def test_other_key_with_same_name_is_untrusted_key_not_tampering(full: Path, tmp_path: Path) -> None:
    """It read like tampering (`FAIL: unknown_key`, exit 1): a key the bundle was never signed with finds nothing
    either way."""
    other = tmp_path / "other.vkey"
    other.write_text(NoteSigner.generate(ORIGIN).vkey + "\n")
    code, out, _ = verify(full, other, "--json")
    assert code == 3 and json.loads(out)["problem"] == "untrusted_key", out
    code, out, _ = verify(full, other)
    assert code == 3 and out.startswith("NOT VERIFIED: untrusted_key: signed by a key not in the history you gave"), out


# -- the auditor's saved checkpoint ----------------------------------------------------------------


def _ledger(path: Path, signer: NoteSigner, bodies: list[dict[str, object]]) -> list[str]:
    """Build a ledger; return the signed checkpoint after each append."""
    notes = []
    with Ledger.open(f"sqlite:///{path}/ledger.db", signer=signer) as led:
        for body in bodies:
            led.append("decision", body)
            notes.append(led.latest_checkpoint())
    return notes


def test_rewritten_history_resigned_is_caught_by_trusted_checkpoint(tmp_path: Path) -> None:
    # An insider with the signing key rebuilds the ledger without one decision, and re-signs it all.
    signer = load_or_create_signer(tmp_path / "a" / "keys", ORIGIN)
    notes = _ledger(tmp_path / "a", signer, [{"i": i} for i in range(20)])
    trusted = tmp_path / "trusted.note"
    trusted.write_text(notes[11])  # the auditor saved the checkpoint at size 12 last month
    (tmp_path / "b").mkdir()
    _ledger(tmp_path / "b", signer, [{"i": i} for i in range(20) if i != 5])
    bundle = export(tmp_path / "b", tmp_path / "b.bundle", "--public-key", str(tmp_path / "a/keys/ledger.vkey"))
    key = tmp_path / "a" / "keys" / "ledger.vkey"
    code, out, _ = verify(bundle, key)
    assert code == 0, "without the trusted checkpoint a re-signed history looks intact"
    code, out, _ = verify(bundle, key, "--trusted-checkpoint", str(trusted), "--json")
    v = json.loads(out)
    assert code == 1 and v["problem"] == "modified" and "rewritten" in v["message"]
    good = export(tmp_path / "a", tmp_path / "a.bundle")
    code, out, _ = verify(good, key, "--trusted-checkpoint", str(trusted))
    assert code == 0 and "trusted checkpoint at size 12" in out


def test_truncated_history_resigned_is_caught_by_trusted_checkpoint(tmp_path: Path) -> None:
    signer = load_or_create_signer(tmp_path / "a" / "keys", ORIGIN)
    notes = _ledger(tmp_path / "a", signer, [{"i": i} for i in range(20)])
    trusted = tmp_path / "trusted.note"
    trusted.write_text(notes[-1])
    (tmp_path / "b").mkdir()
    _ledger(tmp_path / "b", signer, [{"i": i} for i in range(15)])
    bundle = export(tmp_path / "b", tmp_path / "b.bundle", "--public-key", str(tmp_path / "a/keys/ledger.vkey"))
    code, out, _ = verify(bundle, tmp_path / "a/keys/ledger.vkey", "--trusted-checkpoint", str(trusted), "--json")
    v = json.loads(out)
    assert code == 1 and (v["problem"], v["first_bad_seq"]) == ("truncated", 15)
    # Same check straight on the store.
    code, out, _ = run(
        "verify", "--data-dir", str(tmp_path / "b"), "--public-key", str(tmp_path / "a/keys/ledger.vkey"),
        "--trusted-checkpoint", str(trusted),
    )  # fmt: skip
    assert code == 1 and "truncated" in out


def test_trusted_checkpoint_inside_a_partial_range(data_dir: Path, key: Path, tmp_path: Path) -> None:
    with Ledger.open(f"sqlite:///{data_dir}/ledger.db", signer=load_or_create_signer(data_dir / "keys", ORIGIN)) as led:
        note = led.latest_checkpoint()
    trusted = tmp_path / "t.note"
    trusted.write_text(note)
    bundle = export(data_dir, tmp_path / "p.bundle", "--from-seq", "20", "--to-seq", "25")
    code, out, _ = verify(bundle, key, "--trusted-checkpoint", str(trusted))
    assert code == 0, out


# -- bad input: one line, non-zero, never a traceback ----------------------------------------------


def _expect_error(code: int, out: str, err: str) -> None:
    assert code == 2, out + err
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""


def test_truncated_bundle_files(full: Path, key: Path, tmp_path: Path) -> None:
    data = full.read_bytes()
    cut_points = [0, 10, len(data) // 3, len(data) // 2, len(data) - 5, data.rfind(b"\n", 0, len(data) - 1) + 1]
    for cut in cut_points:
        bad = tmp_path / f"cut{cut}.bundle"
        bad.write_bytes(data[:cut])
        _expect_error(*verify(bad, key))


def test_corrupt_bundle_files(full: Path, key: Path, tmp_path: Path) -> None:
    data = full.read_bytes()
    lines = data.split(b"\n")
    cases = {
        "garbage": b"\x00\xff garbage\n",
        "json-not-bundle": b'{"hello": 1}\n{"end": 2}\n',
        "bad-header": b"not json\n" + b"\n".join(lines[1:]),
        "bad-trailer-counts": b"\n".join(lines[:-2]) + b'\n{"end": "jobgate-ledger-bundle/1", "entries": -1}\n',
        "entry-line-shape": b"\n".join([lines[0], b"garbage-line", *lines[2:]]),
        "bad-left-hash": b"\n".join(lines[:-2])
        + b"\n"
        + json.dumps({**json.loads(lines[-2]), "left": ["!!"]}).encode()
        + b"\n",
    }
    for name, content in cases.items():
        bad = tmp_path / f"{name}.bundle"
        bad.write_bytes(content)
        code, out, err = verify(bad, key)
        assert code == 2, (name, out, err)
        _expect_error(code, out, err)


def test_missing_bundle_and_bad_keys(full: Path, key: Path, tmp_path: Path) -> None:
    _expect_error(*verify(tmp_path / "nope.bundle", key))
    bad_key = tmp_path / "bad.vkey"
    bad_key.write_text("not-a-key\n")
    _expect_error(*verify(full, bad_key))
    _expect_error(*verify(full, tmp_path / "missing.vkey"))
    _expect_error(*run("verify", "--bundle", str(full)))  # no key


def test_bundle_from_another_origin(full: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.vkey"
    other.write_text(NoteSigner.generate("other.example/ledger").vkey + "\n")
    code, out, err = verify(full, other)
    _expect_error(code, out, err)
    assert "jobgate.local/ledger" in err


def test_bad_trusted_checkpoints(full: Path, data_dir: Path, key: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.note"
    garbage.write_text("garbage")
    _expect_error(*verify(full, key, "--trusted-checkpoint", str(garbage)))
    foreign = tmp_path / "foreign.note"
    from ledger.note import Checkpoint, sign_checkpoint

    foreign.write_text(sign_checkpoint(Checkpoint("other.example/ledger", 3, bytes(32)), NoteSigner.generate("o")))
    _expect_error(*verify(full, key, "--trusted-checkpoint", str(foreign)))
    unsigned = tmp_path / "unsigned.note"
    unsigned.write_text(sign_checkpoint(Checkpoint(ORIGIN, 3, bytes(32)), NoteSigner.generate(ORIGIN)))
    _expect_error(*verify(full, key, "--trusted-checkpoint", str(unsigned)))
    # A checkpoint before a partial range cannot be checked against it: said so, not guessed.
    from ledger.store import open_store

    store = open_store(f"sqlite:///{data_dir}/ledger.db", create=False)
    notes = dict(store.checkpoints())
    store.close()
    early = tmp_path / "early.note"
    early.write_text(notes[10])
    part = export(data_dir, tmp_path / "p.bundle", "--from-seq", "20", "--to-seq", "25")
    code, out, err = verify(part, key, "--trusted-checkpoint", str(early))
    _expect_error(code, out, err)
    assert "--from-seq 9" in err
    assert verify(full, key, "--trusted-checkpoint", str(early))[0] == 0
    # One after the range: the advice must point past its end, not before its start.
    late = tmp_path / "late.note"
    late.write_text(notes[30])
    code, out, err = verify(part, key, "--trusted-checkpoint", str(late))
    _expect_error(code, out, err)
    assert "after this bundle's entries (up to seq 25)" in err and "--to-seq 29" in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["--from-seq", "100"],
        ["--from-seq", "10", "--to-seq", "5"],
        ["--to-seq", "1000"],
        ["--from-seq", "-1"],
    ],
    ids=["from-beyond", "to-before-from", "to-beyond", "negative"],
)
def test_export_out_of_range(data_dir: Path, tmp_path: Path, args: list[str]) -> None:
    _expect_error(*run("export", "--data-dir", str(data_dir), "--out", str(tmp_path / "x.bundle"), *args))
    assert not (tmp_path / "x.bundle").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["prove", "--seq", str(N)],
        ["prove", "--seq", "-1"],
        ["prove", "--seq", "3", "--size", "2"],
        ["prove", "--seq", "3", "--size", str(N + 1)],
        ["consistency", "--old", str(N + 1)],
        ["consistency", "--old", "5", "--new", "3"],
        ["consistency", "--old", "-2"],
    ],
    ids=["seq-beyond", "seq-negative", "size-below-seq", "size-beyond", "old-beyond", "old-gt-new", "old-negative"],
)
def test_proof_sizes_out_of_range(data_dir: Path, args: list[str]) -> None:
    _expect_error(*run(*args, "--data-dir", str(data_dir)))


def test_progress_bar_only_on_a_terminal(
    full: Path, key: Path, run_on_a_terminal: Callable[..., tuple[int, bytes, bytes]]
) -> None:
    code, out, seen = run_on_a_terminal("ledger", "verify", "--bundle", str(full), "--public-key", str(key))
    assert code == 0 and out.startswith(b"OK: ")
    assert b"verifying [" in seen and b"100%" in seen and f"{N}/{N}".encode() in seen
    # Not a terminal (CliRunner): nothing on stderr.
    assert verify(full, key)[2] == ""


# -- parallel verification agrees with the sequential one ------------------------------------------


def _verdict(bundle: Path, key: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str | None, object]:
    monkeypatch.setenv("JOBGATE_VERIFY_WORKERS", str(workers))
    code, out, err = verify(bundle, key, "--json")
    if code == 2:
        return code, "error", err
    v = json.loads(out)
    return code, v["problem"], v["first_bad_seq"]


@pytest.mark.parametrize(
    "edit",
    [
        None,
        _modify_raw,
        _modify_and_rehash,
        _drop,
        _swap,
        _insert,
        _truncate_keep_checkpoints,
        _flip_signature,
        _change_blob,
        _drop_blob,
    ],
    ids=[
        "intact",
        "modified",
        "rehashed",
        "missing",
        "reordered",
        "inserted",
        "truncated",
        "bad-signature",
        "blob",
        "no-blob",
    ],
)
def test_parallel_workers_give_the_same_verdict(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object
) -> None:
    bundle = full if edit is None else Bundle.read(full).edit(edit, tmp_path / "bad.bundle")  # type: ignore[arg-type]
    one = _verdict(bundle, key, 1, monkeypatch)
    for workers in (2, 3, 7):
        assert _verdict(bundle, key, workers, monkeypatch) == one


def test_parallel_workers_catch_a_break_exactly_at_a_range_boundary(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger import fastscan

    b = Bundle.read(full)
    span = b.trailer["entries_bytes"]
    ranges = fastscan.split_points(str(full), span[0], span[1], 2)  # type: ignore[index]
    with open(full, "rb") as f:
        f.seek(ranges[1][0])
        first_of_second = int(f.read(20).split(b" ")[0])
    last_of_first = first_of_second - 1

    def rehash(x: Bundle) -> None:
        seq, _, raw = x.entry(last_of_first)
        bad = raw.replace(b'"alice"', b'"mallory"')
        x.set_entry(last_of_first, seq, hashlib.sha256(bad).hexdigest().encode(), bad)

    bad = Bundle.read(full).edit(rehash, tmp_path / "edge.bundle")
    assert _verdict(bad, key, 1, monkeypatch) == (1, "modified", last_of_first)
    assert _verdict(bad, key, 2, monkeypatch) == (1, "modified", last_of_first)


def test_parallel_scan_keeps_the_order_of_problems_after_the_entries(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent reads the sections after the entries while workers scan; a bad entry must still be
    # reported before a corrupt checkpoint line, and the corrupt line alone still as an error.
    def corrupt_checkpoint_line(src: Path, dst: Path) -> Path:
        lines = src.read_bytes().split(b"\n")
        i = next(k for k, line in enumerate(lines) if line.startswith(b'{"checkpoint"'))
        lines[i] = b"{not json"
        dst.write_bytes(b"\n".join(lines))
        return dst

    corrupt = corrupt_checkpoint_line(full, tmp_path / "corrupt-cp.bundle")
    for workers in (1, 2):
        code, problem, _ = _verdict(corrupt, key, workers, monkeypatch)
        assert (code, problem) == (2, "error")
    modified = Bundle.read(full).edit(_modify_raw, tmp_path / "modified.bundle")
    both = corrupt_checkpoint_line(modified, tmp_path / "both.bundle")
    assert _verdict(both, key, 1, monkeypatch) == _verdict(both, key, 2, monkeypatch) == (1, "modified", 7)


def _first_of_second_range(bundle: Path) -> int:
    from ledger import fastscan

    span = Bundle.read(bundle).trailer["entries_bytes"]
    ranges = fastscan.split_points(str(bundle), span[0], span[1], 2)  # type: ignore[index]
    with open(bundle, "rb") as f:
        f.seek(ranges[1][0])
        return int(f.read(20).split(b" ")[0])


def test_parallel_workers_name_an_entry_missing_at_a_range_boundary(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second range's first line is the entry after the dropped one: one sequential scan would
    # call that a missing entry, not a corrupt bundle.
    at = _first_of_second_range(full)
    assert 0 < at < N - 1

    def drop(x: Bundle) -> None:
        del x.entries[at]
        x.header["to_seq"] = int(x.header["to_seq"]) - 1  # type: ignore[call-overload]

    bad = Bundle.read(full).edit(drop, tmp_path / "gap.bundle")
    assert _first_of_second_range(bad) == at + 1
    assert _verdict(bad, key, 1, monkeypatch) == _verdict(bad, key, 2, monkeypatch) == (1, "missing", at)


def test_parallel_workers_report_a_broken_prev_first_at_a_range_boundary(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A range's first line is checked without the entry before it; its prev (checked before its
    # kind, in order) must still be what is reported when both are wrong.
    at = _first_of_second_range(full)

    def forge(x: Bundle) -> None:
        seq, _, raw = x.entry(at)
        prev = raw[raw.index(b'"prev":"') + 8 :][:64]
        bad = raw.replace(prev, b"ab" * 32).replace(b'"kind":"decision"', b'"kind":""')
        x.set_entry(at, seq, hashlib.sha256(bad).hexdigest().encode(), bad)

    bad = Bundle.read(full).edit(forge, tmp_path / "prev.bundle")
    assert _verdict(bad, key, 1, monkeypatch) == _verdict(bad, key, 2, monkeypatch) == (1, "modified", at)


@pytest.mark.parametrize(
    "edit",
    [None, _modify_raw, _modify_and_rehash, _drop, _swap, _insert, _truncate_keep_checkpoints, _change_blob],
    ids=["intact", "modified", "rehashed", "missing", "reordered", "inserted", "truncated", "blob"],
)
def test_many_ranges_per_worker_give_the_same_verdict(
    full: Path, key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object
) -> None:
    # Large bundles are cut into many more ranges than workers; here every range holds a line or
    # two, so nearly every entry starts a range and is stitched to the one before.
    from ledger import fastscan

    bundle = full if edit is None else Bundle.read(full).edit(edit, tmp_path / "bad.bundle")  # type: ignore[arg-type]
    one = _verdict(bundle, key, 1, monkeypatch)
    monkeypatch.setattr(fastscan, "TASK_MIN_BYTES", 1)
    for workers in (2, 3):
        assert fastscan.tasks_for(workers, 10_000) == workers * fastscan.TASKS_PER_WORKER
        assert _verdict(bundle, key, workers, monkeypatch) == one
