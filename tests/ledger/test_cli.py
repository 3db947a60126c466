"""`jobgate ledger verify|prove|consistency` through click's CliRunner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import cli
from ledger.cli import ledger_group
from ledger.keys import load_or_create_signer
from ledger.merkle import verify_consistency, verify_inclusion
from ledger.service import Ledger

ORIGIN = "jobgate.local/ledger"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    signer = load_or_create_signer(tmp_path / "keys", ORIGIN)
    with Ledger.open(f"sqlite:///{tmp_path}/ledger.db", signer=signer) as led:
        for i in range(20):
            led.append("decision", {"i": i})
    return tmp_path


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(ledger_group, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.stdout, r.stderr


def test_verify_ok_prints_one_line(data_dir: Path) -> None:
    code, out, err = run("verify", "--data-dir", str(data_dir))
    assert code == 0, err
    assert out == f"OK: 20 entries, chain and tree intact, 20 checkpoints verified (origin {ORIGIN})\n"
    assert err == ""


def test_verify_json_and_db_url(data_dir: Path) -> None:
    code, out, _ = run(
        "verify",
        "--db",
        f"sqlite:///{data_dir}/ledger.db",
        "--public-key",
        str(data_dir / "keys/ledger.vkey"),
        "--json",
    )
    assert code == 0
    v = json.loads(out)
    assert v["ok"] is True and v["size"] == 20 and v["problem"] is None


def test_verify_tampered_exits_1_naming_the_seq(data_dir: Path) -> None:
    conn = sqlite3.connect(data_dir / "ledger.db")
    conn.execute("DROP TRIGGER ledger_entries_no_update")
    conn.execute("UPDATE ledger_entries SET data = replace(data, X'31', X'32') WHERE seq = 17")
    conn.commit()
    conn.close()
    code, out, _ = run("verify", "--data-dir", str(data_dir))
    assert code == 1
    assert out == "FAIL: seq 17 modified: stored hash does not match its bytes\n"


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "--data-dir", "/nonexistent/jobgate"],
        ["verify"],
        ["verify", "--db", "sqlite:///nonexistent/ledger.db", "--public-key", "/nonexistent.vkey"],
        ["prove", "--seq", "1", "--data-dir", "/nonexistent/jobgate"],
    ],
    ids=["missing-dir", "no-source", "missing-key", "prove-missing-dir"],
)
def test_bad_input_exits_2_with_one_line(args: list[str]) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert err.startswith("Error: ") and err.count("\n") == 1
    assert "Traceback" not in err and out == ""


def test_wrong_key_format_exits_2(data_dir: Path) -> None:
    (data_dir / "keys/ledger.vkey").write_text("not-a-key\n")
    code, _, err = run("verify", "--data-dir", str(data_dir))
    assert code == 2 and err.startswith("Error: ") and err.count("\n") == 1
    assert f"the data directory's verifier key {data_dir / 'keys/ledger.vkey'} is not a verifier key: " in err, err


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not-a-key\n", "verifier key must be <name>+<hex key id>+<base64 key>"),
        (None, "it is a private signing key; give its public half, the ledger.vkey beside it (the signing key"
               " stays with the gateway)"),
        # verify takes a key history (one vkey a line), and says which line is not one; export lists one key.
        ("a+0000abcd+AQ==\nb+0000abcd+AQ==\n", {"verify": "(line 1): verifier key is not an Ed25519 (type 0x01) key",
                                              "export": "a verifier key is one line, this file holds 2"}),
        (b"\xff\xfe\x00", "it is not text"),
        ("x" * 70000, {"verify": "a verifier key is one short line, this file is over 65536 bytes",
                       "export": "a verifier key is one short line, this file is over 4096 bytes"}),
    ],
    ids=["garbage", "signing-key", "several-lines", "binary", "a-bundle"],
)
@pytest.mark.parametrize("command", ["verify", "export"])
def test_a_public_key_that_is_not_one_names_the_option_and_file(
    data_dir: Path, tmp_path: Path, content: str | bytes | None, why: str | dict[str, str], command: str
) -> None:
    why = why[command] if isinstance(why, dict) else why
    key = data_dir / "keys/ledger.key" if content is None else tmp_path / "given.vkey"
    if isinstance(content, bytes):
        key.write_bytes(content)
    elif content is not None:
        key.write_text(content)
    more = ["--out", str(tmp_path / "out.bundle")] if command == "export" else []
    code, out, err = run(command, "--data-dir", str(data_dir), "--public-key", str(key), *more)
    assert (code, out) == (2, "")
    assert err == f"Error: --public-key {key} is not a verifier key{'' if why.startswith('(') else ':'} {why}\n", err
    assert "PRIVATE" not in err


def test_a_missing_public_key_names_the_option(data_dir: Path) -> None:
    code, _, err = run("verify", "--data-dir", str(data_dir), "--public-key", str(data_dir / "nope.vkey"))
    assert code == 2 and err == f"Error: cannot read --public-key {data_dir / 'nope.vkey'}: No such file or directory\n"


def test_verify_of_a_data_dir_without_a_ledger_says_so_not_that_a_key_is_missing(tmp_path: Path) -> None:
    code, _, err = run("verify", "--data-dir", str(tmp_path))
    assert code == 2 and err == f"Error: no ledger database at {tmp_path.resolve() / 'ledger.db'}\n", err
    code, _, err = run("verify", "--data-dir", str(tmp_path / "nope"))
    assert code == 2 and err == f"Error: data directory {tmp_path / 'nope'} does not exist\n", err


def test_prove_and_consistency_print_verifiable_json(data_dir: Path) -> None:
    import base64

    signer = load_or_create_signer(data_dir / "keys", ORIGIN)
    with Ledger.open(f"sqlite:///{data_dir}/ledger.db", signer=signer) as led:
        root, root7 = led.root(), led.root(7)
    code, out, _ = run("prove", "--seq", "5", "--data-dir", str(data_dir))
    assert code == 0
    p = json.loads(out)
    assert set(p) == {"leaf_index", "tree_size", "leaf_hash", "hashes"}
    hashes = [base64.b64decode(h) for h in p["hashes"]]
    assert verify_inclusion(5, 20, base64.b64decode(p["leaf_hash"]), hashes, root)
    code, out, _ = run("consistency", "--old", "7", "--data-dir", str(data_dir))
    assert code == 0
    c = json.loads(out)
    assert (c["old_size"], c["new_size"]) == (7, 20)
    assert verify_consistency(7, 20, [base64.b64decode(h) for h in c["hashes"]], root7, root)
    code, _, err = run("prove", "--seq", "50", "--data-dir", str(data_dir))
    assert code == 2 and err.startswith("Error: ")


@pytest.mark.parametrize(("args", "why"), [
    (["consistency", "--old", "100", "--new", "250"], "from size 100 to 250: the ledger holds 20 entries"),
    (["consistency", "--old", "15", "--new", "5"], "the old size is larger than the new one"),
    (["prove", "--seq", "20"], "leaf 20 in a tree of size 20: the tree of size 20 holds seqs 0..19"),
    (["prove", "--seq", "3", "--size", "30"], "the ledger holds 20 entries"),
])
def test_a_proof_out_of_range_says_what_the_ledger_holds(data_dir: Path, args: list[str], why: str) -> None:
    code, out, err = run(*args, "--data-dir", str(data_dir))
    assert (code, out) == (2, "")
    assert why in err and err.count("\n") == 1, err


def test_a_bundle_that_goes_away_mid_verify_is_a_one_line_error(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ledger.bundle"
    code, _, err = run("export", "--data-dir", str(data_dir), "--out", str(bundle))
    assert code == 0, err
    monkeypatch.setenv("JOBGATE_VERIFY_WORKERS", "2")  # workers open the bundle by its path
    real = cli.verify_with_history

    def goes_away(*args: object, **kwargs: object) -> object:
        bundle.unlink()  # after the verifier opened it, before the workers do
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "verify_with_history", goes_away)
    code, out, err = run("verify", "--bundle", str(bundle), "--public-key", str(data_dir / "keys/ledger.vkey"))
    assert code == 2 and out == ""
    assert err == f"Error: cannot read {bundle}: No such file or directory\n", err
