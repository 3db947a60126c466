"""RFC 6962 / RFC 9162 tree hashes and proofs against the published test vectors.

Vectors: tests/assets/rfc6962_vectors.json, copied from transparency-dev/merkle
proof/verify_test.go (the certificate-transparency-go lineage of RFC 6962 test data).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.compact import compact_append, compact_root, frontier_of
from ledger.errors import ProofError
from ledger.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    leaf_hash,
    root_from_leaf_hashes,
    verify_consistency,
    verify_inclusion,
)

VECTORS = json.loads((Path(__file__).parents[1] / "assets" / "rfc6962_vectors.json").read_text())
LEAVES = [leaf_hash(bytes.fromhex(x)) for x in VECTORS["leaves_hex"]]
ROOTS = [bytes.fromhex(x) for x in VECTORS["roots_hex"]]


def tree_of(n: int) -> MerkleTree:
    t = MerkleTree()
    for i in range(n):
        t.append(LEAVES[i] if i < len(LEAVES) else leaf_hash(i.to_bytes(8, "big")))
    return t


def test_empty_root_is_sha256_of_nothing() -> None:
    assert MerkleTree().root() == EMPTY_ROOT
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_match_vectors(size: int) -> None:
    assert tree_of(size).root() == ROOTS[size - 1]
    assert tree_of(8).root(size) == ROOTS[size - 1]
    assert MerkleTree.from_leaf_hashes(b"".join(LEAVES[:size])).root() == ROOTS[size - 1]


@pytest.mark.parametrize("v", VECTORS["inclusion"], ids=lambda v: f"{v['leaf_index']}-of-{v['tree_size']}")
def test_inclusion_vectors(v: dict[str, object]) -> None:
    i, n = int(v["leaf_index"]), int(v["tree_size"])  # type: ignore[call-overload]
    want = [bytes.fromhex(h) for h in v["path"]]  # type: ignore[attr-defined]
    assert tree_of(8).inclusion_proof(i, n) == want
    assert verify_inclusion(i, n, LEAVES[i], want, ROOTS[n - 1])
    assert not verify_inclusion(i, n, LEAVES[i], want, ROOTS[n - 2] if n > 1 else EMPTY_ROOT)
    if want:
        assert not verify_inclusion(i, n, LEAVES[i], want[:-1], ROOTS[n - 1])
        assert not verify_inclusion(i, n, LEAVES[i], [*want, want[0]], ROOTS[n - 1])


@pytest.mark.parametrize("v", VECTORS["consistency"], ids=lambda v: f"{v['old_size']}-to-{v['new_size']}")
def test_consistency_vectors(v: dict[str, object]) -> None:
    m, n = int(v["old_size"]), int(v["new_size"])  # type: ignore[call-overload]
    want = [bytes.fromhex(h) for h in v["path"]]  # type: ignore[attr-defined]
    assert tree_of(8).consistency_proof(m, n) == want
    assert verify_consistency(m, n, want, ROOTS[m - 1], ROOTS[n - 1])
    if want:
        assert not verify_consistency(m, n, want, ROOTS[n - 1], ROOTS[m - 1])
        assert not verify_consistency(m, n, want[:-1], ROOTS[m - 1], ROOTS[n - 1])


def test_trivial_consistency_cases() -> None:
    assert verify_consistency(0, 5, [], EMPTY_ROOT, ROOTS[4])
    assert not verify_consistency(2, 1, [], ROOTS[1], ROOTS[0])
    assert not verify_consistency(3, 3, [ROOTS[0]], ROOTS[2], ROOTS[2])
    assert not verify_consistency(1, 2, [], ROOTS[0], ROOTS[1])


def test_out_of_range_requests_raise_proof_error() -> None:
    t = tree_of(5)
    for bad in [(5, 5), (-1, 5), (0, 6), (0, 0)]:
        with pytest.raises(ProofError):
            t.inclusion_proof(*bad)
    with pytest.raises(ProofError):
        t.consistency_proof(3, 6)
    with pytest.raises(ProofError):
        t.root(6)


def test_truncate_restores_earlier_state() -> None:
    t = tree_of(13)
    t.truncate(6)
    assert t.root() == ROOTS[5]
    for i in range(6, 13):
        t.append(leaf_hash(i.to_bytes(8, "big")) if i >= 8 else LEAVES[i])
    assert t.root() == tree_of(13).root()


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_random_proofs_verify_and_bit_flips_fail(n: int, data: st.DataObject) -> None:
    leaves = [leaf_hash(i.to_bytes(4, "big")) for i in range(n)]
    t = MerkleTree()
    for lf in leaves:
        t.append(lf)
    assert t.root() == root_from_leaf_hashes(leaves)
    assert MerkleTree.from_leaf_hashes(b"".join(leaves)).root() == t.root()

    size = data.draw(st.integers(1, n), label="size")
    idx = data.draw(st.integers(0, size - 1), label="index")
    root = t.root(size)
    path = t.inclusion_proof(idx, size)
    assert verify_inclusion(idx, size, leaves[idx], path, root)
    if path:
        j = data.draw(st.integers(0, len(path) - 1), label="flip")
        bit = data.draw(st.integers(0, 255), label="bit")
        bad = list(path)
        bad[j] = bytes(b ^ (1 << (bit % 8)) if k == bit // 8 else b for k, b in enumerate(bad[j]))
        assert not verify_inclusion(idx, size, leaves[idx], bad, root)
    assert not verify_inclusion(idx, size, leaf_hash(b"other"), path, root)

    old = data.draw(st.integers(1, size), label="old")
    cproof = t.consistency_proof(old, size)
    assert verify_consistency(old, size, cproof, t.root(old), root)
    if cproof:
        j = data.draw(st.integers(0, len(cproof) - 1), label="cflip")
        bad = list(cproof)
        bad[j] = bytes([bad[j][0] ^ 1]) + bad[j][1:]
        assert not verify_consistency(old, size, bad, t.root(old), root)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.integers(1, 70), max_size=12))
def test_extend_equals_appending_one_by_one(chunks: list[int]) -> None:
    leaves = [leaf_hash(i.to_bytes(8, "big")) for i in range(sum(chunks))]
    one, bulk = MerkleTree(), MerkleTree()
    for h in leaves:
        one.append(h)
    i = 0
    for k in chunks:
        bulk.extend(leaves[i : i + k])
        i += k
    assert bulk.size == one.size
    for size in range(bulk.size + 1):
        assert bulk.root(size) == one.root(size) == root_from_leaf_hashes(leaves[:size])


@settings(max_examples=80, deadline=None)
@given(chunks=st.lists(st.integers(0, 300), min_size=1, max_size=8))
def test_a_frontier_appended_to_gives_the_trees_frontier_and_root(chunks: list[int]) -> None:
    """What a PostgreSQL ledger's head row carries (ledger_head.frontier), batch after batch, from any size."""
    leaves = [leaf_hash(i.to_bytes(8, "big")) for i in range(sum(chunks))]
    tree = MerkleTree()
    tree.extend(leaves)
    size, frontier = 0, b""
    for k in chunks:
        frontier = compact_append(size, frontier, leaves[size : size + k])
        size += k
        assert frontier == frontier_of(tree, size)
        assert len(frontier) == 32 * bin(size).count("1")
        assert compact_root(size, frontier) == tree.root(size) == root_from_leaf_hashes(leaves[:size])


@pytest.mark.parametrize(("size", "frontier"), [(3, b"\0" * 32), (2, b"\0" * 33), (0, b"\0" * 32)],
                         ids=["too-few-hashes", "not-whole-hashes", "hashes-for-nothing"])
def test_a_frontier_that_does_not_fit_its_size_is_a_proof_error(size: int, frontier: bytes) -> None:
    with pytest.raises(ProofError):
        compact_append(size, frontier, [leaf_hash(b"x")])
    with pytest.raises(ProofError):
        compact_root(size, frontier)
