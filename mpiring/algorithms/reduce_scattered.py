"""Scattered reduce (a reduce-scatter, then a gather: Rabenseifner's reduce with both halves done
all at once): every rank sends chunk k of its input straight to rank k and reduces the partials
of its own chunk (mpiring.algorithms.reduce_scatter_scattered), then every rank sends its
reduced chunk straight to the root (mpiring.algorithms.gather_linear).

Cost: 2 ceil((p-1)/W) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
(n bytes per rank, p ranks, W = WINDOW) - the ring reduce's bytes and reductions in two rounds
of messages instead of 2(p-1). The root reduces only its own chunk (the binomial tree's root
reduces n bytes per child) and receives (p-1)/p n bytes; no message is forwarded.

    root r0, 3 ranks; "1@2" = chunk 1 of rank 2's input, "1*" = chunk 1 reduced

    reduce-scatter (one step)              gather (one step)
    r0 ─1@0─► r1   r0 ─2@0─► r2            r1 ─1*─► r0
    r1 ─0@1─► r0   r1 ─2@1─► r2            r2 ─2*─► r0
    r2 ─0@2─► r0   r2 ─1@2─► r1
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_linear import gather_linear
from mpiring.algorithms.reduce_scatter_scattered import reduce_scatter_scattered
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def reduce_scattered(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, out: Any, op: str
) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` on `root` (None elsewhere)."""
    bounds = split_bounds(src.size, ring.size)
    r = ring.rank
    if r == root:  # the root reduces its chunk in its place in the result: nothing to copy there
        yield from reduce_scatter_scattered(ring, backend, tag, src, bounds, op, out[bounds[r] : bounds[r + 1]])
        yield from gather_linear(ring, backend, tag, root, None, out, bounds)
        return
    with ring.scratch(backend, bounds[r + 1] - bounds[r], src.dtype) as mine:
        yield from reduce_scatter_scattered(ring, backend, tag, src, bounds, op, mine)
        yield from gather_linear(ring, backend, tag, root, mine, out, bounds)
