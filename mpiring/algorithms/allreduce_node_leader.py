"""Single-leader all-reduce across nodes: a reduce to each node's leader, an all-reduce among
the leaders, a broadcast inside each node (MPICH's "smp" all-reduce). For small messages, where
each step costs its latency: only the leaders cross the network, once per round.

Cost, N nodes of k ranks, n bytes per rank:
    2 ceil(lg k) (alpha_intra + n beta_intra)          (binomial reduce and broadcast in the node)
  + the leaders' all-reduce of n bytes over N ranks     (recursive doubling: lg N (alpha_inter + n beta_inter))

    2 nodes x 2 ranks

    reduce in the node     r1 ─► r0        r3 ─► r2
    leaders all-reduce     r0 ◄──────────► r2
    broadcast in the node  r0 ─► r1        r2 ─► r3

Every rank gets the leaders' result as it is: the same bits everywhere.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allreduce_node_lanes import allreduce_across
from mpiring.algorithms.broadcast_binomial import broadcast_binomial
from mpiring.algorithms.reduce_binomial import reduce_binomial
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.ops import AVG, SUM


def allreduce_node_leader(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    nodes = ring.nodes
    node = SubRing(ring, nodes.node(ring.rank))
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    yield from reduce_binomial(node, backend, tag, 0, src, out, summing)
    if node.rank == 0:
        yield from allreduce_across(SubRing(ring, nodes.leaders), backend, tag, out, summing)
    yield from broadcast_binomial(node, backend, tag, 0, out)
    backend.finish(op, out, ring.size)
