"""Multi-lane all-reduce across nodes: a reduce-scatter inside each node, an all-reduce of each
share across nodes by the ranks of one local index (a lane), an all-gather inside each node.
Every local rank drives its own share over the network at once (Horovod's hierarchical
all-reduce, Traeff's k-lane collectives, MVAPICH2's multi-leader all-reduce).

Cost, N nodes of k ranks, n bytes per rank, intra- and inter-node link classes:
    2(k-1) alpha_intra + 2(k-1)/k n beta_intra                 (reduce-scatter, all-gather in the node)
  + the lane all-reduce of n/k bytes over N ranks               (e.g. ring: 2(N-1) alpha_inter
                                                                  + 2(N-1)/N n/k beta_inter)
Each node sends 2(N-1)/N n bytes across its link in all, the least an all-reduce can: k lanes
of 2(N-1)/N n/k each. A flat ring over N k ranks sends the same bytes but crosses the slow link
in 2(Nk-1) steps, each paying alpha_inter.

    2 nodes x 2 ranks, data split into shares A B

    node 0: r0 r1   reduce-scatter   r0: A(node 0)  r1: B(node 0)
    node 1: r2 r3   in each node     r2: A(node 1)  r3: B(node 1)
    lane 0: r0 ◄──► r2 all-reduce A  lane 1: r1 ◄──► r3 all-reduce B
    all-gather in each node: every rank has A B

Nodes of different sizes: k is the smallest node's ranks; on a larger node the ranks past k own
empty shares. Each share is reduced once, by its lane, so every rank gets the same bits.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.allreduce_rabenseifner import allreduce_rabenseifner
from mpiring.algorithms.allreduce_recursive_doubling import allreduce_recursive_doubling
from mpiring.algorithms.allreduce_ring import allreduce_ring
from mpiring.algorithms.allreduce_ring_pipelined import allreduce_ring_pipelined
from mpiring.algorithms.allreduce_scattered import allreduce_scattered
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.ops import AVG, SUM
from mpiring.selection import across_choice

# the flat all-reduces a lane or the leaders may run across nodes, as `auto` names them
ACROSS_NODES = {
    "recursive_doubling": allreduce_recursive_doubling,
    "scattered": allreduce_scattered,
    "rabenseifner": allreduce_rabenseifner,
    "ring": allreduce_ring,
    "ring_pipelined": allreduce_ring_pipelined,
}


def allreduce_across(ring: SubRing, backend: NumpyBackend, tag: int, buf: Any, op: str) -> Steps:
    """All-reduce flat `buf` in place over a sub-ring across nodes, by `auto`'s choice across nodes."""
    yield from ACROSS_NODES[across_choice("allreduce", buf.nbytes, ring.size)](ring, backend, tag, buf, buf, op)


def allreduce_node_lanes(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    nodes = ring.nodes
    node = SubRing(ring, nodes.node(ring.rank))
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    lanes = nodes.lanes
    bounds = split_bounds(src.size, lanes) + [src.size] * (node.size - lanes)
    mine = out[bounds[node.rank] : bounds[node.rank + 1]]
    yield from reduce_scatter_steps(node, backend, tag, src, bounds, summing, mine)
    if node.rank < lanes:
        yield from allreduce_across(SubRing(ring, nodes.lane(node.rank)), backend, tag, mine, summing)
    yield from allgather_steps(node, backend, tag, out, bounds)
    backend.finish(op, out, ring.size)
