"""Binomial-tree gather: each rank collects its subtree's blocks and passes them up in one
message. Latency-optimal for small messages.

Cost: ceil(lg p) alpha + (p-1)/p n beta      (n bytes gathered, p ranks)
The root receives (p-1)/p n bytes in ceil(lg p) messages; a rank sends its subtree's blocks once.

Blocks are kept in root-relative order, where every subtree is one contiguous range; the
root turns them back into rank order (two copies) at the end, except root 0, whose relative
order is rank order and which collects straight into the result. Leaves send their block as
it is.

    8 ranks, root 0: the broadcast tree (binomial.py) upside down

    hop 1:  r1 ─1─► r0   r3 ─3─► r2   r5 ─5─► r4   r7 ─7─► r6
    hop 2:  r2 ─23─► r0  r6 ─67─► r4
    hop 3:  r4 ─4567─► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.binomial import BinomialTree
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def relative_offsets(bounds: list[int], root: int) -> list[int]:
    """Offsets of the blocks in root-relative order (relative rank j holds rank (root+j) % p)."""
    p = len(bounds) - 1
    offsets = [0]
    for j in range(p):
        k = (root + j) % p
        offsets.append(offsets[-1] + bounds[k + 1] - bounds[k])
    return offsets


def to_relative_order(backend: NumpyBackend, ordered: Any, relative: Any, bounds: list[int], root: int) -> None:
    """The inverse of to_rank_order: blocks of ranks root..p-1 first, then 0..root-1."""
    head = bounds[-1] - bounds[root]
    backend.copy(relative[:head], ordered[bounds[root] :])
    backend.copy(relative[head:], ordered[: bounds[root]])


def to_rank_order(backend: NumpyBackend, relative: Any, out: Any, bounds: list[int], root: int) -> None:
    """Relative rank j = rank (root+j) % p: ranks root..p-1 come first, then 0..root-1."""
    head = bounds[-1] - bounds[root]
    backend.copy(out[bounds[root] :], relative[:head])
    backend.copy(out[: bounds[root]], relative[head:])


def gather_binomial(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, own: Any, out: Any, bounds: list[int]
) -> Steps:
    """Gather flat `own` blocks into flat `out` at `root` (block of rank k: bounds[k]:bounds[k+1])."""
    tree = BinomialTree(ring.rank, ring.size, root)
    if not tree.children and tree.parent is not None:  # a leaf sends its own block as it is
        yield ring.post(backend, tag, sends=[(own, tree.parent)])
        return
    offsets = relative_offsets(bounds, root)
    base = offsets[tree.v]
    # root 0's relative order is rank order: it collects straight into out
    direct = tree.parent is None and root == 0
    held = out if direct else backend.empty(offsets[tree.subtree_end] - base, own.dtype)
    step = ring.post(backend, tag, receives=[(held[offsets[v] - base : offsets[end] - base], child)
                                             for child, v, end in tree.children])
    backend.copy(held[: own.size], own)  # while the subtrees' blocks are in flight (they land elsewhere)
    yield step
    if tree.parent is not None:
        yield ring.post(backend, tag, sends=[(held, tree.parent)])
    elif not direct:
        to_rank_order(backend, held, out, bounds, root)
