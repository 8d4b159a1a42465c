"""Scattered reduce-scatter (MPICH's pairwise exchange, all at once): every rank sends chunk k of
its input straight to rank k and receives its own chunk from every other rank, at most WINDOW
peers per step, then reduces the p partials of its chunk in a fixed order.

Cost: ceil((p-1)/W) alpha + (p-1)/p n beta + (p-1)/p n gamma    (n bytes per rank, p ranks,
W = WINDOW) - the ring's bytes and reductions, in one round instead of p-1 dependent steps.
Every message carries input, never a partial reduced a moment before (docs/algorithms.md has
what that was measured to cost); the price is scratch for p-2 chunks instead of the ring's two
(the first partial arrives in the result).

    3 ranks, chunks 0 1 2; "1@2" = chunk 1 of rank 2's input

    one step:  r0 ─1@0─► r1   r0 ─2@0─► r2
               r1 ─2@1─► r2   r1 ─0@1─► r0
               r2 ─0@2─► r0   r2 ─1@2─► r1
    then r0 reduces 0@0, 0@2, 0@1 (its own, then shift 1, then shift 2), and so on
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps, shift_windows


def reduce_scatter_scattered(ring: Ring, backend: NumpyBackend, tag: int, src: Any, bounds: list[int], op: str,
                             result: Any) -> Steps:
    """The ring reduce-scatter's contract (mpiring.algorithms.reduce_scatter_ring); `result`
    may be a view of `src`'s own chunk, which no message reads."""
    p, r = ring.size, ring.rank
    mine = src[bounds[r] : bounds[r + 1]]
    if p == 1:
        backend.copy(result, mine)
        backend.finish(op, result, p)
        return
    size = mine.size
    # shift 1's partial arrives in the result itself, where the first combine writes: one buffer
    # fewer to write and read back (not when the result is the input's own chunk)
    partials = [] if backend.may_share_memory(result, src) else [result]  # shift k's, from rank r-k, at k-1
    others = p - 1 - len(partials)
    with ring.scratch(backend, others * size, src.dtype) as scratch:
        partials += [scratch[i * size : (i + 1) * size] for i in range(others)]
        for shifts in shift_windows(p, WINDOW):
            yield ring.post(
                backend, tag,
                sends=[(src[bounds[(r + k) % p] : bounds[(r + k) % p + 1]], (r + k) % p) for k in shifts],
                receives=[(partials[k - 1], (r - k) % p) for k in shifts],
            )
        backend.combine(op, mine, partials[0], result)
        for partial in partials[1:]:
            backend.combine(op, result, partial, result)
    backend.finish(op, result, p)
