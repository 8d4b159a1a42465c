"""Recursive-halving reduce-scatter: in round k each rank keeps half of its current window,
sends the other half to the rank p/2^(k+1) away and combines the half it receives.

Cost: lg p alpha + (p-1)/p n beta + (p-1)/p n gamma      (p a power of two; n bytes per rank)
      + (alpha + n beta + n gamma) + (alpha + n/p beta) for folded ranks otherwise
Each rank sends n/2 + n/4 + ... = (p-1)/p n bytes, in lg p messages instead of the ring's p-1.

After folding (power_of_two.py) virtual rank v stands for one or two ranks; its window is the
chunks of those ranks. Odd ranks of a folded pair pass their partner its chunk at the end.

    4 ranks, chunks 0 1 2 3 of every rank's vector

    round 0:  r0 ◄─ 23 / 01 ─► r2    r1 ◄─ 23 / 01 ─► r3      r0,r1 keep 01;  r2,r3 keep 23
    round 1:  r0 ◄─ 1 / 0 ─► r1      r2 ◄─ 3 / 2 ─► r3        rank k keeps chunk k
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allreduce_recursive_doubling import fold_in
from mpiring.algorithms.power_of_two import Fold
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def halving_steps(
    ring: Ring, backend: NumpyBackend, tag: int, fold: Fold, work: Any, scratch: Any, vbounds: list[int], op: str,
    dest: Any = None, last: Any = None,
) -> Steps:
    """Reduce `work` so that virtual rank v holds segment v ([vbounds[v], vbounds[v+1])) reduced.

    Combines write into `dest` (default: `work` itself), so the input need not be copied first;
    the last one writes into `last` instead when given (the segment's own place, saving a copy).
    Returns the array that holds the result (`work` when there was nothing to combine).
    """
    dest = work if dest is None else dest
    me = fold.virtual
    lo, hi = 0, fold.p2  # the window of segments still held, [lo, hi)
    mask = fold.p2 >> 1
    while mask:
        partner = me ^ mask
        middle = lo + mask
        keep, give = ((lo, middle), (middle, hi)) if me < partner else ((middle, hi), (lo, middle))
        k0, k1 = vbounds[keep[0]], vbounds[keep[1]]
        g0, g1 = vbounds[give[0]], vbounds[give[1]]
        incoming = scratch[: k1 - k0]
        yield ring.post(
            backend, tag, sends=[(work[g0:g1], fold.real(partner))], receives=[(incoming, fold.real(partner))]
        )
        into = last if mask == 1 and last is not None else dest[k0:k1]
        if me < partner:
            backend.combine(op, work[k0:k1], incoming, into)
        else:
            backend.combine(op, incoming, work[k0:k1], into)
        work = dest
        lo, hi = keep
        mask >>= 1
    return work


def virtual_bounds(fold: Fold, bounds: list[int]) -> list[int]:
    """Segment bounds of the virtual ranks: each covers the chunks of the ranks it stands for."""
    return [bounds[fold.first_real(v)] for v in range(fold.p2)] + [bounds[-1]]


def reduce_scatter_recursive_halving(
    ring: Ring, backend: NumpyBackend, tag: int, src: Any, bounds: list[int], op: str, result: Any
) -> Steps:
    """Reduce flat `src` (chunk c spans bounds[c]:bounds[c+1]) into `result`, this rank's chunk."""
    r = ring.rank
    fold = Fold(r, ring.size)
    with ring.scratch(backend, 2 * src.size, src.dtype) as both:
        dest, scratch = both[: src.size], both[src.size :]
        # the partial sums are `src` until the first combine writes them into `dest` (no copy first)
        yield from fold_in(ring, backend, tag, fold, src, scratch, op, dest)
        if fold.sits_out:
            yield ring.post(backend, tag, receives=[(result, fold.partner)])
        else:
            folded = fold.partner is not None  # this rank's segment then holds its partner's chunk too
            direct = not folded and fold.p2 > 1  # the last combine writes this rank's chunk into result
            work = yield from halving_steps(ring, backend, tag, fold, dest if folded else src, scratch,
                                            virtual_bounds(fold, bounds), op, dest, result if direct else None)
            if folded:  # hand the even partner its chunk
                p_lo, p_hi = bounds[fold.partner], bounds[fold.partner + 1]
                yield ring.post(backend, tag, sends=[(work[p_lo:p_hi], fold.partner)])
            if not direct:
                backend.copy(result, work[bounds[r] : bounds[r + 1]])
    backend.finish(op, result, ring.size)
