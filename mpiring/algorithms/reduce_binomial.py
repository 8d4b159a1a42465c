"""Binomial-tree reduce: partial results flow up the tree, each rank combining its children's.
Latency-optimal for small messages.

Cost: ceil(lg p) (alpha + n beta + n gamma)      (n bytes per rank, p ranks)
Every rank but the root sends n bytes once; a rank receives n bytes per child.

A rank posts the receives from all its children at once, then combines them in a fixed order,
lowest relative rank first, so the result's bits do not depend on message timing. The nearest
child's vector arrives in the accumulator (at the root, the result) and the first combine
reads the rank's own input with it, writing it there; the others arrive in scratch. No rank
copies its input first, and a leaf sends its input as it is. At 2 ranks that is Open MPI's
linear reduce: receive into the result, reduce the input into it.

    8 ranks, root 0: the broadcast tree (binomial.py) upside down

    hop 1:  r1 ─► r0   r3 ─► r2   r5 ─► r4   r7 ─► r6
    hop 2:  r2 ─► r0   r6 ─► r4
    hop 3:  r4 ─► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.binomial import BinomialTree
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def reduce_binomial(ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` on `root` (None elsewhere)."""
    tree = BinomialTree(ring.rank, ring.size, root)
    if not tree.children:
        if tree.parent is None:  # one rank
            backend.copy(out, src)
            backend.finish(op, out, ring.size)
        else:  # a leaf sends its input as it is
            yield ring.post(backend, tag, sends=[(src, tree.parent)])
        return
    # the nearest child's data arrives in the accumulator itself, and is combined there with the
    # input: one buffer less to write and read back (unless the root reduces in place, out is src)
    in_place = tree.parent is None and backend.may_share_memory(out, src)
    acc = out if tree.parent is None else backend.empty(src.size, src.dtype)
    parts = [] if in_place else [acc]
    others = len(tree.children) - len(parts)
    scratch = backend.empty(others * src.size, src.dtype)
    parts += [scratch[i * src.size : (i + 1) * src.size] for i in range(others)]
    yield ring.post(backend, tag, receives=[(part, child) for part, (child, _, _) in zip(parts, tree.children,
                                                                                           strict=True)])
    left = src  # the first combine reads the input itself: no rank copies it first
    for part in parts:  # children nearest first: the lower relative ranks' data stays on the left
        backend.combine(op, left, part, acc)
        left = acc
    if tree.parent is None:
        backend.finish(op, acc, ring.size)
    else:
        yield ring.post(backend, tag, sends=[(acc, tree.parent)])
