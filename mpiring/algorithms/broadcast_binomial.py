"""Binomial-tree broadcast: the data reaches every rank in ceil(lg p) hops. Latency-optimal
for small messages.

Cost: ceil(lg p) (alpha + n beta)      (n bytes, p ranks)
The root sends n bytes to each of its ceil(lg p) children; a rank sends n bytes per child.

    8 ranks, root 0 (see binomial.py)

    hop 1:  r0 ─► r4
    hop 2:  r0 ─► r2   r4 ─► r6
    hop 3:  r0 ─► r1   r2 ─► r3   r4 ─► r5   r6 ─► r7
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.binomial import BinomialTree
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def broadcast_binomial(ring: Ring, backend: NumpyBackend, tag: int, root: int, buf: Any, src: Any = None) -> Steps:
    """Broadcast flat `buf` from `root`: the root's buf is sent, everyone else's is filled. A
    root's `src` (another array) is sent instead, and copied into its buf meanwhile."""
    tree = BinomialTree(ring.rank, ring.size, root)
    if tree.parent is not None:
        yield ring.post(backend, tag, receives=[(buf, tree.parent)])
    if not tree.children:
        if src is not None:  # a root alone
            backend.copy(buf, src)
        return
    outgoing = buf if src is None else src
    # farthest child (largest subtree) first: it has the most hops still to go
    step = ring.post(backend, tag, sends=[(outgoing, child) for child, _, _ in reversed(tree.children)])
    if src is not None:  # the root's copy, while its messages are in flight
        backend.copy(buf, src)
    yield step
