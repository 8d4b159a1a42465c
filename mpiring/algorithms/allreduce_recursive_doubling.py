"""Recursive-doubling all-reduce: in round k each rank swaps its whole vector with the rank
2^k away and combines the two. Latency-optimal for small messages.

Cost: lg p (alpha + n beta + n gamma)      (p a power of two; n bytes per rank)
      + 2 (alpha + n beta) + n gamma for the folded ranks otherwise (see power_of_two.py)
Each rank sends n bytes per round: lg p * n in all (more than the ring's 2(p-1)/p n).

Partners combine as (lower rank's data) op (higher rank's data), so both get the same bits
even for operations that are not bitwise commutative (min/max of -0.0 and 0.0).

    4 ranks, a b c d

    round 0:  r0 ◄──► r1   r2 ◄──► r3      r0,r1: ab   r2,r3: cd
    round 1:  r0 ◄──► r2   r1 ◄──► r3      all:   abcd
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.power_of_two import Fold
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def fold_in(ring: Ring, backend: NumpyBackend, tag: int, fold: Fold, work: Any, scratch: Any, op: str,
            out: Any = None) -> Steps:
    """Before the power-of-two stages: each even rank of a folded pair hands its vector over.
    The receiving rank combines into `out` (default: `work` itself)."""
    if fold.sits_out:
        yield ring.post(backend, tag, sends=[(work, fold.partner)])
    elif fold.partner is not None:
        yield ring.post(backend, tag, receives=[(scratch, fold.partner)])
        backend.combine(op, scratch, work, work if out is None else out)  # the lower rank's data first


def fold_out(ring: Ring, backend: NumpyBackend, tag: int, fold: Fold, work: Any) -> Steps:
    """After the power-of-two stages: each odd rank of a folded pair hands the result back."""
    if fold.sits_out:
        yield ring.post(backend, tag, receives=[(work, fold.partner)])
    elif fold.partner is not None:
        yield ring.post(backend, tag, sends=[(work, fold.partner)])


def allreduce_recursive_doubling(
    ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str
) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    fold = Fold(ring.rank, ring.size)
    # `work` is this rank's partial result: `src` until the first combine writes into `out`, so
    # the input is never copied first (a small call's cost is counted in copies)
    work = src
    with ring.scratch(backend, out.size, out.dtype) as scratch:
        yield from fold_in(ring, backend, tag, fold, work, scratch, op, out)
        if not fold.sits_out:
            if fold.partner is not None:
                work = out
            me = fold.virtual
            mask = 1
            while mask < fold.p2:
                partner = me ^ mask
                peer = fold.real(partner)
                yield ring.post(backend, tag, sends=[(work, peer)], receives=[(scratch, peer)])
                if me < partner:
                    backend.combine(op, work, scratch, out)
                else:
                    backend.combine(op, scratch, work, out)
                work = out
                mask <<= 1
            if work is not out:  # one rank: nothing was combined
                backend.copy(out, work)
            backend.finish(op, out, ring.size)
    yield from fold_out(ring, backend, tag, fold, out)
