"""RFC 6962 §2.1 / RFC 9162 §2.1 Merkle hash trees: tree hash, inclusion and consistency proofs.

The in-memory tree keeps one bytearray per level: level 0 holds the 32-byte leaf hashes, level k
holds the hashes of the complete, aligned subtrees of 2**k leaves that exist so far. Appending is
amortised O(1) (worst case O(log n)), and any RFC 6962 subtree hash MTH(D[lo:hi]) needed by a proof
is at most one "right edge" fold over O(log n) stored perfect subtrees, so proofs are O(log n).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ledger.errors import ProofError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

_sha256 = hashlib.sha256


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash: SHA-256(0x00 || data)."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly less than n (n >= 2), the RFC 6962 split point k."""
    return 1 << ((n - 1).bit_length() - 1)


class MerkleTree:
    """Append-only RFC 6962 tree over 32-byte leaf hashes. Not thread-safe: callers lock."""

    __slots__ = ("_levels", "_size")

    def __init__(self) -> None:
        self._levels: list[bytearray] = [bytearray()]
        self._size = 0

    @classmethod
    def from_leaf_hashes(cls, leaves: bytes | bytearray) -> MerkleTree:
        """Build a tree from concatenated 32-byte leaf hashes, level by level (n hashes in total)."""
        if len(leaves) % HASH_SIZE:
            raise ProofError("leaf hash buffer is not a multiple of 32 bytes")
        tree = cls()
        tree._size = len(leaves) // HASH_SIZE
        tree._levels = [bytearray(leaves)]
        level = tree._levels[0]
        sha = _sha256
        while len(level) >= 2 * HASH_SIZE:
            pairs = len(level) // (2 * HASH_SIZE)
            mv = memoryview(level)
            nxt = bytearray(pairs * HASH_SIZE)
            for i in range(pairs):
                h = sha(b"\x01")
                h.update(mv[i * 64 : i * 64 + 64])
                nxt[i * 32 : i * 32 + 32] = h.digest()
            mv.release()
            tree._levels.append(nxt)
            level = nxt
        return tree

    @classmethod
    def from_parts(
        cls, size: int, parts: Sequence[tuple[bytes | bytearray, Sequence[tuple[int, int, bytes]]]]
    ) -> MerkleTree:
        """Assemble a tree from the leaf hashes and partial levels computed by workers (subtree_levels).

        parts are (leaf hashes, levels) in leaf order; a level holds the aligned blocks inside one
        worker's range; the few blocks that straddle two ranges are hashed here.
        """
        leaves = b"".join(p[0] for p in parts)
        if len(leaves) != size * HASH_SIZE:
            raise ProofError("leaf hashes do not add up to the tree size")
        tree = cls()
        tree._size = size
        tree._levels = [bytearray(leaves)]
        k = 1
        while size >> k:
            count = size >> k
            buf = bytearray(count * HASH_SIZE)
            covered: list[tuple[int, int]] = []
            for _, levels in parts:
                for kk, j0, data in levels:
                    if kk == k:
                        buf[j0 * HASH_SIZE : j0 * HASH_SIZE + len(data)] = data
                        covered.append((j0, j0 + len(data) // HASH_SIZE))
            below = tree._levels[k - 1]
            j = 0
            for a, b in [*sorted(covered), (count, count)]:
                while j < min(a, count):
                    buf[j * 32 : j * 32 + 32] = node_hash(
                        bytes(below[j * 64 : j * 64 + 32]), bytes(below[j * 64 + 32 : j * 64 + 64])
                    )
                    j += 1
                j = max(j, b)
            tree._levels.append(buf)
            k += 1
        return tree

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash; completes every perfect subtree the new leaf closes."""
        levels = self._levels
        levels[0] += leaf
        self._size += 1
        n = self._size
        k = 0
        h = leaf
        # Each trailing 1-bit of the new size is a perfect subtree of 2**(k+1) leaves just completed.
        while n & 1 == 0:
            lv = levels[k]
            h = node_hash(bytes(lv[-64:-32]), h)
            if len(levels) == k + 1:
                levels.append(bytearray())
            levels[k + 1] += h
            n >>= 1
            k += 1

    def extend(self, leaves: Sequence[bytes]) -> None:
        """Add leaf hashes in order (as append() each, without re-slicing per leaf): each level gets
        the nodes of the perfect subtrees the new leaves complete, hashed from the level below."""
        if not leaves:
            return
        levels = self._levels
        old = self._size
        levels[0] += b"".join(leaves)
        new = self._size = old + len(leaves)
        one = _sha256(b"\x01")
        k = 1
        while new >> k > old >> k:
            if len(levels) == k:
                levels.append(bytearray())
            below = memoryview(levels[k - 1])
            out = []
            for j in range(old >> k, new >> k):
                h = one.copy()
                h.update(below[j * 64 : j * 64 + 64])
                out.append(h.digest())
            below.release()
            levels[k] += b"".join(out)
            k += 1

    def truncate(self, size: int) -> None:
        """Drop leaves beyond size (used to roll back a batch whose write failed)."""
        if size > self._size or size < 0:
            raise ProofError(f"cannot truncate a tree of {self._size} leaves to {size}")
        for k, lv in enumerate(self._levels):
            del lv[(size >> k) * HASH_SIZE :]
        self._size = size

    def leaf(self, index: int) -> bytes:
        return bytes(self._levels[0][index * HASH_SIZE : (index + 1) * HASH_SIZE])

    def subtree_hash(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for an RFC 6962 subtree (lo aligned to the split, 0 <= lo < hi <= size)."""
        n = hi - lo
        if n & (n - 1) == 0 and lo % n == 0:
            k = n.bit_length() - 1
            i = (lo >> k) * HASH_SIZE
            return bytes(self._levels[k][i : i + HASH_SIZE])
        # Not perfect: a right edge. Collect its perfect pieces left to right, fold right to left.
        pieces: list[bytes] = []
        while True:
            n = hi - lo
            if n & (n - 1) == 0 and lo % n == 0:
                k = n.bit_length() - 1
                i = (lo >> k) * HASH_SIZE
                pieces.append(bytes(self._levels[k][i : i + HASH_SIZE]))
                break
            k2 = _split(n)
            k = k2.bit_length() - 1
            i = (lo >> k) * HASH_SIZE
            pieces.append(bytes(self._levels[k][i : i + HASH_SIZE]))
            lo += k2
        h = pieces[-1]
        for p in reversed(pieces[:-1]):
            h = node_hash(p, h)
        return h

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first size leaves (default: all)."""
        size = self._size if size is None else size
        if size < 0 or size > self._size:
            raise ProofError(f"no tree of size {size} (have {self._size})")
        if size == 0:
            return EMPTY_ROOT
        return self.subtree_hash(0, size)

    def _why(self, low: int, size: int, *, older: bool = False) -> str:
        """Why (low, size) has no proof: the words an auditor needs to ask again."""
        if size > self._size:
            return f"the ledger holds {self._size} entries"
        if low < 0 or size < 0:
            return "sizes and seqs are not negative"
        if older:
            return "the old size is larger than the new one"
        return f"the tree of size {size} holds seqs 0..{size - 1}" if size else "the tree of size 0 holds no entry"

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        """RFC 9162 §2.1.3.1 PATH(index, D[size]), hashes ordered leaf to root."""
        if not 0 <= index < size <= self._size:
            raise ProofError(f"no inclusion proof for leaf {index} in a tree of size {size}: {self._why(index, size)}")
        path: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            k = _split(hi - lo)
            if index < lo + k:
                path.append(self.subtree_hash(lo + k, hi))
                hi = lo + k
            else:
                path.append(self.subtree_hash(lo, lo + k))
                lo += k
        path.reverse()
        return path

    def consistency_proof(self, old: int, new: int) -> list[bytes]:
        """RFC 9162 §2.1.4.1 PROOF(old, D[new]) = SUBPROOF(old, D[new], true)."""
        if not 0 <= old <= new <= self._size:
            raise ProofError(f"no consistency proof from size {old} to {new}: {self._why(old, new, older=True)}")
        if old == 0 or old == new:
            return []
        out: list[bytes] = []
        lo, hi, complete = 0, new, True
        while True:
            n, m = hi - lo, old - lo
            if m == n:
                # 1. SUBPROOF(m, D[m], true) = {}; with b false it is {MTH(D[m])}.
                if not complete:
                    out.append(self.subtree_hash(lo, hi))
                break
            k = _split(n)
            if m <= k:
                # 2. m <= k: SUBPROOF(m, D[0:k], b) : MTH(D[k:n]).
                out.append(self.subtree_hash(lo + k, hi))
                hi = lo + k
            else:
                # 3. m > k: SUBPROOF(m - k, D[k:n], false) : MTH(D[0:k]).
                out.append(self.subtree_hash(lo, lo + k))
                lo += k
                complete = False
        out.reverse()
        return out


def root_from_leaf_hashes(leaves: Sequence[bytes]) -> bytes:
    """Reference MTH by direct RFC 6962 recursion; for tests and tiny trees."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return node_hash(root_from_leaf_hashes(leaves[:k]), root_from_leaf_hashes(leaves[k:]))


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: True iff proof shows leaf at index in the tree of size with this root."""
    if not 0 <= index < size or len(leaf) != HASH_SIZE or len(root) != HASH_SIZE:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0 or len(p) != HASH_SIZE:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(old: int, new: int, proof: Sequence[bytes], old_root: bytes, new_root: bytes) -> bool:
    """RFC 9162 §2.1.4.2: True iff proof shows the tree (old, old_root) is a prefix of (new, new_root)."""
    if not 0 <= old <= new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if old == 0:
        # Every tree extends the empty tree; RFC 9162 gives no proof for it.
        return not proof
    if not proof or any(len(p) != HASH_SIZE for p in proof):
        return False
    path = list(proof)
    # 1. If old is a power of two, the old root itself is the first node of the path.
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    # 2. Skip the levels where the old tree's last node is a right child.
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


def subtree_levels(leaves: bytes | bytearray, lo: int) -> list[tuple[int, int, bytes]]:
    """For leaf hashes at indices [lo, lo + n): (level, first block index, hashes) of every aligned
    perfect subtree inside that range, level by level (the worker half of MerkleTree.from_parts)."""
    out: list[tuple[int, int, bytes]] = []
    one = _sha256(b"\x01")
    cur, cur_lo, cur_n, k = leaves, lo, len(leaves) // HASH_SIZE, 0
    while True:
        j0, j1 = (cur_lo + 1) // 2, (cur_lo + cur_n) // 2
        if j1 <= j0:
            return out
        off = (2 * j0 - cur_lo) * HASH_SIZE
        mv = memoryview(cur)
        hashes = []
        for i in range(off, off + (j1 - j0) * 64, 64):
            h = one.copy()
            h.update(mv[i : i + 64])
            hashes.append(h.digest())
        mv.release()
        nxt = b"".join(hashes)
        k += 1
        out.append((k, j0, nxt))
        cur, cur_lo, cur_n = nxt, j0, j1 - j0
