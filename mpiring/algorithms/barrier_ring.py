"""Ring barrier: an empty token goes around the ring twice.

Cost: (2p-1) alpha      (no data; p ranks)
Lap one collects: when rank 0 gets the token back, every rank has entered. Lap two releases:
a rank leaves once the token has passed it, so no rank leaves before all have entered.

    4 ranks

    lap 1:  r0 ──► r1 ──► r2 ──► r3 ──► r0     (everyone has arrived)
    lap 2:  r0 ──► r1 ──► r2 ──► r3            (everyone may leave)
"""

from __future__ import annotations

from mpiring.backend import NUMPY
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def barrier_ring(ring: Ring, tag: int) -> Steps:
    p = ring.size
    if p == 1:
        return
    token = NUMPY.empty(0, NUMPY.xp.uint8)
    post = ring.post
    if ring.rank == 0:
        yield post(NUMPY, tag, sends=[(token, ring.right)], receives=[(token, ring.left)])
        yield post(NUMPY, tag, sends=[(token, ring.right)])
        return
    yield post(NUMPY, tag, receives=[(token, ring.left)])
    yield post(NUMPY, tag, sends=[(token, ring.right)], receives=[(token, ring.left)])
    if ring.rank != p - 1:
        yield post(NUMPY, tag, sends=[(token, ring.right)])
