"""Recursive-doubling scan (prefix reduction): in round k each rank swaps the reduction of its
aligned group of 2^k ranks with the rank 2^k away (rank XOR 2^k); a rank whose partner is
lower also folds what it got into its result. Any world size (a partner past the last rank is
skipped), ceil(lg p) rounds: latency-optimal for small messages.

Cost: ceil(lg p) (alpha + n beta + 2 n gamma)      (n bytes per rank, p ranks)
Each rank sends n bytes per round, lg p * n in all (the chain sends n).

Association: partners combine (lower ranks' data) op (higher ranks' data), so rank order is
kept, but the grouping is by halves: rank 3 of 4 gets (x0 op x1) op (x2 op x3), where the
chain (scan_ring) computes ((x0 op x1) op x2) op x3. Floating-point sums may differ between
the two in the last bits; integers never do.

    4 ranks, a b c d; [group] | result (inclusive)

    round 0:  r0 ◄──► r1   r2 ◄──► r3      [ab] | a    [ab] | ab    [cd] | c    [cd] | cd
    round 1:  r0 ◄──► r2   r1 ◄──► r3      [abcd] | a  [abcd] | ab  [abcd] | abc  [abcd] | abcd
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def scan_recursive_doubling(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str,
                            exclusive: bool) -> Steps:
    """Prefix-reduce flat `src` into flat `out` (apart from `src`, or `src` itself: each round
    reads src, by way of the group's reduction, before it writes out): over ranks 0..r, or with
    `exclusive` over 0..r-1 (rank 0's `out` is then left alone)."""
    p, r = ring.size, ring.rank
    if not exclusive:
        backend.copy(out, src)
    has_result = not exclusive  # exclusive: nothing until the first lower partner's data
    with ring.scratch(backend, src.size, src.dtype) as group, ring.scratch(backend, src.size, src.dtype) as arrived:
        mine = src  # the reduction over this rank's aligned group so far (src itself at first: no copy)
        mask = 1
        while mask < p:
            partner = r ^ mask
            if partner < p:
                yield ring.post(backend, tag, sends=[(mine, partner)], receives=[(arrived, partner)])
                if mask << 1 < p:  # the group's reduction is needed only for a later round
                    if partner < r:
                        backend.combine(op, arrived, mine, group)
                    else:
                        backend.combine(op, mine, arrived, group)
                    mine = group
                if partner < r:
                    if has_result:
                        backend.combine(op, arrived, out, out)
                    else:
                        backend.copy(out, arrived)
                        has_result = True
            mask <<= 1
    if has_result:
        backend.finish(op, out, r if exclusive else r + 1)
