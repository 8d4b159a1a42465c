"""Pipelined ring reduce-scatter: the ring reduce-scatter with every chunk cut into segments, so
a segment moves on to the right as soon as it is reduced, not when its whole step is done.

Cost, m segments of s = n/(p m) bytes per chunk (n bytes per rank, p ranks):
  transfer by the CPU (shared memory):  (p-1) m alpha + (p-1)/p n (beta + gamma)
  transfer by a NIC or DMA engine:      (p-1) m alpha + (p-1)/p n max(beta, gamma) + s min(beta, gamma)
Each rank sends and receives exactly the bytes of the plain ring, in m times as many messages.
The reduction of segment k overlaps the transfer of segment k+1 only when something other than
this rank's CPU moves the bytes; where the CPU copies them (MPI over shared memory) the extra
alphas are all that changes. Every element is reduced in the plain ring's order, so the result
is bitwise that of `reduce_scatter_ring`.

    one rank, chunks cut into segments a b c; "a1" = segment a of the step-1 chunk

    receive from left   a0  b0  c0  a1  b1  c1
    reduce                  a0  b0  c0  a1  b1  c1
    send right                  a0  b0  c0  (a1 ...)      a segment leaves once it is reduced

Scratch is two chunks (double buffers): the steps that receive (a step with an empty chunk
receives nothing) take the halves in turn, and a segment's slot is reused two such steps later
only after the send that was reading it has completed. One receive is always posted ahead of
the one being reduced.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Step, Steps

# Large enough that a segment's message cost stays small next to its transfer, small enough to
# pipeline chunks of a few MiB. 256 KiB measured slower here (docs/algorithms.md); re-measure
# on the network that uses this algorithm.
SEGMENT_BYTES = 1 << 20


def segments(length: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) of consecutive segments of at most `size` items covering `length` items (none if 0)."""
    return [(lo, min(lo + size, length)) for lo in range(0, length, size)]


def pipelined_reduce_scatter_steps(
    ring: Ring,
    backend: NumpyBackend,
    tag: int,
    src: Any,
    bounds: list[int],
    op: str,
    result: Any,
) -> Steps:
    """Reduce flat `src` (chunk c spans bounds[c]:bounds[c+1]) into `result`, this rank's chunk.

    The same contract as `reduce_scatter_steps`, which it defers to for one rank and for staged
    device buffers (the staged path already pipelines each message through host memory).
    """
    p, r = ring.size, ring.rank
    if p == 1 or backend.staged:
        yield from reduce_scatter_steps(ring, backend, tag, src, bounds, op, result)
        return
    size = max(1, SEGMENT_BYTES // src.itemsize)
    largest = max(bounds[c + 1] - bounds[c] for c in range(p))

    def chunk(step: int) -> int:  # the chunk whose partial arrives from the left in `step`
        return (r - step - 2) % p  # (step -1: the chunk this rank sends first, its own data)

    def segments_of(c: int) -> list[tuple[int, int]]:
        return segments(bounds[c + 1] - bounds[c], size)

    # every message, in the order the left neighbour sends it: (step, segment index, lo, hi)
    schedule = [(step, j, lo, hi) for step in range(p - 1) for j, (lo, hi) in enumerate(segments_of(chunk(step)))]
    # Steps that receive something alternate between the two halves. Alternating by step number
    # instead would put the steps on both sides of an empty chunk in one half, and the receive
    # posted ahead for the later one could overwrite the earlier one's data before it is reduced.
    receiving = sorted({step for step, _, _, _ in schedule})
    half_of = {step: i % 2 for i, step in enumerate(receiving)}
    with ring.scratch(backend, 2 * largest, src.dtype) as scratch:
        halves = (scratch[:largest], scratch[largest:])
        own = bounds[chunk(-1)]
        sends = [
            ring.post(backend, tag, sends=[(src[own + lo : own + hi], ring.right)]) for lo, hi in segments_of(chunk(-1))
        ]
        reading: dict[tuple[int, int], Step] = {}  # scratch slot -> the send still reading it
        arrivals: list[Step] = []
        for k, (step, j, lo, hi) in enumerate(schedule):
            for ahead in range(len(arrivals), min(k + 2, len(schedule))):
                a_step, a_j, a_lo, a_hi = schedule[ahead]
                busy = reading.pop((half_of[a_step], a_j), None)
                if busy is not None:
                    yield busy  # the slot's last segment must have left before new data lands
                slot = halves[half_of[a_step]][a_lo:a_hi]
                arrivals.append(ring.post(backend, tag, receives=[(slot, ring.left)]))
            yield arrivals[k]
            base = bounds[chunk(step)]
            arrived = halves[half_of[step]][lo:hi]
            if step == p - 2:
                backend.combine(op, src[base + lo : base + hi], arrived, result[lo:hi])
            else:
                backend.combine(op, src[base + lo : base + hi], arrived, arrived)
                reading[(half_of[step], j)] = ring.post(backend, tag, sends=[(arrived, ring.right)])
        yield from sends + list(reading.values())
    backend.finish(op, result, p)
