"""Ring reduce: a ring reduce-scatter, then a ring gather of the reduced chunks to the root.

Cost: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma      (n bytes per rank, p ranks)
Every rank sends (p-1)/p n bytes in the reduce-scatter, then the ranks forward the reduced
chunks towards the root, which receives (p-1)/p n bytes. The reduction work is spread over all
ranks instead of piling up at the root.

    root r0, 3 ranks

    reduce-scatter (2 steps)         gather to the root (2 steps)
    r0: 0:120                        r1 ─1─► r2 ─2─► r0
    r1: 1:201           ───►                 r2 ─1─► r0
    r2: 2:012                        r0: 0 1 2
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_ring import gather_steps
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def reduce_ring(
    ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, out: Any, op: str
) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` on `root` (None elsewhere)."""
    bounds = split_bounds(src.size, ring.size)
    r = ring.rank
    with ring.scratch(backend, bounds[r + 1] - bounds[r], src.dtype) as mine:
        yield from reduce_scatter_steps(ring, backend, tag, src, bounds, op, mine)
        yield from gather_steps(ring, backend, tag, root, mine, out, bounds)
