"""Dissemination barrier: in round k every rank signals the rank 2^k to its right and waits
for the rank 2^k to its left. After ceil(lg p) rounds every rank has heard, directly or
through others, from every rank.

Cost: ceil(lg p) alpha      (no data; p ranks)

    5 ranks
    round 0:  r -> r+1      round 1:  r -> r+2      round 2:  r -> r+4      (mod 5)
"""

from __future__ import annotations

from mpiring.backend import NUMPY
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def barrier_dissemination(ring: Ring, tag: int) -> Steps:
    p, r = ring.size, ring.rank
    signal, heard = NUMPY.empty(0, NUMPY.xp.uint8), NUMPY.empty(0, NUMPY.xp.uint8)
    distance = 1
    while distance < p:
        yield ring.post(NUMPY, tag, sends=[(signal, (r + distance) % p)], receives=[(heard, (r - distance) % p)])
        distance *= 2
