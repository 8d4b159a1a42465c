"""Rabenseifner all-reduce: a recursive-halving reduce-scatter, then a recursive-doubling
all-gather of the reduced segments. Bandwidth-optimal like the ring, in 2 lg p steps instead
of 2(p-1): the choice for medium messages.

Cost: 2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma      (p a power of two; n bytes per rank)
      + 2 (alpha + n beta) + n gamma for folded ranks otherwise (see power_of_two.py)

    4 ranks, segments 0 1 2 3

    halving:   r0,r1 ◄─► r2,r3 (halves)   then r0 ◄─► r1, r2 ◄─► r3   rank k holds segment k reduced
    doubling:  r0 ◄─► r1, r2 ◄─► r3 (segments)   then r0,r1 ◄─► r2,r3   everyone holds 0 1 2 3
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allreduce_recursive_doubling import fold_in, fold_out
from mpiring.algorithms.power_of_two import Fold
from mpiring.algorithms.reduce_scatter_recursive_halving import halving_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def allreduce_rabenseifner(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    fold = Fold(ring.rank, ring.size)
    vbounds = split_bounds(out.size, fold.p2)
    with ring.scratch(backend, out.size, out.dtype) as scratch:
        # the partial sums are `src` until the first combine writes them into `out` (no copy first)
        yield from fold_in(ring, backend, tag, fold, src, scratch, op, out)
        if not fold.sits_out:
            work = out if fold.partner is not None else src
            if (yield from halving_steps(ring, backend, tag, fold, work, scratch, vbounds, op, out)) is not out:
                backend.copy(out, src)  # one rank: nothing was combined
    if not fold.sits_out:
        me = fold.virtual
        backend.finish(op, out[vbounds[me] : vbounds[me + 1]], ring.size)
        lo, hi = me, me + 1  # the window of reduced segments held, doubling each round
        mask = 1
        while mask < fold.p2:
            partner = me ^ mask
            p_lo = lo + mask if me < partner else lo - mask
            mine, theirs = out[vbounds[lo] : vbounds[hi]], out[vbounds[p_lo] : vbounds[p_lo + (hi - lo)]]
            yield ring.post(backend, tag, sends=[(mine, fold.real(partner))], receives=[(theirs, fold.real(partner))])
            lo, hi = min(lo, p_lo), max(hi, p_lo + (hi - lo))
            mask <<= 1
    yield from fold_out(ring, backend, tag, fold, out)
