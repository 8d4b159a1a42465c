"""Ring scatter: the root sends each block along the ring to its owner, the farthest first.

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes scattered, p ranks)
The root sends (p-1)/p n bytes. The rank at position q receives the blocks of positions
q..p-1 and forwards those of q+1..p-1. The inverse of the ring gather.

Step t: the root sends block p-1-t; position q receives block q+p-2-t from its left (the last
one, at t = p-2, is its own, received straight into the result) and forwards what it
received the step before.

    root r0, 4 ranks, blocks named by their owner

    step 0:  r0 ─3─► r1
    step 1:  r0 ─2─► r1 ─3─► r2
    step 2:  r0 ─1─► r1 ─2─► r2 ─3─► r3
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_ring import block_span, staging_size, staging_views
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def scatter_steps(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, mine: Any, bounds: list[int]
) -> Steps:
    """Scatter flat `src` (root only; block of rank k: bounds[k]:bounds[k+1]) into flat `mine`."""
    p = ring.size
    q = ring.position(root)
    if q == 0:
        own_lo, own_hi = block_span(ring, root, bounds, 0)
        if p == 1:
            backend.copy(mine, src[own_lo:own_hi])
        for t in range(p - 1):
            lo, hi = block_span(ring, root, bounds, p - 1 - t)
            step = ring.post(backend, tag, sends=[(src[lo:hi], ring.right)])
            if t == 0:  # the root's own block is copied while the first message is in flight
                backend.copy(mine, src[own_lo:own_hi])
            yield step
        return
    positions = range(q + 1, p)
    with ring.scratch(backend, staging_size(ring, root, bounds, positions), mine.dtype) as scratch:
        passing = staging_views(ring, root, bounds, positions, scratch)
        passing[q] = mine  # the last block to arrive is this rank's own
        outgoing = None
        for t in range(q - 1, p - 1):
            incoming = passing[q + p - 2 - t]
            sends = [(outgoing, ring.right)] if outgoing is not None else []
            yield ring.post(backend, tag, sends=sends, receives=[(incoming, ring.left)])
            outgoing = incoming
