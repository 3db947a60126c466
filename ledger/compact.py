"""Compact ranges over an RFC 6962 tree: the O(log n) hashes that stand in for a run of leaves.

A compact range [lo, hi) is the list of hashes of the maximal aligned perfect subtrees covering it,
left to right (Trillian's "compact range"). The prefix [0, a) has one node per set bit of a, largest
first. A partial export bundle carries the compact ranges left and right of its entries, so the
verifier can rebuild the root of the whole signed tree from those hashes and the entries it holds.
A PostgreSQL ledger keeps the prefix's compact range, its frontier, in its head row (ledger_head), so that
a process appending a batch computes the new root from it without holding the whole tree
(compact_append, compact_root).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ledger.errors import ProofError
from ledger.merkle import EMPTY_ROOT, HASH_SIZE, MerkleTree, node_hash


def range_shape(lo: int, hi: int) -> list[tuple[int, int]]:
    """(start, level) of each aligned perfect subtree of the compact range [lo, hi), left to right."""
    if not 0 <= lo <= hi:
        raise ProofError(f"bad range [{lo}, {hi})")
    out: list[tuple[int, int]] = []
    while lo < hi:
        # The largest power of two that lo is aligned to and that still fits before hi.
        k = (lo & -lo).bit_length() - 1 if lo else (hi - lo).bit_length() - 1
        while lo + (1 << k) > hi:
            k -= 1
        out.append((lo, k))
        lo += 1 << k
    return out


def compact_range(tree: MerkleTree, lo: int, hi: int) -> list[bytes]:
    """The compact-range hashes of [lo, hi) in tree; raises ProofError if hi exceeds the tree."""
    if hi > tree.size:
        raise ProofError(f"range [{lo}, {hi}) is beyond the tree's {tree.size} leaves")
    return [tree.subtree_hash(start, start + (1 << k)) for start, k in range_shape(lo, hi)]


class Frontier:
    """The compact range [0, size): appendable, and folds to the RFC 6962 root at any moment."""

    __slots__ = ("_levels", "_nodes", "size")

    def __init__(self, size: int = 0, nodes: Sequence[bytes] = ()) -> None:
        """Start from the compact range of [0, size); raises ProofError if nodes do not fit size."""
        shape = range_shape(0, size)
        if len(nodes) != len(shape) or any(len(h) != HASH_SIZE for h in nodes):
            raise ProofError(f"a prefix of {size} leaves needs {len(shape)} hashes, got {len(nodes)}")
        self.size = size
        self._nodes: list[bytes] = list(nodes)
        self._levels: list[int] = [k for _, k in shape]

    def push(self, node: bytes, level: int) -> None:
        """Append the hash of the aligned perfect subtree of 2**level leaves starting at size."""
        if self.size & ((1 << level) - 1):
            raise ProofError(f"a subtree of 2**{level} leaves cannot start at {self.size}")
        nodes, levels = self._nodes, self._levels
        self.size += 1 << level
        h = node
        # Binary carry: equal-sized neighbours merge into their parent.
        while levels and levels[-1] == level:
            h = node_hash(nodes.pop(), h)
            levels.pop()
            level += 1
        nodes.append(h)
        levels.append(level)

    def append_leaf(self, leaf: bytes) -> None:
        """Append one leaf hash (amortised one node hash)."""
        nodes, levels = self._nodes, self._levels
        h, level = leaf, 0
        while levels and levels[-1] == level:
            h = node_hash(nodes.pop(), h)
            levels.pop()
            level += 1
        nodes.append(h)
        levels.append(level)
        self.size += 1

    def extend(self, start: int, hi: int, nodes: Iterable[bytes]) -> None:
        """Append the compact range [start, hi) given as its hashes; start must equal size."""
        if start != self.size:
            raise ProofError(f"range starts at {start} but the frontier holds {self.size} leaves")
        shape = range_shape(start, hi)
        hashes = list(nodes)
        if len(hashes) != len(shape) or any(len(h) != HASH_SIZE for h in hashes):
            raise ProofError(f"range [{start}, {hi}) needs {len(shape)} hashes, got {len(hashes)}")
        for (_, k), h in zip(shape, hashes, strict=True):
            self.push(h, k)

    def root(self) -> bytes:
        """MTH of the leaves so far: the right-to-left fold of the frontier."""
        if not self._nodes:
            return EMPTY_ROOT
        h = self._nodes[-1]
        for n in reversed(self._nodes[:-1]):
            h = node_hash(n, h)
        return h

    def to_bytes(self) -> bytes:
        """The frontier's hashes concatenated, largest subtree first (how ledger_head stores it)."""
        return b"".join(self._nodes)

    @classmethod
    def from_bytes(cls, size: int, frontier: bytes) -> Frontier:
        """The inverse of to_bytes; raises ProofError if frontier is not the right number of hashes for size."""
        if len(frontier) % HASH_SIZE:
            raise ProofError(f"a frontier is whole 32-byte hashes, got {len(frontier)} bytes")
        return cls(size, [frontier[i : i + HASH_SIZE] for i in range(0, len(frontier), HASH_SIZE)])


def compact_append(size: int, frontier: bytes, leaves: Sequence[bytes]) -> bytes:
    """The frontier of [0, size + len(leaves)) from that of [0, size) and the new leaf hashes, in order (both
    frontiers as Frontier.to_bytes). Amortised one node hash per leaf. Raises ProofError if frontier does not fit
    size."""
    f = Frontier.from_bytes(size, frontier)
    for leaf in leaves:
        f.append_leaf(leaf)
    return f.to_bytes()


def compact_root(size: int, frontier: bytes) -> bytes:
    """RFC 6962 MTH of the first size leaves from their frontier; raises ProofError if it does not fit size."""
    return Frontier.from_bytes(size, frontier).root()


def frontier_of(tree: MerkleTree, size: int | None = None) -> bytes:
    """The frontier of tree's first size leaves (default: all), as Frontier.to_bytes; raises ProofError."""
    return b"".join(compact_range(tree, 0, tree.size if size is None else size))
