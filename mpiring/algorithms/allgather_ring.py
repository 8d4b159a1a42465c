"""Ring all-gather: every rank ends with every rank's chunk, in rank order.

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes of gathered result, p ranks)
Each rank sends and receives p-1 chunks: (p-1)/p n bytes, up to chunk rounding.

Step s = 0..p-2: rank r forwards chunk (r-s) to the right and receives chunk (r-s-1) from
the left straight into its place in the result. Nothing is combined; a rank whose own chunk
comes from another array (the all-gather collective's input) sends it from there at step 0 and
copies it into its place while that step is in flight.

    3 ranks, chunks A B C (A from r0)

    step 0:  r0 ──A──► r1 ──B──► r2 ──C──► r0
    step 1:  r0 ──C──► r1 ──A──► r2 ──B──► r0
    end:     every rank has A B C
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allgather_steps(ring: Ring, backend: NumpyBackend, tag: int, buf: Any, bounds: list[int],
                    src: Any = None) -> Steps:
    """Fill flat `buf` (chunk c spans bounds[c]:bounds[c+1]). This rank's chunk is already
    there, or is `src`: sent from there, and copied into its place meanwhile."""
    p, r = ring.size, ring.rank
    own = buf[bounds[r] : bounds[r + 1]]
    if p == 1 and src is not None:
        backend.copy(own, src)
    for s in range(p - 1):
        give, take = (r - s) % p, (r - s - 1) % p
        outgoing = src if s == 0 and src is not None else buf[bounds[give] : bounds[give + 1]]
        step = ring.post(backend, tag, sends=[(outgoing, ring.right)],
                         receives=[(buf[bounds[take] : bounds[take + 1]], ring.left)])
        if outgoing is src:  # the own chunk's copy, while it travels from src
            backend.copy(own, src)
        yield step
