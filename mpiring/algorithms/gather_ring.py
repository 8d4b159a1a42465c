"""Ring gather: every rank's block travels along the ring to the root, the farthest first.

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes gathered, p ranks)
The root receives (p-1)/p n bytes. The rank at position q (q steps right of the root) sends the
blocks of positions 1..q (its own and the ones it forwards) and receives those of 1..q-1.

Step s: position q sends block q-s (its own at s=0, then the one it received at s-1); the root
receives block p-1-s from its left neighbour straight into the result.

    root r0, 4 ranks, blocks named by their owner

    step 0:  r1 ─1─► r2    r2 ─2─► r3    r3 ─3─► r0
    step 1:                r2 ─1─► r3    r3 ─2─► r0
    step 2:                              r3 ─1─► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def block_span(ring: Ring, root: int, bounds: list[int], position: int) -> tuple[int, int]:
    """The element range of the block owned by the rank `position` steps right of `root`."""
    k = ring.rank_at(position, root)
    return bounds[k], bounds[k + 1]


def staging_size(ring: Ring, root: int, bounds: list[int], positions: range) -> int:
    """Elements of the blocks (of these positions) that only pass through this rank."""
    return sum(hi - lo for lo, hi in (block_span(ring, root, bounds, position) for position in positions))


def staging_views(ring: Ring, root: int, bounds: list[int], positions: range, scratch: Any) -> dict[int, Any]:
    """`scratch` (staging_size elements) cut into one view per passing block, by position."""
    views, offset = {}, 0
    for position in positions:
        lo, hi = block_span(ring, root, bounds, position)
        views[position] = scratch[offset : offset + hi - lo]
        offset += hi - lo
    return views


def gather_steps(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, own: Any, out: Any, bounds: list[int]
) -> Steps:
    """Gather flat `own` blocks into flat `out` at `root` (block of rank k: bounds[k]:bounds[k+1]).

    `out` is only used on the root; other ranks may pass None.
    """
    p = ring.size
    q = ring.position(root)
    if q == 0:
        own_lo, own_hi = block_span(ring, root, bounds, 0)
        if p == 1:
            backend.copy(out[own_lo:own_hi], own)
        for s in range(p - 1):
            lo, hi = block_span(ring, root, bounds, p - 1 - s)
            step = ring.post(backend, tag, receives=[(out[lo:hi], ring.left)])
            if s == 0:  # the root's own block is copied while the first message is in flight
                backend.copy(out[own_lo:own_hi], own)
            yield step
        return
    positions = range(1, q)
    with ring.scratch(backend, staging_size(ring, root, bounds, positions), own.dtype) as scratch:
        passing = staging_views(ring, root, bounds, positions, scratch)
        outgoing = own
        for s in range(q):
            receives = [(passing[q - 1 - s], ring.left)] if s < q - 1 else []
            yield ring.post(backend, tag, sends=[(outgoing, ring.right)], receives=receives)
            if receives:
                outgoing = receives[0][0]
