"""Binomial-tree scatter: the root hands each child its whole subtree's blocks in one message,
and so on down. Latency-optimal for small messages; the inverse of the binomial gather.

Cost: ceil(lg p) alpha + (p-1)/p n beta      (n bytes scattered, p ranks)

    8 ranks, root 0 (see binomial.py)

    hop 1:  r0 ─4567─► r4
    hop 2:  r0 ─23─► r2   r4 ─67─► r6
    hop 3:  r0 ─1─► r1   r2 ─3─► r3   r4 ─5─► r5   r6 ─7─► r7
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.binomial import BinomialTree
from mpiring.algorithms.gather_binomial import relative_offsets, to_relative_order
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def scatter_binomial(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, mine: Any, bounds: list[int]
) -> Steps:
    """Scatter flat `src` (root only; block of rank k: bounds[k]:bounds[k+1]) into flat `mine`."""
    tree = BinomialTree(ring.rank, ring.size, root)
    if not tree.children and tree.parent is not None:  # a leaf receives its own block where it belongs
        yield ring.post(backend, tag, receives=[(mine, tree.parent)])
        return
    offsets = relative_offsets(bounds, root)
    base = offsets[tree.v]
    if tree.parent is None and root == 0:  # rank order is relative order: send from src itself
        held = src
    else:
        held = backend.empty(offsets[tree.subtree_end] - base, mine.dtype)
        if tree.parent is None:
            to_relative_order(backend, src, held, bounds, root)
        else:
            yield ring.post(backend, tag, receives=[(held, tree.parent)])
    step = ring.post(backend, tag, sends=[(held[offsets[v] - base : offsets[end] - base], child)
                                          for child, v, end in reversed(tree.children)])
    backend.copy(mine, held[: mine.size])  # while the subtrees' blocks are in flight (read from elsewhere)
    yield step
