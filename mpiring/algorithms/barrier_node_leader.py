"""Node-aware barrier: each node's ranks signal their leader, the leaders run a dissemination
barrier among themselves, and each leader releases its node. Only the leaders' ceil(lg N)
rounds cross the network.

Cost: 2 alpha_intra + ceil(lg N) alpha_inter      (no data; N nodes)

    2 nodes x 2 ranks

    arrive     r1 ─► r0       r3 ─► r2
    leaders    r0 ◄──────────► r2
    release    r0 ─► r1       r2 ─► r3
"""

from __future__ import annotations

from mpiring.algorithms.barrier_dissemination import barrier_dissemination
from mpiring.backend import NUMPY
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps


def barrier_node_leader(ring: Ring, tag: int) -> Steps:
    nodes, r = ring.nodes, ring.rank
    members = nodes.node(r)
    leader = members[0]
    signal = NUMPY.empty(0, NUMPY.xp.uint8)
    if r != leader:
        yield ring.post(NUMPY, tag, sends=[(signal, leader)])
        yield ring.post(NUMPY, tag, receives=[(signal, leader)])
        return
    heard = [NUMPY.empty(0, NUMPY.xp.uint8) for _ in members[1:]]
    if heard:
        yield ring.post(NUMPY, tag, receives=list(zip(heard, members[1:], strict=True)))
    yield from barrier_dissemination(SubRing(ring, nodes.leaders), tag)
    if heard:
        yield ring.post(NUMPY, tag, sends=[(signal, m) for m in members[1:]])
