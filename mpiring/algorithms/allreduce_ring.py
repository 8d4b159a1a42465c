"""Ring all-reduce: a ring reduce-scatter, then a ring all-gather of the reduced chunks.

Cost: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma      (n bytes per rank, p ranks)
Each rank sends and receives 2(p-1)/p n bytes, up to chunk rounding: bandwidth-optimal.

The n elements are cut into p chunks as numpy.array_split cuts them. Each chunk is reduced
once, by the reduce-scatter, in a fixed order, and then only copied, so the result is bitwise
identical on every rank and, for a fixed world size, from run to run.

    3 ranks, data split into chunks 0 1 2

    reduce-scatter (2 steps)        all-gather (2 steps)
    r0: 0:120                       r0: 0 1 2
    r1: 1:201          ───►         r1: 0 1 2
    r2: 2:012                       r2: 0 1 2
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allreduce_ring(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    bounds = split_bounds(src.size, ring.size)
    mine = out[bounds[ring.rank] : bounds[ring.rank + 1]]
    yield from reduce_scatter_steps(ring, backend, tag, src, bounds, op, mine)
    yield from allgather_steps(ring, backend, tag, out, bounds)
