"""Fold any world size onto the largest power of two below it, for the halving and doubling
algorithms (MPICH's scheme for non-power-of-two sizes).

With p = p2 + extra ranks, the first 2*extra ranks pair up: each even rank hands its data to the
odd rank after it and sits out; the odd rank stands for both. Ranks from 2*extra on stand for
themselves. That leaves p2 "virtual" ranks, numbered in rank order, for the halving/doubling
stages; at the end each odd rank hands the result back to its even partner.

    p = 6 (p2 = 4, extra = 2)

    rank:     0   1   2   3   4   5
    virtual:  -   0   -   1   2   3        (0 -> 1 and 2 -> 3 before, 1 -> 0 and 3 -> 2 after)
"""

from __future__ import annotations


class Fold:
    """This rank's place in the folded world."""

    def __init__(self, rank: int, size: int) -> None:
        self.p2 = 1 << (size.bit_length() - 1)
        self.extra = size - self.p2
        self.sits_out = rank < 2 * self.extra and rank % 2 == 0
        self.partner = rank + 1 if self.sits_out else (rank - 1 if rank < 2 * self.extra else None)
        self.virtual = None if self.sits_out else (rank // 2 if rank < 2 * self.extra else rank - self.extra)

    def real(self, virtual: int) -> int:
        """The rank that acts for a virtual rank."""
        return 2 * virtual + 1 if virtual < self.extra else virtual + self.extra

    def first_real(self, virtual: int) -> int:
        """The lowest rank a virtual rank stands for (its even partner, when it has one)."""
        return 2 * virtual if virtual < self.extra else virtual + self.extra
