"""The binomial tree rooted at any rank, shared by the binomial broadcast, reduce, gather and
scatter. Ranks are renumbered relative to the root (v = (rank - root) mod p); relative rank v
has parent v - lowbit(v) and children v + 2^k for every 2^k below lowbit(v) (v + 2^k < p).
Relative rank v's subtree is the contiguous range [v, v + lowbit(v)) cut at p.

    8 ranks, root 0            depth lg p: every rank is at most 3 hops from the root
         0
       / | \\
      4  2  1
      |  |
      6  3
      |
      5 ... (and 7 under 6)
"""

from __future__ import annotations


class BinomialTree:
    def __init__(self, rank: int, size: int, root: int) -> None:
        self.size, self.root = size, root
        self.v = (rank - root) % size
        low = self.v & -self.v if self.v else 1 << size.bit_length()
        self.parent = self.rank_of(self.v - low) if self.v else None
        # children nearest first (smallest subtrees first); each is (rank, relative rank, subtree end)
        self.children = []
        mask = 1
        while mask < low and self.v + mask < size:
            child = self.v + mask
            self.children.append((self.rank_of(child), child, min(child + mask, size)))
            mask <<= 1
        self.subtree_end = min(self.v + low, size)

    def rank_of(self, relative: int) -> int:
        return (relative + self.root) % self.size
