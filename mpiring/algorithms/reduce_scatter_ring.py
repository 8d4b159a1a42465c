"""Ring reduce-scatter: rank r ends with chunk r of the data, reduced over all ranks.

Cost: (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma      (n bytes per rank, p ranks)
Each rank sends and receives p-1 chunks: (p-1)/p n bytes, up to chunk rounding.

Step s = 0..p-2: rank r sends its partial of chunk (r-s-1) right, receives the partial of
chunk (r-s-2) from the left and combines its own data into it. A partial passes each rank
once, so each chunk is reduced exactly once, in a fixed order: bitwise the same on every run.

    3 ranks, chunks 0 1 2;  "1:20" = partial of chunk 1 holding ranks 2 and 0

    step 0:  r0 ──2:0──► r1 ──0:1──► r2 ──1:2──► r0
    step 1:  r0 ──1:20─► r1 ──2:01─► r2 ──0:12─► r0
    end:     r0 has 0:120       r1 has 1:201       r2 has 2:012
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def reduce_scatter_steps(
    ring: Ring,
    backend: NumpyBackend,
    tag: int,
    src: Any,
    bounds: list[int],
    op: str,
    result: Any,
) -> Steps:
    """Reduce flat `src` (chunk c spans bounds[c]:bounds[c+1]) into `result`, this rank's chunk.

    `src` is only read, so `result` may be a view of it (in-place all-reduce). Two scratch
    chunks alternate: one receives while the other, reduced last step, is being sent.
    """
    p, r = ring.size, ring.rank
    if p == 1:
        backend.copy(result, src[bounds[0] : bounds[1]])
        backend.finish(op, result, p)
        return
    largest = max(bounds[c + 1] - bounds[c] for c in range(p))
    # the last partial arrives in the result itself, where its combine writes: one buffer fewer
    # to write and read back (not when the result is the input's own chunk)
    into_result = not backend.may_share_memory(result, src)
    with ring.scratch(backend, 2 * largest, src.dtype) as scratch:
        halves = (scratch[:largest], scratch[largest:])
        first = (r - 1) % p
        outgoing = src[bounds[first] : bounds[first + 1]]
        for s in range(p - 1):
            c = (r - s - 2) % p
            lo, hi = bounds[c], bounds[c + 1]
            incoming = result if s == p - 2 and into_result else halves[s % 2][: hi - lo]
            yield ring.post(backend, tag, sends=[(outgoing, ring.right)], receives=[(incoming, ring.left)])
            target = result if s == p - 2 else incoming
            backend.combine(op, src[lo:hi], incoming, target)
            outgoing = incoming
    backend.finish(op, result, p)
