"""Scattered all-reduce: a scattered reduce-scatter, then a scattered all-gather of the reduced
chunks - the ring all-reduce's messages, each half with every message in flight at once.

Cost: 2 ceil((p-1)/W) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
(n bytes per rank, p ranks, W = WINDOW) - the ring's bytes and reductions in two rounds of
messages instead of 2(p-1). No message carries a partial reduced a moment before except the
all-gather's, which sends each rank's reduced chunk once to every other rank; the ring forwards
every chunk it has just reduced or received, p-1 times in a row.

The n elements are cut into p chunks as numpy.array_split cuts them; each chunk is reduced
once, by its owner, in a fixed order (mpiring.algorithms.reduce_scatter_scattered), and then
only copied: the result is bitwise identical on every rank.

    3 ranks, chunks 0 1 2; "1@2" = chunk 1 of rank 2's input, "1*" = chunk 1 reduced

    reduce-scatter (one step)              all-gather (one step)
    r0 ─1@0─► r1   r0 ─2@0─► r2            r0 ─0*─► r1   r0 ─0*─► r2
    r1 ─0@1─► r0   r1 ─2@1─► r2            r1 ─1*─► r0   r1 ─1*─► r2
    r2 ─0@2─► r0   r2 ─1@2─► r1            r2 ─2*─► r0   r2 ─2*─► r1
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_scattered import allgather_scattered
from mpiring.algorithms.reduce_scatter_scattered import reduce_scatter_scattered
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allreduce_scattered(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    bounds = split_bounds(src.size, ring.size)
    mine = out[bounds[ring.rank] : bounds[ring.rank + 1]]
    yield from reduce_scatter_scattered(ring, backend, tag, src, bounds, op, mine)
    yield from allgather_scattered(ring, backend, tag, out, bounds)
