"""Linear gather (Open MPI's basic linear): every rank sends its block to the root, which posts
every receive at once, at most WINDOW per step, straight into its result.

Cost: ceil((p-1)/W) alpha + (p-1)/p n beta      (n bytes gathered, p ranks, W = WINDOW)
No block is forwarded: every rank sends its n/p once and the root receives (p-1)/p n bytes.
On one node MPI copies a large message once, at the receiver: here the root does all the
copies, as it does in the tree and the ring, but with nothing in between (no forwarding hop
waits for the one before it).

    root r0, 4 ranks, one step

        r1 ─1─► r0   r2 ─2─► r0   r3 ─3─► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps


def gather_linear(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, own: Any, out: Any, bounds: list[int]
) -> Steps:
    """Gather flat `own` blocks into flat `out` at `root` (block of rank k: bounds[k]:bounds[k+1]);
    the root's `own` may be None when its block is already in place."""
    r, p = ring.rank, ring.size
    if r != root:
        yield ring.post(backend, tag, sends=[(own, root)])
        return
    others = [(root + k) % p for k in range(1, p)]
    if not others and own is not None:
        backend.copy(out[bounds[r] : bounds[r + 1]], own)
    for first in range(0, len(others), WINDOW):
        peers = others[first : first + WINDOW]
        step = ring.post(backend, tag, receives=[(out[bounds[k] : bounds[k + 1]], k) for k in peers])
        if first == 0 and own is not None:  # the root's own block is copied while the first messages are in flight
            backend.copy(out[bounds[r] : bounds[r + 1]], own)
        yield step
