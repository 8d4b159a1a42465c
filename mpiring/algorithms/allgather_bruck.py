"""Bruck all-gather: in round k each rank sends everything it has gathered so far to the rank
2^k to its left and receives as much from the rank 2^k to its right. Any world size, ceil(lg p)
rounds: latency-optimal for small messages.

Cost: ceil(lg p) alpha + (p-1)/p n beta      (n bytes of gathered result, p ranks)
Each rank sends and receives (p-1)/p n bytes, plus one local rotation of the result.

Rank r keeps the blocks in rotated order (position j holds block (r+j) mod p), in which what
it sends and what it receives are always contiguous, then rotates them into rank order.

    4 ranks, blocks A B C D (A from r0); what r0 holds, in its rotated order

    start:             A
    round 0 (2^0 = 1):  A B          r0 ◄─B─ r1, r0 ─A─► r3
    round 1 (2^1 = 2):  A B C D      r0 ◄─CD─ r2, r0 ─AB─► r2
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_binomial import relative_offsets, to_rank_order
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allgather_bruck(ring: Ring, backend: NumpyBackend, tag: int, buf: Any, bounds: list[int],
                    src: Any = None) -> Steps:
    """The ring all-gather's contract (mpiring.algorithms.allgather_ring): the own chunk is in
    `buf` or is `src`. The final rotation writes every chunk of `buf`, the own one included."""
    p, r = ring.size, ring.rank
    own = buf[bounds[r] : bounds[r + 1]] if src is None else src
    if p == 1:
        if src is not None:
            backend.copy(buf, src)
        return
    offsets = relative_offsets(bounds, r)  # rotated order = relative to this rank
    rotated = backend.empty(bounds[-1], buf.dtype)
    backend.copy(rotated[: offsets[1]], own)
    distance = 1
    while distance < p:
        count = min(distance, p - distance)
        yield ring.post(
            backend, tag,
            sends=[(rotated[: offsets[count]], (r - distance) % p)],
            receives=[(rotated[offsets[distance] : offsets[distance + count]], (r + distance) % p)],
        )
        distance *= 2
    to_rank_order(backend, rotated, buf, bounds, r)
