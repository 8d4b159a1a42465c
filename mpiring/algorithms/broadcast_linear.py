"""Linear broadcast (Open MPI's basic linear): the root posts the whole buffer to every other
rank at once, at most WINDOW per step.

Cost: ceil((p-1)/W) alpha + (p-1) n beta      (n bytes, p ranks, W = WINDOW)
The root's link carries n bytes p-1 times: on a network, the worst of the three. On one node
MPI copies a large message once, at the receiver (cross-memory attach): the p-1 copies of the
root's buffer then run in parallel, where the tree's and the ring's run hop after hop.

    root r0, 4 ranks, one step

        r0 ─► r1   r0 ─► r2   r0 ─► r3
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps


def broadcast_linear(ring: Ring, backend: NumpyBackend, tag: int, root: int, buf: Any, src: Any = None) -> Steps:
    """Broadcast flat `buf` from `root`: the root's buf is sent, everyone else's is filled. A
    root's `src` (another array) is sent instead, and copied into its buf meanwhile."""
    r, p = ring.rank, ring.size
    if r != root:
        yield ring.post(backend, tag, receives=[(buf, root)])
        return
    outgoing = buf if src is None else src
    others = [(root + k) % p for k in range(1, p)]
    if not others and src is not None:
        backend.copy(buf, src)
    for first in range(0, len(others), WINDOW):
        step = ring.post(backend, tag, sends=[(outgoing, k) for k in others[first : first + WINDOW]])
        if first == 0 and src is not None:  # the root's copy, while its first messages are in flight
            backend.copy(buf, src)
        yield step
