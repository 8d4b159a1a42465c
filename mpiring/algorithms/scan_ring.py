"""Pipelined chain scan (prefix reduction): rank 0 sends its data to rank 1, which combines it
with its own and passes the running prefix on to rank 2, and so on along the ring's open chain
0 -> 1 -> ... -> p-1, segment by segment, so every link carries data at once.

Cost: (p+m-2) (alpha + n/m beta + n/m gamma)      (n bytes per rank, p ranks, m segments)
      -> n (beta + gamma) + (p+m-2) alpha once m >> p
Every rank but the last sends n bytes and every rank but the first receives n bytes: the least
any scan can move, so it suits large messages. Latency grows with p (recursive doubling's lg p
rounds are better for small ones). Segments of 512 KiB, or one (m = 1): with 2 ranks, and where
the chain's ranks share one node's cores, so that only one hop runs at a time and
(p-1)(alpha + n beta + n gamma) beats the pipeline's p+m-2 turns.

Rank r computes ((x0 op x1) op x2) ... op xr, left to right: the order of a rank-ordered
cumulative reduction (numpy.ufunc.accumulate), bitwise, floats included.

    4 ranks, segments A B; "01" = the prefix over ranks 0..1

    step 0:  r0 ─A:0─► r1
    step 1:  r0 ─B:0─► r1 ─A:01─► r2
    step 2:            r1 ─B:01─► r2 ─A:012─► r3
    step 3:                       r2 ─B:012─► r3

Inclusive: each rank receives the prefix straight into its result and combines its own data
in place. Exclusive: the received prefix is the result; the prefix passed on goes through one
scratch buffer. In place (the result is the input, MPI_IN_PLACE) the prefix arrives in scratch
instead, since the input is still to be read; the last rank of an exclusive scan, which passes
nothing on, still receives straight into its result.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.reduce_scatter_ring_pipelined import segments
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps

# As the ring broadcast's: big enough that a segment's message cost stays small next to its
# transfer. With 2 ranks there is nothing to overlap, and where the chain's ranks take turns on
# one node's cores (Ring.takes_turns) its hops cannot run at once: the data goes as one message.
SEGMENT_BYTES = 512 * 1024


def chain_segments(length: int, itemsize: int, world_size: int, takes_turns: bool = False) -> list[tuple[int, int]]:
    """The [lo, hi) segments the chain sends: at least one, so an empty array still sends its
    (empty) message and ranks whose lengths differ get a size error, not a stray message."""
    size = length if world_size <= 2 or takes_turns else max(1, SEGMENT_BYTES // itemsize)
    return segments(length, max(size, 1)) or [(0, 0)]


def scan_ring(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str, exclusive: bool) -> Steps:
    """Prefix-reduce flat `src` into flat `out` (apart from `src`, or `src` itself): over ranks
    0..r, or with `exclusive` over 0..r-1 (rank 0's `out` is then left alone)."""
    p, r = ring.size, ring.rank
    parts = chain_segments(src.size, src.itemsize, p, ring.takes_turns())
    in_place = out is not None and backend.may_share_memory(src, out)
    if r == 0:
        if not exclusive and not in_place:
            backend.copy(out, src)
        if p > 1:
            yield from [ring.post(backend, tag, sends=[(src[lo:hi], 1)]) for lo, hi in parts]
        return  # (avg over one rank: nothing to divide)
    last = r == p - 1
    aside = in_place and not (exclusive and last)  # the prefix arrives in scratch: src is still to be read
    with ring.scratch(backend, src.size if exclusive and not last else 0, src.dtype) as ahead, \
            ring.scratch(backend, src.size if aside else 0, src.dtype) as arrived:
        forward = ahead if exclusive else out  # what rank r+1 gets: the prefix over 0..r
        into = arrived if aside else out
        arrivals = [ring.post(backend, tag, receives=[(into[lo:hi], r - 1)]) for lo, hi in parts]
        sends = []
        for (lo, hi), arrival in zip(parts, arrivals, strict=True):
            yield arrival
            if not (exclusive and last):
                backend.combine(op, into[lo:hi], src[lo:hi], forward[lo:hi])
            if exclusive and aside:  # the result, once src was read for the prefix passed on
                backend.copy(out[lo:hi], into[lo:hi])
            if not last:
                sends.append(ring.post(backend, tag, sends=[(forward[lo:hi], r + 1)]))
        yield from sends
    backend.finish(op, out, r if exclusive else r + 1)
