"""Ring all-gather: every rank ends with every rank's chunk, in rank order.

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes of gathered result, p ranks)
Each rank sends and receives p-1 chunks: (p-1)/p n bytes, up to chunk rounding.

Step s = 0..p-2: rank r forwards chunk (r-s) to the right and receives chunk (r-s-1) from
the left straight into its place in the result. Nothing is copied or combined.

    3 ranks, chunks A B C (A from r0)

    step 0:  r0 ──A──► r1 ──B──► r2 ──C──► r0
    step 1:  r0 ──C──► r1 ──A──► r2 ──B──► r0
    end:     every rank has A B C
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.transport import Steps
from mpiring.ring import Ring


def allgather_steps(ring: Ring, backend: NumpyBackend, tag: int, buf: Any, bounds: list[int]) -> Steps:
    """Fill flat `buf` (chunk c spans bounds[c]:bounds[c+1]); this rank's chunk is already there."""
    p, r = ring.size, ring.rank
    for s in range(p - 1):
        give, take = (r - s) % p, (r - s - 1) % p
        yield ring.post(
            backend,
            tag,
            sends=[(buf[bounds[give] : bounds[give + 1]], ring.right)],
            receives=[(buf[bounds[take] : bounds[take + 1]], ring.left)],
        )
