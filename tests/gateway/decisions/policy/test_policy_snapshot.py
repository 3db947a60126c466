"""The policy hash names exactly the bytes that decide: the set is read once, parsed and hashed from that one
read. Before, the files were parsed, then read again for the hash, and the Rego modules were globbed with
dot-files while the hash left dot-files out."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gateway.decisions.policy import loader
from gateway.decisions.policy.engine import EmbeddedEngine
from gateway.decisions.policy.loader import load_policy_set, policy_hash
from gateway.settings import REPO_POLICIES


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, target)
    return target


# A reviewer's scratch module, kept beside the set under a dot-name.
OVERRIDE = """package jobgate.authz

import rego.v1

extra_note := "scratch"
"""


def test_a_dot_file_module_is_neither_loaded_nor_hashed(policies: Path) -> None:
    """A module the hash leaves out must not decide: editing it would change decisions while the ledger kept
    naming the same policy version, and a reload would answer "unchanged"."""
    before = load_policy_set(policies)
    (policies / ".scratch.rego").write_text(OVERRIDE)
    after = load_policy_set(policies)
    assert ".scratch.rego" not in after.rego_modules
    assert after.rego_modules == before.rego_modules and after.hash == before.hash == policy_hash(policies)


def test_an_editor_lock_link_does_not_refuse_the_set(policies: Path) -> None:
    """Emacs marks a file being edited with a dangling `.#NAME` link; the set was refused while it stood."""
    os.symlink("sam@host.4242:1700000000", policies / ".#authz.rego")
    assert load_policy_set(policies).hash == policy_hash(policies)


def test_a_file_saved_mid_load_is_not_hashed_in_place_of_the_one_parsed(policies: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A reviewer saves matrix.csv while the gateway loads the set: the set's hash must be that of the bytes it
    parsed (they decide), never of the file saved after."""
    matrix = policies / "matrix.csv"
    original_hash = policy_hash(policies)
    check_model = loader.check_model

    def save_during_load(text: str):  # the reviewer's save lands after the files were read
        matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))
        return check_model(text)

    monkeypatch.setattr(loader, "check_model", save_during_load)
    loaded = load_policy_set(policies)
    assert loaded.hash == original_hash != policy_hash(policies)
    assert any(r.role == "researcher" and r.capability == "job.stop.own" for r in loaded.matrix)
    engine = EmbeddedEngine(loaded, [])
    assert engine.policy_hash == original_hash


def test_a_missing_file_is_named(policies: Path) -> None:
    (policies / "data.json").unlink()
    with pytest.raises(loader.PolicyLoadError) as e:
        load_policy_set(policies)
    assert [str(p) for p in e.value.errors] == ["data.json:0: missing from the policy directory"]


def test_a_directory_named_like_a_module_is_refused_by_its_name(policies: Path) -> None:
    (policies / "extra.rego").mkdir()
    (policies / "extra.rego" / "notes.txt").write_text("a reviewer's notes\n")
    with pytest.raises(loader.PolicyLoadError) as e:
        load_policy_set(policies)
    assert [p.file for p in e.value.errors] == ["extra.rego"]
