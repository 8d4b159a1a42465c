"""Linear scatter (Open MPI's basic linear): the root posts every block's message at once, at
most WINDOW per step; every other rank receives its block straight into its result.

Cost: ceil((p-1)/W) alpha + (p-1)/p n beta      (n bytes scattered, p ranks, W = WINDOW)
The root's link carries every block, as in the tree and the ring, but no block is forwarded:
the root sends (p-1)/p n bytes and every other rank receives its n/p once. On one node, MPI
copies a large message once, at the receiver (cross-memory attach), so the p-1 copies run in
parallel where the tree's and the ring's run hop after hop.

    root r0, 4 ranks, one step

        r0 ─1─► r1   r0 ─2─► r2   r0 ─3─► r3
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps


def scatter_linear(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, mine: Any, bounds: list[int]
) -> Steps:
    """Scatter flat `src` (root only; block of rank k: bounds[k]:bounds[k+1]) into flat `mine`."""
    r, p = ring.rank, ring.size
    if r != root:
        yield ring.post(backend, tag, receives=[(mine, root)])
        return
    others = [(root + k) % p for k in range(1, p)]
    if not others:
        backend.copy(mine, src[bounds[r] : bounds[r + 1]])
    for first in range(0, len(others), WINDOW):
        peers = others[first : first + WINDOW]
        step = ring.post(backend, tag, sends=[(src[bounds[k] : bounds[k + 1]], k) for k in peers])
        if first == 0:  # the root's own block is copied while the first messages are in flight
            backend.copy(mine, src[bounds[r] : bounds[r + 1]])
        yield step
