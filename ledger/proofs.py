"""RFC 9162 §2.1.3/§2.1.4 proof objects as served to clients, and an offline proof source.

JSON shapes (hashes base64, in RFC 9162 order):
  inclusion:   {"leaf_index", "tree_size", "leaf_hash", "hashes": [...]}
  consistency: {"old_size", "new_size", "hashes": [...]}
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from ledger.errors import StoreError
from ledger.merkle import MerkleTree
from ledger.store import LedgerStore


@dataclass(frozen=True)
class InclusionProof:
    leaf_index: int
    tree_size: int
    leaf_hash: bytes
    hashes: list[bytes]

    def to_json(self) -> dict[str, Any]:
        return {
            "leaf_index": self.leaf_index,
            "tree_size": self.tree_size,
            "leaf_hash": base64.b64encode(self.leaf_hash).decode(),
            "hashes": [base64.b64encode(h).decode() for h in self.hashes],
        }


@dataclass(frozen=True)
class ConsistencyProof:
    old_size: int
    new_size: int
    hashes: list[bytes]

    def to_json(self) -> dict[str, Any]:
        return {
            "old_size": self.old_size,
            "new_size": self.new_size,
            "hashes": [base64.b64encode(h).decode() for h in self.hashes],
        }


def tree_from_store(store: LedgerStore) -> MerkleTree:
    """Rebuild the tree from the stored entry bytes (read-only; no signer needed).

    Raises StoreError if seqs are not contiguous from 0.
    """
    leaves = bytearray()
    sha = hashlib.sha256
    for expect, (seq, _h, data) in enumerate(store.iter_entries(0)):
        if seq != expect:
            raise StoreError(f"ledger store has a gap at seq {expect}")
        leaves += sha(b"\x00" + data).digest()
    return MerkleTree.from_leaf_hashes(leaves)


def inclusion(tree: MerkleTree, seq: int, size: int | None = None) -> InclusionProof:
    """Raises ProofError for an index or size the tree does not have."""
    n = tree.size if size is None else size
    return InclusionProof(seq, n, tree.leaf(seq) if 0 <= seq < tree.size else b"", tree.inclusion_proof(seq, n))


def consistency(tree: MerkleTree, old: int, new: int | None = None) -> ConsistencyProof:
    """Raises ProofError for sizes the tree does not have."""
    n = tree.size if new is None else new
    return ConsistencyProof(old, n, tree.consistency_proof(old, n))
