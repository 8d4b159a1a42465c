"""Pipelined ring all-reduce: the pipelined ring reduce-scatter, then the plain ring all-gather.

Cost, m segments per chunk (n bytes per rank, p ranks; see reduce_scatter_ring_pipelined):
  transfer by the CPU (shared memory):  (p-1)(m+1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
  transfer by a NIC or DMA engine:      the reduce-scatter's beta and gamma overlap segment by segment
The bytes are the plain ring's, 2(p-1)/p n per rank, and so is the result, bit for bit. The
all-gather is not cut into segments: it has no reduction to overlap with, and each of its steps
already keeps every link busy.

    reduce-scatter, segment by segment          all-gather, chunk by chunk
    r0: a b c ─► reduce ─► right                r0: 0 1 2
    r1: a b c ─► reduce ─► right      ───►      r1: 0 1 2
    r2: a b c ─► reduce ─► right                r2: 0 1 2
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.reduce_scatter_ring_pipelined import pipelined_reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allreduce_ring_pipelined(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    bounds = split_bounds(src.size, ring.size)
    mine = out[bounds[ring.rank] : bounds[ring.rank + 1]]
    yield from pipelined_reduce_scatter_steps(ring, backend, tag, src, bounds, op, mine)
    yield from allgather_steps(ring, backend, tag, out, bounds)
